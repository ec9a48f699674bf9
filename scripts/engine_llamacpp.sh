#!/usr/bin/env bash
# Manage llama.cpp's `llama-server`, the second real engine of the engine tests. It is built from
# the llama.cpp tree vendored in the pinned llama-cpp-python sdist (PyPI, MIT) and cached outside
# the clone, keyed by version, so later runs (and CI on the same machine) reuse it.
#
#   scripts/engine_llamacpp.sh install       build llama-server into the cache if it is missing
#   scripts/engine_llamacpp.sh build-model   write tests/engine/model.gguf (F32) if it is missing
#   scripts/engine_llamacpp.sh bin-dir       print the cache folder holding llama-server
#   scripts/engine_llamacpp.sh start [PORT]  start llama-server on the tiny GGUF, wait for /health
#   scripts/engine_llamacpp.sh stop          stop the server this script started (its group only)
#
# Files: ~/.cache/calibrate/llama.cpp/<version>/bin/llama-server (+ its shared libraries),
# runs/llamacpp.log, runs/llamacpp.pid (process-group leader), runs/llamacpp.port.
# Environment overrides: LLAMACPP_CACHE (default ~/.cache/calibrate/llama.cpp), LLAMACPP_JOBS
# (default 2), LLAMACPP_GGUF (default tests/engine/model.gguf), ENGINE_VENV (default .venv-engine).
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
VENV="${ENGINE_VENV:-.venv-engine}"
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

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

main() {
    local sub="${1:-}"
    shift || true
    case "${sub}" in
        install) cmd_install "$@" ;;
        bin-dir) cmd_bin_dir "$@" ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
