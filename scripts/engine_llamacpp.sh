#!/usr/bin/env bash
# Manage llama.cpp's `llama-server`, the second real engine of the engine tests. It is built from
# the llama.cpp tree vendored in the pinned llama-cpp-python sdist (PyPI, MIT) and cached outside
# the clone, keyed by version, so later runs (and CI on the same machine) reuse it.
#
#   scripts/engine_llamacpp.sh install       build llama-server into the cache if it is missing
#   scripts/engine_llamacpp.sh build-model   write tests/engine/model.gguf (F32) if it is missing
#   scripts/engine_llamacpp.sh check-model   rebuild the GGUF aside and require it byte-identical
#   scripts/engine_llamacpp.sh bin-dir       print the cache folder holding llama-server
#   scripts/engine_llamacpp.sh start [PORT]  start llama-server on the tiny GGUF, wait for /health
#   scripts/engine_llamacpp.sh stop          stop the server this script started (its group only)
#
# Files: ~/.cache/calibrate/llama.cpp/<version>/bin/llama-server (+ its shared libraries),
# .cache/venv-gguf (the pinned gguf package), runs/llamacpp.log, runs/llamacpp.pid (process-group
# leader), runs/llamacpp.port. The engine suite does not use start/stop: calibrate manages the
# server itself there ([server] kind = "llamacpp"); they are for trying it by hand.
# Environment overrides: LLAMACPP_CACHE (default ~/.cache/calibrate/llama.cpp), LLAMACPP_JOBS
# (default 2), LLAMACPP_GGUF (default tests/engine/model.gguf), ENGINE_HEALTH_TIMEOUT (s, 120).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

LLAMA_CPP_PYTHON_VERSION="0.3.36"   # the sdist that vendors llama.cpp (vendor/llama.cpp)
GGUF_PIN="gguf==0.19.0"
CACHE_ROOT="${LLAMACPP_CACHE:-${HOME}/.cache/calibrate/llama.cpp}"
PREFIX="${CACHE_ROOT}/${LLAMA_CPP_PYTHON_VERSION}"
BIN="${PREFIX}/bin/llama-server"
JOBS="${LLAMACPP_JOBS:-2}"
GGUF="${LLAMACPP_GGUF:-tests/engine/model.gguf}"
GGUF_VENV=".cache/venv-gguf"
MODEL_DIR="tests/engine/model"
HEALTH_TIMEOUT="${ENGINE_HEALTH_TIMEOUT:-120}"
RUNS="runs"
LOG="${RUNS}/llamacpp.log"
PIDFILE="${RUNS}/llamacpp.pid"
PORTFILE="${RUNS}/llamacpp.port"

die() { echo "engine_llamacpp.sh: error: $*" >&2; exit 1; }
say() { echo "engine_llamacpp.sh: $*" >&2; }

bin_ok() {
    [[ -x "${BIN}" ]] && LD_LIBRARY_PATH="${PREFIX}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" \
        "${BIN}" --version >/dev/null 2>&1
}

