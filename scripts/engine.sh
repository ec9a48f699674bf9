#!/usr/bin/env bash
# Manage the real inference engine used by the engine tests: `transformers serve`
# with continuous batching on the CPU, serving the tiny model built by
# scripts/build_tiny_model.py (fixture: tests/engine/model).
#
#   scripts/engine.sh install        create .venv-engine (pinned CPU torch + transformers[serving])
#   scripts/engine.sh build-model    build tests/engine/model if it is missing
#   scripts/engine.sh start [PORT]   start the engine (free port if none), wait for /health, warm up
#   scripts/engine.sh stop           stop the engine this script started (its process group only)
#   scripts/engine.sh status         say whether it runs, on which port, with which pid
#
# Files: runs/engine.log, runs/engine.pid (process-group leader), runs/engine.port.
# Environment overrides: ENGINE_VENV, ENGINE_MODEL_DIR, ENGINE_PYTHON (the python that makes
# the venv), ENGINE_HEALTH_TIMEOUT (seconds, default 120), ENGINE_CB_BLOCKS (default 64).
# The served model name is the model directory path exactly as passed to `transformers serve`;
# this script always passes the relative path "tests/engine/model" (see docs/engine-protocol.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

VENV="${ENGINE_VENV:-.venv-engine}"
MODEL_DIR="${ENGINE_MODEL_DIR:-tests/engine/model}"
BASE_PYTHON="${ENGINE_PYTHON:-$(command -v python3.11 || command -v python3)}"
HEALTH_TIMEOUT="${ENGINE_HEALTH_TIMEOUT:-120}"
CB_BLOCKS="${ENGINE_CB_BLOCKS:-64}"
TORCH_PIN="torch==2.13.0"   # the CPU wheel; unpinned pip pulls a multi-GB CUDA build
TRANSFORMERS_PIN="transformers[serving]==5.24.0"   # the version docs/engine-protocol.md describes
RUNS="runs"
LOG="${RUNS}/engine.log"
PIDFILE="${RUNS}/engine.pid"
PORTFILE="${RUNS}/engine.port"

die() { echo "engine.sh: error: $*" >&2; exit 1; }
say() { echo "engine.sh: $*" >&2; }

venv_ok() {
    [[ -x "${VENV}/bin/python" ]] && [[ -x "${VENV}/bin/transformers" ]] \
        && "${VENV}/bin/python" -c 'import torch, transformers, fastapi, uvicorn' >/dev/null 2>&1
}

cmd_install() {
    if venv_ok; then
        say "${VENV} already has torch + transformers[serving]: nothing to do"
        return 0
    fi
    command -v "${BASE_PYTHON}" >/dev/null 2>&1 || die "no ${BASE_PYTHON} on PATH (set ENGINE_PYTHON)"
    if [[ ! -x "${VENV}/bin/python" ]]; then
        say "creating ${VENV} with ${BASE_PYTHON}"
        "${BASE_PYTHON}" -m venv "${VENV}" || die "could not create the venv ${VENV}"
    fi
    say "installing ${TORCH_PIN} and ${TRANSFORMERS_PIN} into ${VENV} (about 2 minutes, 1.2 GB)"
    if ! "${VENV}/bin/python" -m pip install --quiet "${TORCH_PIN}" "${TRANSFORMERS_PIN}"; then
        die "pip could not install ${TORCH_PIN} + ${TRANSFORMERS_PIN} into ${VENV}; see pip's output above. Remove ${VENV} and retry: scripts/engine.sh install"
    fi
    venv_ok || die "${VENV} was installed but 'import torch, transformers, fastapi, uvicorn' or the 'transformers' command fails"
    say "installed: $("${VENV}/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
}

cmd_build_model() {
    if [[ -f "${MODEL_DIR}/model.safetensors" && -f "${MODEL_DIR}/tokenizer.json" && -f "${MODEL_DIR}/config.json" ]]; then
        say "${MODEL_DIR} already built: nothing to do (delete it to rebuild)"
        return 0
    fi
    venv_ok || die "${VENV} is missing or incomplete: run scripts/engine.sh install first"
    "${VENV}/bin/python" scripts/build_tiny_model.py "${MODEL_DIR}"
}

# pid of the recorded engine if it is still alive, else nothing
live_pid() {
    [[ -f "${PIDFILE}" ]] || return 1
    local pid
    pid="$(cat "${PIDFILE}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
    kill -0 "${pid}" 2>/dev/null || return 1
    echo "${pid}"
}

port_is_free() {
    "${VENV}/bin/python" - "$1" <<'EOF2'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
EOF2
}

