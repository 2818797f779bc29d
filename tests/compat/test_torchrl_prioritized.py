"""TorchRL's prioritized samplers over the drop-in, tested in their own venv:
``tests/compat/torchrl_env/checks_prioritized.py``.

``PrioritizedSampler`` and ``PrioritizedSliceSampler`` keep their priorities in TorchRL's C++
extension, which TorchRL 0.14 builds against torch 2.14: with the 2.13.0 CPU build of the
main test venv it does not load ("SumSegmentTreeFp32 is not available"), in TorchRL itself.
``scripts/test.sh`` makes ``.venv-torchrl`` (torch 2.14.1, the ``torchrl-test`` extra) for
the slow tests; this test makes it too when it is missing, runs the checks there and fails
with their report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-torchrl"
CHECKS = Path(__file__).resolve().parent / "torchrl_env"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def torchrl_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run(
            ["bash", str(REPO / "scripts" / "setup.sh"), "torchrl-test", str(VENV)],
            check=True,
            stdin=subprocess.DEVNULL,
            timeout=900,
            env={**os.environ, "TORCH": "torch==2.14.1"},
        )
    return python


def test_the_venv_loads_torchrls_extension(torchrl_python):
    """The venv really has what the main one lacks: TorchRL's segment trees."""
    out = subprocess.run(
        [
            str(torchrl_python),
            "-W",
            "ignore",
            "-c",
            "import torch, torchrl; from torchrl._torchrl import SumSegmentTreeFp32; "
            "print(torch.__version__, torchrl.__version__, SumSegmentTreeFp32(8).size)",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split()
    assert out[0].startswith("2.14") and out[1].startswith("0.14") and out[2] == "8", out


def test_prioritized_checks_pass_in_their_venv(torchrl_python, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [
            str(torchrl_python),
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
        timeout=600,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    last = proc.stdout.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "skipped" not in last, report
    sys.stdout.write(last + "\n")
