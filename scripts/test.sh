#!/usr/bin/env bash
# Quick start 2: set up with the test extras, then run the suite on two workers (pytest-xdist,
# a file to a worker), leaving out the tests marked slow. CI runs both halves:
#   bash scripts/test.sh            # the suite without the slow tests (about 10 min on 2 cores, set-up included)
#   bash scripts/test.sh --slow     # only the slow ones: the site, the wheel, d3rlpy's checks...
#   bash scripts/test.sh --all      # everything
# Any other arguments go to pytest. The d3rlpy drop-in's checks run in their own venv
# (.venv-d3rlpy, made here): d3rlpy pins gymnasium 1.0.0 (tests/compat/test_d3rlpy.py);
# so do TorchRL's prioritized samplers' (.venv-torchrl, made here for the slow tests): TorchRL
# 0.14's C++ extension loads with torch 2.14 only (tests/compat/test_torchrl_prioritized.py).
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not slow")
case "${1:-}" in
  --slow) select=(-m slow); shift ;;
  --all) select=(); shift ;;
esac
bash scripts/setup.sh test
bash scripts/setup.sh d3rlpy-test .venv-d3rlpy
if [ "${select[*]}" != "-m not slow" ]; then
    TORCH=torch==2.14.1 bash scripts/setup.sh torchrl-test .venv-torchrl
fi
exec .venv/bin/python -m pytest -n 2 --dist loadfile "${select[@]}" "$@"
