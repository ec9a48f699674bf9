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
TOML

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "calibrate single   (stage A: one fixed prompt, baseline written)"
calibrate single
step "calibrate repro    (stage B: same input, same output?)"
calibrate repro
step "calibrate status"
calibrate status
echo
echo "demo finished: everything it wrote is in $work"
