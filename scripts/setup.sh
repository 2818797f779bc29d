#!/usr/bin/env bash
# Create a venv (once; default .venv) and install atari-zarr with the extras named in $1
# (default: all). torch is pinned to the CPU build first, so that no multi-GB CUDA wheel is
# pulled in ($TORCH names another release). $2 names another venv: the d3rlpy drop-in is
# tested in .venv-d3rlpy, since d3rlpy pins an older gymnasium than the rest of the project
# uses, and TorchRL's prioritized samplers in .venv-torchrl, with the torch release their
# C++ extension is built for (TORCH=torch==2.14.1; the 2.13.0 CPU build cannot load it).
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
TORCH="${TORCH:-torch==2.13.0}"
CPU_INDEX=https://download.pytorch.org/whl/cpu
if ! "$VPY" -c 'import torch' 2>/dev/null; then
    # the wheel this machine holds (no index asked), else PyTorch's CPU index, never
    # PyPI's torch (a CUDA build, some 5.8 GB with its libraries); then its dependencies
    "$VPY" -m pip install --quiet --no-index --no-deps "$TORCH" 2>/dev/null \
        || "$VPY" -m pip install --quiet --no-deps --index-url "$CPU_INDEX" "$TORCH"
    "$VPY" -m pip install --quiet "$TORCH"
fi
# a C compiler for the chunk loop (optional: the install goes on without it)
bash scripts/compiler.sh "$VPY" || true
"$VPY" -m pip install --quiet -e ".[${extras}]"
# the test kit (tests/kit: fixture runs, loopback servers), for the tests, benchmarks and
# notebook of this repository; it is not part of the atari-zarr wheel
"$VPY" -m pip install --quiet --no-deps -e tests/kit
# the test extras also need a browser (the episode player's tests): Debian's chromium, and
# the wheels of the TorchRL drop-in's install, which tests/test_wheel.py puts into a fresh
# venv with --no-index (the test itself talks only to loopback)
if [ "$extras" = "test" ]; then
    bash scripts/chromium.sh
    # filled again when the declared dependencies change (the stamp is pyproject.toml's)
    stamp=$(sha256sum pyproject.toml | cut -c1-16)
    if [ "$(cat .wheelhouse/complete 2>/dev/null)" != "$stamp" ]; then
        "$VPY" -m pip download --quiet --no-index --no-deps --dest .wheelhouse "torch==2.13.0" \
            2>/dev/null || "$VPY" -m pip download --quiet --no-deps --index-url "$CPU_INDEX" \
            --dest .wheelhouse "torch==2.13.0"
        "$VPY" -m pip download --quiet --find-links .wheelhouse --dest .wheelhouse \
            "torch==2.13.0" ".[torchrl]"
        rm -f .wheelhouse/atari_zarr-* && echo "$stamp" > .wheelhouse/complete
    fi
fi
