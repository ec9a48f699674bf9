#!/usr/bin/env bash
# make test-browser: install Debian's chromium when it is missing (apt-get; root or sudo), so the
# HTML report can be opened headless. Fails with a clear message when it cannot be installed:
# the browser test must fail, not skip, without a browser. Prints how long the install took.
set -euo pipefail

find_chromium() { command -v chromium || command -v chromium-browser || true; }

found=$(find_chromium)
if [ -n "$found" ]; then
    echo "browser: $found ($("$found" --version 2>/dev/null || echo 'version unknown'))"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "browser: chromium is not installed and this machine has no apt-get." >&2
    echo "Install Chromium (the 'chromium' binary on PATH) and rerun: make test-browser" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "browser: installing chromium needs root (or sudo)." >&2; exit 1; }
    sudo="sudo"
fi
start=$(date +%s)
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
found=$(find_chromium)
[ -n "$found" ] || { echo "browser: apt-get finished but no chromium is on PATH" >&2; exit 1; }
echo "browser: installed $found in $(( $(date +%s) - start )) s"
