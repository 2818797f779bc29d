"""The shared fixtures of ``tests/conftest.py``: shared where read, private where changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from atari_zarr_testkit import FixtureRun

from atari_zarr import AtariZarrDataset, ConvertedStore
from atari_zarr.layout import REWARD


def test_pong_run_is_a_private_copy_of_the_shared_run(
    pong_run: FixtureRun, pong_source: FixtureRun, source_root: Path
) -> None:
    assert pong_run.url == str(source_root / "Pong" / "1") != pong_source.url
    ours = sorted(p.relative_to(pong_run.url) for p in Path(pong_run.url).rglob("*"))
    shared = sorted(p.relative_to(pong_source.url) for p in Path(pong_source.url).rglob("*"))
    assert ours == shared and ours
    for name in ours:
        if (Path(pong_run.url) / name).is_file():
            (Path(pong_run.url) / name).write_bytes(b"changed")  # the shared run is untouched
    assert all(
        (Path(pong_source.url) / name).read_bytes() != b"changed"
        for name in shared
        if (Path(pong_source.url) / name).is_file()
    )


def test_pong_store_copy_is_a_private_copy_of_the_shared_store(
    pong_store_copy: ConvertedStore, pong_store: ConvertedStore, dest_root: Path
) -> None:
    assert pong_store_copy.url == str(dest_root / "Pong" / "1.zarr") != pong_store.url
    ours, shared = Path(pong_store_copy.url), Path(pong_store.url)
    files = sorted(p.relative_to(shared) for p in shared.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file())
    assert all((ours / name).read_bytes() == (shared / name).read_bytes() for name in files)
    AtariZarrDataset(pong_store_copy.url)  # complete and readable where it is
    shutil.rmtree(ours / REWARD)
    assert (shared / REWARD).is_dir()  # the shared store is untouched


def _run_pytest(tmp_path: Path, *args: str):
    import os
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.harness", "-p", "no:cacheprovider",
         *args, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # a run of its own: not a worker of the xdist run this test may be in
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
            "PYTHONPATH": str(root),
        },
        timeout=300,
    )


def test_a_run_that_stops_early_says_so_and_fails(tmp_path: Path) -> None:
    """A hook that breaks after the first test (as a timeout firing inside a plugin's
    teardown did): the closing line counts one passed, and the harness says two tests
    never ran, and fails the run."""
    (tmp_path / "conftest.py").write_text(
        "def pytest_runtest_logreport(report):\n"
        "    if report.when == 'teardown' and report.nodeid.endswith('test_a'):\n"
        "        raise RuntimeError('a plugin broke here')\n"
    )
    (tmp_path / "test_three.py").write_text(
        "def test_a():\n    pass\n\ndef test_b():\n    pass\n\ndef test_c():\n    pass\n"
    )
    res = _run_pytest(tmp_path)
    assert res.returncode != 0
    assert "2 of the 3 tests collected never ran" in res.stdout, res.stdout + res.stderr


@pytest.mark.slow  # two runs of pytest with two workers each: about 20-40 s
def test_under_xdist_the_controller_counts_what_the_workers_collected(tmp_path: Path) -> None:
    """With ``-n 2`` each worker collects all four tests and runs its share: a whole run
    passes with no line from the harness, and a run whose worker breaks after its first
    test (a plugin's code ending that worker) fails, naming the tests that never ran."""
    (tmp_path / "test_four.py").write_text(
        "".join(f"def test_{name}():\n    pass\n\n" for name in "abcd")
    )
    res = _run_pytest(tmp_path, "-n", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 passed" in res.stdout and "never ran" not in res.stdout

    (tmp_path / "conftest.py").write_text(
        "import os\n"
        "def pytest_runtest_logreport(report):\n"
        "    worker = os.environ.get('PYTEST_XDIST_WORKER')\n"
        "    if worker and report.when == 'teardown' and report.nodeid.endswith('test_a'):\n"
        "        os._exit(3)  # the worker dies, as a crash in a plugin's code does\n"
    )
    res = _run_pytest(tmp_path, "-n", "2", "--max-worker-restart=0", "--dist", "loadfile")
    assert res.returncode != 0
    assert "of the 4 tests collected never ran" in res.stdout, res.stdout + res.stderr
