"""The command line, through the installed entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atari_zarr.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atari_zarr", *args], capture_output=True, text=True, timeout=300
    )


def test_convert_then_info(pong_run, source_root, dest_root):
    res = run_cli("convert", str(source_root), str(dest_root), "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "Pong/1:" in res.stdout and "transitions" in res.stdout
    store = dest_root / "Pong" / "1.zarr"
    res = run_cli("info", str(store))
    assert res.returncode == 0, res.stderr
    assert "transitions" in res.stdout and "complete" in res.stdout
    res = run_cli("info", str(store), "--json")
    info = json.loads(res.stdout)
    assert info["transitions"] == len(pong_run.truth())


def test_errors_are_one_line_with_exit_code(tmp_path):
    res = run_cli("convert", str(tmp_path / "missing"), str(tmp_path / "out"))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("atari-zarr convert: error: ")
    assert "missing does not exist" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_existing_store_and_bad_options(pong_run, source_root, dest_root, capsys):
    assert main(["convert", str(source_root), str(dest_root), "-q"]) == 0
    assert main(["convert", str(source_root), str(dest_root), "-q"]) == 1
    assert "Pass --overwrite" in capsys.readouterr().err
    assert main(["convert", str(source_root), str(dest_root), "-q", "--overwrite"]) == 0
    assert main(["convert", str(source_root), str(dest_root), "-q", "--checkpoints", "x"]) == 1
    assert "not a suffix or a range" in capsys.readouterr().err
    assert main(["convert", str(source_root), str(dest_root), "-q", "-s", "novalue"]) == 1
    assert "is not KEY=VALUE" in capsys.readouterr().err
    assert main(["convert", str(source_root), str(dest_root), "--games", "../x"]) == 1
    assert "is not a plain name" in capsys.readouterr().err


def test_usage_errors_exit_2():
    res = run_cli("convert")
    assert res.returncode == 2
    assert "usage:" in res.stderr
    res = run_cli("--help")
    assert res.returncode == 0
    for verb in ("convert", "info", "demo"):
        assert verb in res.stdout


@pytest.mark.slow
def test_demo_end_to_end(tmp_path):
    res = run_cli("demo", str(tmp_path / "demo"), "--steps", "1500", "-q")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "demo" / "stores" / "Pong" / "1.zarr" / "zarr.json").exists()
