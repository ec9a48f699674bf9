#!/bin/sh
# A fake inference engine for launch-script tests: records its argv (NUL-separated) and the
# variables the script exported, then exits. Installed on PATH under each engine's name.
out=${FAKE_ENGINE_OUT:?FAKE_ENGINE_OUT is not set}
printf '%s\0' "$(basename "$0")" "$@" >"$out"
env >"$out.env"
