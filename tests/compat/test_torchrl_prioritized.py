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

import subprocess
from pathlib import Path

import pytest

from tests.compat.own_venv import run_checks, venv_python

CHECKS = Path(__file__).resolve().parent / "torchrl_env"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def torchrl_python() -> Path:
    return venv_python(".venv-torchrl", "torchrl-test", torch="torch==2.14.1")


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
    run_checks(torchrl_python, CHECKS, tmp_path)
