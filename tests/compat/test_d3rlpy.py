"""The d3rlpy drop-in, tested in its own venv: ``tests/compat/d3rlpy_env/checks_d3rlpy.py``.

d3rlpy 2.8 pins ``gymnasium==1.0.0``; under it, ale-py 0.11 and later register no Atari
env (their vector env needs gymnasium >= 1.1), so d3rlpy's environment has ale-py 0.10,
while this suite runs the newest gymnasium and ale-py. ``scripts/test.sh`` makes that
venv (``.venv-d3rlpy``, the ``d3rlpy-test`` extra) with ``scripts/setup.sh``; this test
makes it too when it is missing, then runs the checks there and fails with their report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-d3rlpy"
CHECKS = Path(__file__).resolve().parent / "d3rlpy_env"


@pytest.fixture(scope="module")
def d3rlpy_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run(
            ["bash", str(REPO / "scripts" / "setup.sh"), "d3rlpy-test", str(VENV)],
            check=True,
            stdin=subprocess.DEVNULL,
            timeout=540,
        )
    return python


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [
            str(d3rlpy_python),
            "-m",
            "pytest",
            "-c",
            str(CHECKS / "pytest.ini"),
            "--rootdir",
            str(CHECKS),
            "--noconftest",
            "--basetemp",
            str(tmp_path / "t"),
            "-q",
            str(CHECKS),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    last = proc.stdout.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "skipped" not in last, report
    sys.stdout.write(last + "\n")
