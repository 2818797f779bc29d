"""Checks that run in a venv of their own: a library that pins other versions than the
suite's (d3rlpy's gymnasium, TorchRL's C++ extension's torch). ``scripts/test.sh`` makes
each venv with ``scripts/setup.sh``; a test makes it too when it is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def venv_python(venv: str, extra: str, *, torch: str | None = None, timeout: int = 900) -> Path:
    """The Python of ``REPO/venv``, made with the ``extra`` (and ``torch`` pinned) if missing."""
    python = REPO / venv / "bin" / "python"
    if not python.exists():
        env = {**os.environ, **({"TORCH": torch} if torch else {})}
        subprocess.run(
            ["bash", str(REPO / "scripts" / "setup.sh"), extra, str(REPO / venv)],
            check=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env=env,
        )
    return python


def run_checks(python: Path, checks: Path, tmp_path: Path, *, timeout: int = 600) -> None:
    """Run the ``checks_*.py`` of ``checks`` with ``python``'s pytest; fail with their report
    unless every check passed (a skip is not a pass)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-c",
            str(checks / "pytest.ini"),
            "--rootdir",
            str(checks),
            "--noconftest",
            "--basetemp",
            str(tmp_path / "t"),
            "-q",
            str(checks),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    last = proc.stdout.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "skipped" not in last, report
    sys.stdout.write(last + "\n")