ensure_toolchain() {
    local missing=()
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v g++ >/dev/null 2>&1 || missing+=(g++)
    command -v make >/dev/null 2>&1 || missing+=(make)
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
    say "installing ${missing[*]} with apt-get"
    local sudo=()
    [[ "$(id -u)" == "0" ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -q >/dev/null || die "apt-get update failed"
    "${sudo[@]}" apt-get install -y -q "${missing[@]}" >/dev/null || die "apt-get could not install ${missing[*]}"
}

fail_with_log() {
    local what="$1" log="$2"
    echo "----- last lines of ${log} -----" >&2
    tail -n 40 "${log}" >&2 || true
    echo "--------------------------------" >&2
    die "${what} failed (full log: ${log})"
}

cmd_install() {
    if bin_ok; then
        say "llama-server ${LLAMA_CPP_PYTHON_VERSION} already built: ${BIN}"
        return 0
    fi
    ensure_toolchain
    local work sdist src start
    start=${SECONDS}
    mkdir -p "${CACHE_ROOT}"
    work="$(mktemp -d "${CACHE_ROOT}/build-${LLAMA_CPP_PYTHON_VERSION}.XXXXXX")"
    say "building llama-server from llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION} in ${work} (-j${JOBS}; 10-25 min on 2 cores)"
    python3 -m pip download --quiet --no-deps --no-binary=:all: --dest "${work}" \
        "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" >"${work}/pip.log" 2>&1 \
        || fail_with_log "pip download of llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" "${work}/pip.log"
    sdist="$(ls "${work}"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n 1)"
    [[ -n "${sdist}" ]] || die "pip downloaded no llama_cpp_python sdist into ${work}"
    tar -xzf "${sdist}" -C "${work}"
    src="$(ls -d "${work}"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -n 1)"
    [[ -n "${src}" && -f "${src}/CMakeLists.txt" ]] || die "the sdist has no vendor/llama.cpp/CMakeLists.txt"
    cmake -S "${src}" -B "${work}/build" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
        -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
        >"${work}/cmake-configure.log" 2>&1 \
        || fail_with_log "cmake configure" "${work}/cmake-configure.log"
    cmake --build "${work}/build" --target llama-server -j "${JOBS}" >"${work}/cmake-build.log" 2>&1 \
        || fail_with_log "cmake --build --target llama-server" "${work}/cmake-build.log"
    local staged="${work}/prefix"
    mkdir -p "${staged}/bin" "${staged}/lib"
    cp "${work}/build/bin/llama-server" "${staged}/bin/"
    find "${work}/build" -name '*.so*' \( -type f -o -type l \) -exec cp -P {} "${staged}/lib/" \;
    echo "llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION}" >"${staged}/VERSION"
    rm -rf "${PREFIX}"
    mv "${staged}" "${PREFIX}"
    bin_ok || die "built ${BIN} but '${BIN} --version' fails"
    say "built ${BIN} in $((SECONDS - start)) s: $("${BIN}" --version 2>&1 | head -n 1)"
    rm -rf "${work}"
}

cmd_bin_dir() { echo "${PREFIX}/bin"; }

gguf_venv() {
    if [[ -x "${GGUF_VENV}/bin/python" ]] && "${GGUF_VENV}/bin/python" -c 'import gguf' >/dev/null 2>&1; then
        return 0
    fi
    say "creating ${GGUF_VENV} with ${GGUF_PIN}"
    python3 -m venv "${GGUF_VENV}" || die "could not create ${GGUF_VENV}"
    "${GGUF_VENV}/bin/python" -m pip install --quiet "${GGUF_PIN}" \
        || die "pip could not install ${GGUF_PIN} into ${GGUF_VENV} (see above); remove it and retry"
}

cmd_build_model() {
    if [[ -f "${GGUF}" ]]; then
        say "${GGUF} already built: nothing to do (delete it to rebuild)"
        return 0
    fi
    [[ -f "${MODEL_DIR}/model.safetensors" ]] || die "no ${MODEL_DIR}: scripts/engine.sh build-model first"
    gguf_venv
    "${GGUF_VENV}/bin/python" scripts/build_tiny_gguf.py "${MODEL_DIR}" "${GGUF}"
}

cmd_check_model() {
    [[ -f "${GGUF}" ]] || die "no ${GGUF}: scripts/engine_llamacpp.sh build-model first"
    gguf_venv
    local aside
    aside="$(mktemp --suffix=.gguf)"
    "${GGUF_VENV}/bin/python" scripts/build_tiny_gguf.py "${MODEL_DIR}" "${aside}" >/dev/null
    if ! cmp -s "${aside}" "${GGUF}"; then
        rm -f "${aside}"
        die "a rebuild of ${GGUF} differs from the file: the GGUF build is not reproducible"
    fi
    rm -f "${aside}"
    say "${GGUF}: a rebuild is byte-identical"
}

live_pid() {
    [[ -f "${PIDFILE}" ]] || return 1
    local pid
    pid="$(cat "${PIDFILE}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null || return 1
    echo "${pid}"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

kill_group() {
    # SIGTERM the process group this script started, SIGKILL after 10 s.
    local pid="$1" i
    kill -TERM -- "-${pid}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 -- "-${pid}" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-${pid}" 2>/dev/null || true
}

cmd_start() {
    local port="${1:-}" pid url start code
    bin_ok || die "no working ${BIN}: scripts/engine_llamacpp.sh install first"
    [[ -f "${GGUF}" ]] || die "no ${GGUF}: scripts/engine_llamacpp.sh build-model first"
    if pid="$(live_pid)"; then
        die "llama-server already runs (pid ${pid}): scripts/engine_llamacpp.sh stop first"
    fi
    mkdir -p "${RUNS}"
    port="${port:-$(free_port)}"
    [[ "${port}" =~ ^[0-9]+$ ]] || die "port must be a number, got '${port}'"
    url="http://127.0.0.1:${port}"
    : >"${LOG}"
    setsid "${BIN}" -m "${GGUF}" --host 127.0.0.1 --port "${port}" --parallel 4 --metrics \
        </dev/null >>"${LOG}" 2>&1 &
    pid=$!
    echo "${pid}" >"${PIDFILE}"
    echo "${port}" >"${PORTFILE}"
    start=${SECONDS}
    while true; do
        kill -0 "${pid}" 2>/dev/null || fail_with_log "llama-server start (it exited)" "${LOG}"
        code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "${url}/health" || true)"
        [[ "${code}" == "200" ]] && break
        if ((SECONDS - start >= HEALTH_TIMEOUT)); then
            kill_group "${pid}"
            rm -f "${PIDFILE}" "${PORTFILE}"
            fail_with_log "waiting ${HEALTH_TIMEOUT}s for /health" "${LOG}"
        fi
        sleep 0.3
    done
    say "ready: base_url ${url}/v1  pid ${pid}  (any model name is accepted)"
    echo "${url}/v1"
}

cmd_stop() {
    local pid
    if pid="$(live_pid)"; then
        kill_group "${pid}"
        say "stopped process group ${pid}"
    else
        say "no llama-server started by this script is running"
    fi
    rm -f "${PIDFILE}" "${PORTFILE}"
}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

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
