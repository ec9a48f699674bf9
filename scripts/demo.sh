#!/usr/bin/env bash
# The whole staged calibration against the built-in mock, in .demo/ (runs, baselines, scripts).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work="$root/.demo"
rm -rf "$work"
mkdir -p "$work"
cd "$work"

port_file="$work/mock.port"
calibrate mock --port 0 --port-file "$port_file" --slots 4 --oom-at 6 \
  --ttft 0.05 --per-token 0.004 >"$work/mock.log" 2>&1 &
mock_pid=$!
trap 'kill "$mock_pid" 2>/dev/null || true; wait "$mock_pid" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
  [ -s "$port_file" ] && break
  sleep 0.1
done
[ -s "$port_file" ] || { echo "the mock did not start; its log:" >&2; cat "$work/mock.log" >&2; exit 4; }
port=$(cat "$port_file")

cat >calibrate.toml <<TOML
[target]
base_url = "http://127.0.0.1:$port/v1"
model = "internlm-s2"
timeout_s = 30
[sweep]
level_s = 2     # short levels for the demo; the default (15 s) is for a real server
repeats = 2
[confidence]
# the demo goes on when this machine's own noise leaves a verdict in doubt: it takes the
# conservative answer and says so (without this line such a stage ends inconclusive, exit 1)
conservative = true
TOML

step() { printf '\033[1m== %s\033[0m\n' "$*"; }
# a command whose lines say nothing here; when it fails it shows what it said
quiet() { "$@" >"$work/quiet.log" 2>&1 || { cat "$work/quiet.log" >&2; return 1; }; }

step "calibrate run --kind vllm   (single → repro → ladder → sweep → pin in one command)"
# each stage is its own gate, verdict and run folder; the mock runs out of memory past 6 in
# flight, so the ladder stops at batch 8 and the sweep's knee is its 4 slots
calibrate run --kind vllm
sweep_run=$(ls -d runs/*-sweep-* | tail -1)
step "calibrate run again   (every stage passed for this target: the summary, nothing sent)"
calibrate run --kind vllm
step "the stages one at a time: calibrate ladder --input-tokens 400 --output-tokens 64"
# the same ladder on a workload shaped like the job: unique 400-token prompts, answers forced
# to 64 tokens; 'in tok' shows target→what the server counted
calibrate ladder --input-tokens 400 --output-tokens 64
step "calibrate sweep --auto --auto-steps 3   (latency against throughput)"
# synchronous, then the most the ladder proved in flight, then 3 request rates between
calibrate sweep --auto --auto-steps 3
auto_run=$(ls -d runs/*-sweep-* | tail -1)
step "calibrate status"
calibrate status
# --- rollback → pin → restart from the script → verify, with the same mock as a managed engine.
# [server] is added without `kind` (the kind is part of the target identity the ladder ran for);
# `--kind custom` tells calibrate how to run it, and the pidfile / launch script remember it.
cat >>calibrate.toml <<'TOML'

[server]
command = "calibrate mock --port {port} --slots {batch_size} --oom-at 6 --ttft 0.05 --per-token 0.004"
ready_timeout_s = 30
stop_timeout_s = 10
TOML
echo "port = $port" >>calibrate.toml
# the same mock, now started, watched and stopped by calibrate
step "calibrate server start, then rollback   (stage D: back to the last passing batch)"
kill "$mock_pid" && wait "$mock_pid" 2>/dev/null || true
trap 'calibrate server stop >/dev/null 2>&1 || true' EXIT
calibrate server start --kind custom   # at the calibrated setting: batch 4, concurrency 4
calibrate rollback
# tune: a short window per level (a quarter of the sweep's), levels 1-8, three candidates
cat >>calibrate.toml <<'TOML'

[tune]
concurrency = [1, 2, 4, 8]
window = 0.25
TOML
step "calibrate tune     (stage C″: the engine restarted per candidate, --slots 1, 2, 4)"
calibrate tune --kind custom --grid batch_size=1,2,4
step "calibrate pin      (stage E: scripts/launch.sh with the tune winner's flags)"
calibrate pin --kind custom
step "restart from the pinned script, then calibrate verify (stage E′)"
quiet calibrate server stop   # tune stopped its last engine: this only makes sure
calibrate server start --script scripts/launch.sh
calibrate verify

step "calibrate batch    (stage F: 200 items at the pinned concurrency; a rerun resumes)"
python3 - <<'PY'
import json
with open("tasks.jsonl", "w", encoding="utf-8") as handle:
    for i in range(200):
        item = {"id": i, "text": f"第{i}号文档：定长数组的长度在编译时确定，元素在内存中连续存放。"}
        handle.write(json.dumps(item, ensure_ascii=False) + "\n")
PY
calibrate batch --input tasks.jsonl --out out.jsonl --prompt "一句话概括：" --final final.jsonl
calibrate batch --input tasks.jsonl --out out.jsonl --prompt "一句话概括："  # nothing left: resumes
calibrate server stop

step "calibrate report --html   (one self-contained HTML file per run, no server needed)"
ladder_run=$(ls -d runs/*-ladder-* | tail -1)
top() { python3 -c 'import csv, sys; print(max(int(float(r[sys.argv[2]])) for r in csv.DictReader(open(sys.argv[1]))))' "$1/tiers.csv" "$2"; }
# the reports quietly: their tables are the ones above
quiet calibrate report "$ladder_run" --html --timeline "$(top "$ladder_run" batch_size)" --no-plot
quiet calibrate report "$sweep_run" --html --timeline "$(top "$sweep_run" concurrency)" --no-plot
quiet calibrate report "$auto_run" --html --timeline "$(top "$auto_run" auto_step)" --no-plot

# final.jsonl's lines: batch's "final:" line counts them
echo "demo finished: everything it wrote is in .demo/; a report.html in each of"
printf '  %s\n' "$ladder_run (ladder)" "$sweep_run (sweep)" "$auto_run (sweep --auto)"
