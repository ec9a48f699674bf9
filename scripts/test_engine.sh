#!/usr/bin/env bash
# make test-engine: install the engine if missing, build the model if missing, start the engine,
# run the engine suite against it, and stop the engine whatever happens. Any failure to install
# or start the engine fails this script (the suite must fail, not skip, when the engine is absent).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
bash scripts/engine.sh install
bash scripts/engine.sh build-model
trap 'bash scripts/engine.sh stop || true' EXIT
bash scripts/engine.sh start
port=$(cat runs/engine.port)
export ENGINE_BASE_URL="http://127.0.0.1:${port}/v1"
export ENGINE_MODEL="tests/engine/model"
start=$(date +%s)
"$python" -m pytest -q -m engine -p no:cacheprovider tests/engine "$@"
echo "engine suite took $(( $(date +%s) - start )) s"
