#!/usr/bin/env bash
# Prepare `make gpu-proof` for a GPU box with no network: download, on a machine with network,
# the wheels the proof needs there into the ignored folder .whl/ (pinned, cp312, manylinux x86-64).
#
#   bash scripts/gpu_proof_prepare.sh          then copy the repo (with .whl/) to the GPU box
#
# The box is assumed to have Python 3.12 with torch (CUDA), nvidia-ml-py, pandas, rich, requests,
# urllib3, numpy, safetensors, tokenizers, huggingface-hub, accelerate, psutil, httpx, anyio,
# click, typer, pyyaml, regex, jinja2 — but not the serving extras of transformers. What is carried:
#   * transformers itself, the same version scripts/engine.sh installs for the CPU engine tests, so
#     the GPU run serves through exactly the code the dry run exercised (the box's own 5.x differs);
#   * what `transformers serve` imports that the box lacks (found by importing
#     transformers.cli.serve + transformers.cli.serving.* in .venv-engine and listing the
#     distributions behind sys.modules): fastapi, starlette, uvicorn, pydantic, pydantic-core,
#     annotated-types, typing-inspection, openai (is_serve_available() requires it), jiter, sniffio,
#     httpx2, httpcore2, truststore (openai's HTTP stack), opentelemetry-api (fastapi);
#   * versions newer than the box may hold, required by the above: typing-extensions (pydantic
#     needs >= 4.16), anyio, h11, idna, annotated-doc, regex (transformers checks >= 2025.10.22);
#   * calibrate's own missing dependency: jq.
# Everything is installed there with `pip install --no-index --no-deps --target`, so one version
# of each and no resolver: the list below is the whole closure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

DEST="${WHEEL_DIR:-.whl}"
PYTHON="${PYTHON:-python3}"
LIMIT_MIB=48   # the working tree that travels to the box is capped at 64 MiB in all

WHEELS=(
    transformers==5.24.0
    fastapi==0.165.0
    starlette==1.10.0
    uvicorn==0.54.0
    pydantic==2.14.4
    pydantic-core==2.50.5
    annotated-types==0.8.0
    typing-inspection==0.4.5
    typing-extensions==4.16.0
    annotated-doc==0.0.7
    opentelemetry-api==1.45.2
    openai==3.57.0
    jiter==0.19.0
    sniffio==1.3.1
    httpx2==2.16.2
    httpcore2==2.16.2
    truststore==0.10.5
    anyio==4.16.0
    h11==0.16.0
    idna==3.20
    regex==2026.11.19
    jq==1.13.0
)

mkdir -p "${DEST}"
echo "gpu_proof_prepare: downloading ${#WHEELS[@]} pinned wheels (cp312, manylinux x86-64) into ${DEST}/"
"${PYTHON}" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "${DEST}" "${WHEELS[@]}"

# One version of each: a stale wheel from an earlier pin would make the offline install ambiguous.
wanted="$(printf '%s\n' "${WHEELS[@]}" | tr 'A-Z' 'a-z' | sed 's/[-_.]\{1,\}/_/g; s/==/ /' | sort)"
for wheel in "${DEST}"/*.whl; do
    name="$(basename "${wheel}" | cut -d- -f1,2 | tr 'A-Z' 'a-z' | sed 's/[-_.]\{1,\}/_/g' | sed 's/_\([0-9][0-9_]*\)$/ \1/')"
    if ! grep -qxF "${name}" <<<"${wanted}"; then
        echo "gpu_proof_prepare: removing ${wheel} (not in the pinned list)"
        rm -f -- "${wheel}"
    fi
done

count="$(find "${DEST}" -maxdepth 1 -type f -name '*.whl' | wc -l)"
[[ "${count}" -eq "${#WHEELS[@]}" ]] || {
    echo "gpu_proof_prepare: error: expected ${#WHEELS[@]} wheels in ${DEST}, found ${count}" >&2
    exit 1
}
ls -l "${DEST}"/*.whl | awk '{printf "  %8.1f KiB  %s\n", $5 / 1024, $NF}'
total_kib="$(du -sk "${DEST}" | cut -f1)"
echo "gpu_proof_prepare: ${count} wheels, total $((total_kib / 1024)) MiB (${total_kib} KiB) in ${DEST}/"
if ((total_kib > LIMIT_MIB * 1024)); then
    echo "gpu_proof_prepare: error: over ${LIMIT_MIB} MiB: the tree sent to the GPU box is capped at 64 MiB" >&2
    exit 1
fi
echo "gpu_proof_prepare: next, on the GPU box (no network needed): make gpu-proof"
