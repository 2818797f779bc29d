#!/usr/bin/env bash
# Quick start 2: set up with the test extras, then run the whole suite (slow tests included).
# The d3rlpy drop-in's checks run in their own venv (.venv-d3rlpy, made here): d3rlpy pins
# gymnasium 1.0.0 (tests/compat/test_d3rlpy.py runs them there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/setup.sh d3rlpy-test .venv-d3rlpy
exec .venv/bin/python -m pytest "$@"