free_port() {
    "${VENV}/bin/python" - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

log_tail() {
    echo "----- last lines of ${LOG} -----" >&2
    tail -n 40 "${LOG}" >&2 || true
    echo "--------------------------------" >&2
}

kill_group() {
    # SIGTERM the process group we started, then SIGKILL after 10 s.
    local pid="$1" i
    kill -TERM -- "-${pid}" 2>/dev/null || kill -TERM "${pid}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 -- "-${pid}" 2>/dev/null || kill -0 "${pid}" 2>/dev/null || return 0
        sleep 0.1
    done
    say "process group ${pid} still alive after 10 s: SIGKILL"
    kill -KILL -- "-${pid}" 2>/dev/null || kill -KILL "${pid}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 -- "-${pid}" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

cmd_start() {
    local port="${1:-}" pid url start now code
    venv_ok || die "${VENV} is missing or incomplete: run scripts/engine.sh install first"
    [[ -f "${MODEL_DIR}/model.safetensors" ]] || die "no model at ${MODEL_DIR}: run scripts/engine.sh build-model first"
    command -v curl >/dev/null 2>&1 || die "curl is needed"
    if pid="$(live_pid)"; then
        die "an engine is already running (pid ${pid}, port $(cat "${PORTFILE}" 2>/dev/null || echo '?')): scripts/engine.sh stop first"
    fi
    mkdir -p "${RUNS}"
    if [[ -z "${port}" ]]; then
        port="$(free_port)"
    fi
    [[ "${port}" =~ ^[0-9]+$ ]] || die "port must be a number, got '${port}'"
    # Otherwise /health of whatever already listens there would pass for ours.
    port_is_free "${port}" || die "port ${port} is already in use on 127.0.0.1: pick another or omit it"
    url="http://127.0.0.1:${port}"
    : >"${LOG}"
    # setsid: the engine leads its own process group (pgid == pid), so stop can signal just it.
    setsid "${VENV}/bin/transformers" serve "${MODEL_DIR}" \
        --host 127.0.0.1 --port "${port}" --device cpu \
        --continuous-batching --cb-num-blocks "${CB_BLOCKS}" \
        </dev/null >>"${LOG}" 2>&1 &
    pid=$!
    echo "${pid}" >"${PIDFILE}"
    echo "${port}" >"${PORTFILE}"
    say "started pid ${pid} on ${url}, model '${MODEL_DIR}'; waiting up to ${HEALTH_TIMEOUT}s for /health"
    start=${SECONDS}
    while true; do
        if ! kill -0 "${pid}" 2>/dev/null; then
            log_tail
            rm -f "${PIDFILE}" "${PORTFILE}"
            die "the engine exited during startup (see ${LOG})"
        fi
        code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "${url}/health" || true)"
        [[ "${code}" == "200" ]] && break
        now=${SECONDS}
        if ((now - start >= HEALTH_TIMEOUT)); then
            log_tail
            kill_group "${pid}" || true
            rm -f "${PIDFILE}" "${PORTFILE}"
            die "/health did not answer 200 within ${HEALTH_TIMEOUT}s (stopped it; see ${LOG})"
        fi
        sleep 0.5
    done
    say "/health OK after $((SECONDS - start))s; sending the temperature-0 warm-up request"
    # In continuous-batching mode the first request fixes the sampling mode: make it greedy.
    if ! curl -sS --fail-with-body --max-time 60 "${url}/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\": \"${MODEL_DIR}\", \"messages\": [{\"role\": \"user\", \"content\": \"What is 2 plus 3?\"}], \"temperature\": 0, \"max_tokens\": 16, \"stream\": false}" \
        >"${RUNS}/engine.warmup.json" 2>>"${LOG}"; then
        log_tail
        kill_group "${pid}" || true
        rm -f "${PIDFILE}" "${PORTFILE}"
        die "the warm-up request failed (stopped the engine; see ${LOG})"
    fi
    say "ready: base_url ${url}/v1  model '${MODEL_DIR}'  pid ${pid}"
    echo "${url}/v1"
}

cmd_stop() {
    local pid
    if ! pid="$(live_pid)"; then
        say "no engine running (no live pid in ${PIDFILE})"
        rm -f "${PIDFILE}" "${PORTFILE}"
        return 0
    fi
    say "stopping process group ${pid}"
    kill_group "${pid}" || die "process group ${pid} survived SIGKILL"
    rm -f "${PIDFILE}" "${PORTFILE}"
    say "stopped"
}

cmd_status() {
    local pid port code
    if pid="$(live_pid)"; then
        port="$(cat "${PORTFILE}" 2>/dev/null || echo '')"
        code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:${port}/health" || true)"
        echo "running pid=${pid} port=${port} health=${code} base_url=http://127.0.0.1:${port}/v1 model=${MODEL_DIR}"
        return 0
    fi
    echo "stopped"
    return 1
}

usage() {
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
}

main() {
    local sub="${1:-}"
    shift || true
    case "${sub}" in
        install) cmd_install "$@" ;;
        build-model) cmd_build_model "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status "$@" ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
