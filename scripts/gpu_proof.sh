#!/usr/bin/env bash
# make gpu-proof [DRY=1]: prove calibrate's GPU path on a real card, in one offline run (< 8 min).
#
#   1 gpu-check   NVML devices, memory v1/v2, process list, a sampled 1 s allocation spike
#   2 model       a seeded random-weight Llama (~1e9 parameters, bf16) with the project's tokenizer
#   3 serve       `transformers serve --continuous-batching` under scripts/gpu_proof_launcher.py,
#                 which caps the process's CUDA memory so a known wave runs out of memory for real;
#                 calibrate starts it ([server] kind = "custom") and owns its PID
#   4 single, repro, ladder (--vram-source nvml, long inputs): peak VRAM rises with batch, the
#                 ladder stops on the real OOM (or the VRAM rule) at batch 8 or 16, and an incident
#                 bundle holds the CUDA error text and a VRAM snapshot; every tier carries NVML's
#                 energy (total-energy counter joules, mean W, J per output token)
#   4d sweep      concurrency 1, 2, 4 at the verified batch, one short run each: the same energy
#                 figures per level (run only while the budget leaves the rollback its time)
#   5 rollback    old PID gone, its VRAM released (NVML), restart at the verified batch, baseline
#                 matches; then verify
#   6 report      summary.md (energy per tier and level in its tables), energy.json, runs.tar.gz,
#                 proof.log, cap.json (the ladder's server), cap-rollback.json (the restarted one)
#                 into $OUT, else gpu-proof/
#
# On the GPU box: python3 (3.12) has torch + transformers; the missing wheels come from .whl/
# (scripts/gpu_proof_prepare.sh, run where there is network) and are installed with --no-index.
# DRY=1: the same script on the CPU with .venv (calibrate) and .venv-engine (torch, transformers),
# the tiny proof model and short inputs; the steps that need NVML or CUDA say "skipped: …".
# Every step has its own timeout inside an overall budget; every process started is stopped
# (calibrate server stop, then its process group by PID) on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

DRY="${DRY:-0}"
[[ "${DRY}" == "1" ]] || DRY=0
DEST="${OUT:-${ROOT}/gpu-proof}"
BUDGET_S="${PROOF_BUDGET_S:-470}"   # the whole run, under 8 minutes
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-proof.XXXXXX")"
STEPS="${WORK}/steps.tsv"
LOG="${WORK}/proof.log"
START_S=${SECONDS}

if [[ "${DRY}" == "1" ]]; then
    MODE="dry run (CPU)"
    CAL_PY="${ROOT}/.venv/bin/python"
    ENGINE_PY="${ROOT}/.venv-engine/bin/python"
    SIZE="tiny"
    INPUT_TOKENS="${PROOF_INPUT_TOKENS:-200}"
    BATCHES="1, 2, 4"
    TOP=4
    VRAM_SOURCE="auto"
else
    MODE="GPU"
    CAL_PY="$(command -v python3)"
    ENGINE_PY="${CAL_PY}"
    SIZE="1b"
    INPUT_TOKENS="${PROOF_INPUT_TOKENS:-4096}"
    BATCHES="1, 2, 4, 8, 16"
    TOP=16
    VRAM_SOURCE="nvml"
fi
OUTPUT_TOKENS=32
SWEEP_LEVELS="1,2,4"
SWEEP_MIN_LEFT_S="${PROOF_SWEEP_MIN_LEFT_S:-240}"  # the sweep runs only with this much budget left
MODEL_DIR="${WORK}/model"
CAP_FILE="${WORK}/cap.json"

: >"${STEPS}"
exec > >(tee -a "${LOG}") 2>&1

say() { echo "gpu-proof: $*"; }
left() { echo $((BUDGET_S - (SECONDS - START_S))); }
# A step's timeout: its own, but never past the overall budget (at least 5 s).
limit() { local own="$1" rest; rest="$(left)"; ((rest < own)) && own="${rest}"; ((own < 5)) && own=5; echo "${own}"; }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"${STEPS}"; say "step $1 $2: $3${4:+ ($4)} [$5 s]"; }

cal() { PYTHONPATH="${PYPATH}" "${CAL_PY}" -m calibrate "$@"; }

# run_step N NAME TIMEOUT CMD...: the command's exit decides pass/fail; its output is in proof.log.
run_step() {
    local n="$1" name="$2" own="$3" t0=${SECONDS} rc=0 secs
    shift 3
    say "--- step ${n} ${name}: $*"
    timeout --kill-after=10 "$(limit "${own}")" "$@" || rc=$?
    secs=$((SECONDS - t0))
    if ((rc == 0)); then
        record "${n}" "${name}" pass "" "${secs}"
    elif ((rc == 124 || rc == 137)); then
        record "${n}" "${name}" fail "timed out" "${secs}"
    else
        record "${n}" "${name}" fail "exit ${rc}" "${secs}"
    fi
    return 0
}
passed() { grep -q "^$1	[^	]*	pass" "${STEPS}"; }

