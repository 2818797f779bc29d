#!/usr/bin/env bash
# Create a venv (once; default .venv) and install atari-zarr with the extras named in $1
# (default: all). torch is pinned to the CPU build first, so that no multi-GB CUDA wheel is
# pulled in. $2 names another venv: the d3rlpy drop-in is tested in .venv-d3rlpy, since
# d3rlpy pins an older gymnasium than the rest of the project uses.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-all}"
venv="${2:-.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "atari-zarr needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1; }
    "$PY" -m venv "$venv"
fi
VPY="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$VPY" -c 'import torch' 2>/dev/null; then
    "$VPY" -m pip install --quiet "torch==2.13.0"
fi
"$VPY" -m pip install --quiet -e ".[${extras}]"
# the test extras also need a browser (the episode player's tests): Debian's chromium
if [ "$extras" = "test" ]; then
    bash scripts/chromium.sh
fi
