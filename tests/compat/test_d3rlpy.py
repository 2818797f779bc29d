"""The d3rlpy drop-in, tested in its own venv: ``tests/compat/d3rlpy_env/checks_d3rlpy.py``.

d3rlpy 2.8 pins ``gymnasium==1.0.0``; under it, ale-py 0.11 and later register no Atari
env (their vector env needs gymnasium >= 1.1), so d3rlpy's environment has ale-py 0.10,
while this suite runs the newest gymnasium and ale-py. ``scripts/test.sh`` makes that
venv (``.venv-d3rlpy``, the ``d3rlpy-test`` extra) with ``scripts/setup.sh``; this test
makes it too when it is missing, then runs the checks there and fails with their report.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.compat.own_venv import run_checks, venv_python

CHECKS = Path(__file__).resolve().parent / "d3rlpy_env"


@pytest.fixture(scope="module")
def d3rlpy_python() -> Path:
    return venv_python(".venv-d3rlpy", "d3rlpy-test", timeout=540)


def test_d3rlpy_environment_is_d3rlpys(d3rlpy_python):
    """The venv really is d3rlpy's: its gymnasium pin, an ale-py that registers envs."""
    out = subprocess.run(
        [
            str(d3rlpy_python),
            "-c",
            "import d3rlpy, gymnasium, ale_py; gymnasium.register_envs(ale_py); "
            "print(d3rlpy.__version__, gymnasium.__version__, "
            "'ALE/Pong-v5' in gymnasium.registry)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out[0].startswith("2.8") and out[1] == "1.0.0" and out[2] == "True", out


@pytest.mark.slow
def test_d3rlpy_checks_pass_in_its_venv(d3rlpy_python, tmp_path):
    run_checks(d3rlpy_python, CHECKS, tmp_path, timeout=540)