server_pid() { [[ -f "${WORK}/runs/server.pid" ]] && cat "${WORK}/runs/server.pid" || true; }

cleanup() {
    local rc=$? pid i
    set +e
    if [[ -d "${WORK}/runs" ]]; then
        (cd "${WORK}" && timeout 60 env PYTHONPATH="${PYPATH:-${ROOT}}" "${CAL_PY}" -m calibrate server stop >/dev/null 2>&1)
        pid="$(server_pid)"
        if [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 -- "-${pid}" 2>/dev/null; then
            say "server process group ${pid} still alive: SIGTERM, then SIGKILL"
            kill -TERM -- "-${pid}" 2>/dev/null
            for ((i = 0; i < 100; i++)); do kill -0 -- "-${pid}" 2>/dev/null || break; sleep 0.1; done
            kill -KILL -- "-${pid}" 2>/dev/null
        fi
    fi
    if [[ "${KEEP_WORK:-0}" != "1" ]]; then rm -rf -- "${WORK}"; fi
    exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "${MODE}: work folder ${WORK}, results to ${DEST}, budget ${BUDGET_S} s"

# --- dependencies: nothing is fetched -----------------------------------------------------------
if [[ "${DRY}" == "1" ]]; then
    [[ -x "${CAL_PY}" ]] || { say "no ${CAL_PY}: run make setup first"; exit 2; }
    [[ -x "${ENGINE_PY}" ]] || { say "no ${ENGINE_PY}: run scripts/engine.sh install first"; exit 2; }
    PYPATH="${ROOT}"
else
    shopt -s nullglob
    wheels=("${ROOT}"/.whl/*.whl)
    shopt -u nullglob
    ((${#wheels[@]})) || { say "no wheels in .whl/: run scripts/gpu_proof_prepare.sh on a machine with network, then copy .whl/ here"; exit 2; }
    say "installing ${#wheels[@]} wheels from .whl/ (offline) into ${WORK}/site"
    timeout 120 "${CAL_PY}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "${WORK}/site" "${wheels[@]}"
    PYPATH="${WORK}/site:${ROOT}"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NO_COLOR=1
PORT="$(PYTHONPATH="${PYPATH}" "${CAL_PY}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

# --- 1 gpu-check --------------------------------------------------------------------------------
t0=${SECONDS}
rc=0
timeout --kill-after=10 "$(limit 90)" env PYTHONPATH="${PYPATH}" "${CAL_PY}" scripts/gpu_check.py \
    >"${WORK}/gpu_check.txt" 2>&1 || rc=$?
cat "${WORK}/gpu_check.txt"
if grep -q "no NVIDIA GPU visible" "${WORK}/gpu_check.txt"; then
    record 1 gpu-check skipped "no NVML" $((SECONDS - t0))
elif ((rc == 0)); then
    record 1 gpu-check pass "" $((SECONDS - t0))
else
    record 1 gpu-check fail "exit ${rc}" $((SECONDS - t0))
fi

# --- 2 model ------------------------------------------------------------------------------------
run_step 2 model 240 env PYTHONPATH="${PYPATH}" "${ENGINE_PY}" scripts/build_proof_model.py \
    --size "${SIZE}" "${MODEL_DIR}"

# --- the calibrate project: calibrate.toml, the workload ----------------------------------------
cd "${WORK}"
LADDER_WORKLOAD=()
# The inputs are --tasks items sized with the model's own tokenizer (exact lengths, no token
# probe). PROOF_SYNTHETIC=1 uses --input-tokens/--output-tokens instead: in the CPU dry run that
# path's token probe had its connection dropped by the continuous-batching server (open question,
# see the README section), so it is not the default until it has passed a dry run.
if [[ "${PROOF_SYNTHETIC:-0}" == 1 ]] && cal ladder --help 2>/dev/null | grep -q -- "--input-tokens"; then
    LADDER_WORKLOAD=(--input-tokens "${INPUT_TOKENS}" --output-tokens "${OUTPUT_TOKENS}")
    WORKLOAD="synthetic: --input-tokens ${INPUT_TOKENS} --output-tokens ${OUTPUT_TOKENS}"
else
    PYTHONPATH="${PYPATH}" "${ENGINE_PY}" - "${MODEL_DIR}" "${INPUT_TOKENS}" "${TOP}" >tasks.jsonl <<'EOF'
import json, sys
from pathlib import Path
model, tokens, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(model)
unit = " 1 2 3 4 5 6 7 8 9"
per = max(1, len(tok(unit, add_special_tokens=False)["input_ids"]))
for n in range(count):
    print(json.dumps({"id": n, "text": f"Item {n}. Count:" + unit * max(1, (tokens - 16) // per)}))
EOF
    LADDER_WORKLOAD=(--tasks tasks.jsonl)
    WORKLOAD="${TOP} --tasks items of ${INPUT_TOKENS} tokens (the model's own tokenizer; answers stop on their own)"
fi
say "workload: ${WORKLOAD}"

PYTHONPATH="${PYPATH}" "${CAL_PY}" - "${ENGINE_PY}" "${ROOT}/scripts/gpu_proof_launcher.py" \
    "${MODEL_DIR}" "${PORT}" "${INPUT_TOKENS}" "${TOP}" "${CAP_FILE}" "${BATCHES}" <<'EOF' >calibrate.toml
import json, shlex, sys
py, launcher, model, port, tokens, top, cap, batches = sys.argv[1:]
command = shlex.join([py, launcher, "--model", model, "--port", port, "--input-tokens", tokens,
                      "--batch-ceiling", top, "--cap-file", cap]) + " --batch-size {batch_size}"
q = json.dumps
print(f"""[target]
base_url = {q(f"http://127.0.0.1:{port}/v1")}
model = {q(model)}
timeout_s = 300

[prompt]
text = "What is 2 plus 3?"
max_tokens = 32

[ladder]
batch_sizes = [{batches}]
rounds = 1
latency_rise = 100.0

[sweep]
level_s = 3
repeats = 1

[server]
kind = "custom"
model_path = {q(model)}
port = {port}
command = {q(command)}
ready_timeout_s = 300
stop_timeout_s = 20
""")
EOF
cat calibrate.toml

# --- 3 serve ------------------------------------------------------------------------------------
if passed 2; then
    run_step 3 serve 300 env PYTHONPATH="${PYPATH}" "${CAL_PY}" -m calibrate server start --batch-size "${TOP}"
    if passed 3; then
        # The launcher measures one long prefill and sets the real cap before any calibrate load.
        for ((i = 0; i < 2 * $(limit 240); i++)); do
            grep -q '"state": "starting"' "${CAP_FILE}" 2>/dev/null || break
            sleep 0.5
        done
        cat "${CAP_FILE}" || true
        cp -f "${CAP_FILE}" "${WORK}/cap-ladder.json" 2>/dev/null || true  # rollback's restart rewrites cap.json
        if ! grep -q '"state": "\(capped\|no CUDA: not capped\)"' "${CAP_FILE}" 2>/dev/null; then
            sed -i "s/^3	serve	pass	/3	serve	fail	the launcher did not set its cap (see cap.json)/" "${STEPS}"
        fi
    fi
else
    record 3 serve fail "no model" 0
fi

# --- 4 single, repro, ladder --------------------------------------------------------------------
stage() {  # stage N NAME TIMEOUT ARGS...: calibrate NAME --json ARGS, its JSON kept as NAME.json
    local n="$1" name="$2" own="$3"
    shift 3
    if ! passed 3; then record "${n}" "${name}" fail "no server" 0; return 0; fi
    run_step "${n}" "${name}" "${own}" bash -c \
        'PYTHONPATH="$1" "$2" -m calibrate "${@:4}" --json >"$3"' _ "${PYPATH}" "${CAL_PY}" "${name}.json" "${name}" "$@"
}
stage 4a single 120
stage 4b repro 120
stage 4c ladder 300 --vram-source "${VRAM_SOURCE}" "${LADDER_WORKLOAD[@]}"
# 4d: energy per sweep level too — only with the budget to spare (the rollback's proof comes first);
# the sweep restarts the server at the verified batch, so the rollback's old PID is read after it
if ! passed 4c; then
    record 4d sweep skipped "no passing ladder" 0
elif (($(left) < SWEEP_MIN_LEFT_S)); then
    record 4d sweep skipped "budget: $(left) s left, under ${SWEEP_MIN_LEFT_S} s" 0
else
    stage 4d sweep 150 --concurrency "${SWEEP_LEVELS}" --vram-source "${VRAM_SOURCE}" "${LADDER_WORKLOAD[@]}"
fi
OLD_PID="$(server_pid)"

# --- 5 rollback, verify -------------------------------------------------------------------------
stage 5a rollback 240
stage 5b verify 120
NEW_PID="$(server_pid)"

# --- 6 report -----------------------------------------------------------------------------------
cd "${ROOT}"
mkdir -p "${DEST}"
tar -czf "${DEST}/runs.tar.gz" -C "${WORK}" runs calibrate.toml 2>/dev/null || true
cp -f "${WORK}/cap-ladder.json" "${DEST}/cap.json" 2>/dev/null || true
cp -f "${CAP_FILE}" "${DEST}/cap-rollback.json" 2>/dev/null || true
rc=0
PYTHONPATH="${PYPATH}" "${CAL_PY}" scripts/gpu_proof_report.py --work "${WORK}" --dry "${DRY}" \
    --mode "${MODE}" --workload "${WORKLOAD}" --old-pid "${OLD_PID}" --new-pid "${NEW_PID}" \
    --top "${TOP}" --elapsed "$((SECONDS - START_S))" --out "${DEST}/summary.md" || rc=$?
cp -f "${LOG}" "${DEST}/proof.log"
say "summary: ${DEST}/summary.md ($((SECONDS - START_S)) s)"
exit "${rc}"
