"""`verify` on RL Unplugged stores: against their shards, final frames, source returns."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from atari_zarr_testkit.rl_unplugged import RluFixture, replace_record, write_fixture_rlu

from atari_zarr import convert
from atari_zarr.layout import ATTRS_KEY, FINAL_OBSERVATION, OBSERVATION, UNCLIPPED_REWARD
from atari_zarr.sources.rl_unplugged.example import encode_episode
from atari_zarr.verify import verify_store


@pytest.fixture(scope="module")
def rlu(tmp_path_factory: pytest.TempPathFactory) -> RluFixture:
    """Shards 0 and 2 of 3 (never modified: tests that damage them copy them)."""
    return write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=3, present=(0, 2))


@pytest.fixture(scope="module")
def store(rlu: RluFixture, tmp_path_factory: pytest.TempPathFactory) -> str:
    dest = tmp_path_factory.mktemp("stores")
    [done] = convert(rlu.root, str(dest), source_kind="rl-unplugged", progress=False)
    return done.url


@pytest.fixture
def copy(store: str, tmp_path: Path) -> Path:
    """A private copy of the converted store, to damage."""
    path = tmp_path / "1.zarr"
    shutil.copytree(store, path)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atari_zarr", "verify", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def edit(path: Path, name: str, row: int, change) -> None:
    """Rewrite one row through zarr: the checksums stay valid, only the source can tell."""
    arr = zarr.open_group(str(path), mode="r+")[name]
    value = np.asarray(arr[row : row + 1])
    arr[row : row + 1] = change(value)


def test_sound_store_passes_against_its_source(rlu, store):
    n = len(rlu.truth())
    for source in (rlu.root, rlu.game_dir):  # the dataset root or the game directory
        report = verify_store(store, source=source)
        assert report.ok, report.format()
        assert report.checked["compared"] == report.checked["transitions"] == n
        assert report.rows_to_check == 2 * n  # frames read once, then compared
        assert report.warnings == []
    res = cli(store, "--source", rlu.root)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr


def test_without_source_final_frames_and_unclipped_rewards_are_checked(copy):
    report = verify_store(str(copy))
    assert report.ok, report.format()
    # one final frame too few: final_observation must have counts.episodes rows
    doc = json.loads((copy / "zarr.json").read_text())
    doc["attributes"][ATTRS_KEY]["counts"]["episodes"] = 5
    (copy / "zarr.json").write_text(json.dumps(doc))
    text = verify_store(str(copy)).format()
    assert f"{FINAL_OBSERVATION}: shape is (4, 84, 84), expected (5, 84, 84)" in text
    assert "(layout and counts.episodes)" in text


@pytest.mark.parametrize("name", [OBSERVATION, FINAL_OBSERVATION, UNCLIPPED_REWARD])
def test_a_flipped_byte_is_caught_without_the_source(copy, name):
    files = [p for p in copy.joinpath(*name.split("/"), "c").rglob("*") if p.is_file()]
    chunk = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(chunk.read_bytes())
    data[-7] ^= 0x10
    chunk.write_bytes(bytes(data))
    report = verify_store(str(copy))
    assert not report.ok
    assert f"{name}: " in report.format() and "cannot be decoded" in report.format()


def test_changed_rows_are_caught_against_the_source(rlu, copy):
    truth = rlu.truth()
    terminal = int(np.flatnonzero(truth.episode_terminated)[0])
    edit(copy, OBSERVATION, 10, lambda v: v ^ 1)  # one frame, every pixel off by one
    edit(copy, FINAL_OBSERVATION, terminal, lambda v: np.zeros_like(v))  # terminal frame lost
    edit(copy, UNCLIPPED_REWARD, 300, lambda v: v + 50)
    # every checksum holds, yet the objects are not the ones the converter wrote
    plain = verify_store(str(copy)).format()
    assert f"object '{OBSERVATION}/c/0/0/0'" in plain and "since the store was completed" in plain
    report = verify_store(str(copy), source=rlu.root)
    assert not report.ok
    text = report.format()
    assert f"{OBSERVATION}: frames at rows [10] differ from shard 0 of {rlu.root}" in text
    assert f"{FINAL_OBSERVATION}: final frames of episodes [{terminal}] differ from shard" in text
    assert f"{UNCLIPPED_REWARD}: 1 of rows 233..477 differ from shard 2" in text


def test_a_store_against_another_source_fails(rlu, store, tmp_path):
    other = write_fixture_rlu(str(tmp_path / "other"), num_shards=3, episodes_per_shard=1)
    report = verify_store(store, source=other.root)
    assert not report.ok
    assert f"gives {len(other.truth())} transitions" in report.format()
    assert "the store holds 478: not the same conversion" in report.format()
    lacking = tmp_path / "lacking"
    shutil.copytree(rlu.root, lacking)
    (lacking / "Asterix" / Path(rlu.paths[2]).name).unlink()
    report = verify_store(store, source=str(lacking))
    assert "lacks shards [2] that the store was converted from" in report.format()
    assert report.checked["compared"] == 0
    report = verify_store(store, source=str(tmp_path / "nothing"))
    assert "cannot plan" in report.format() and "does not exist" in report.format()


@pytest.mark.parametrize(
    "selection",
    [{"max_transitions": 300}, {"max_episodes": 3}, {"checkpoints": "2"}],
    ids=["max-transitions", "max-episodes", "shard"],
)
def test_selected_store_passes_against_its_source(rlu, tmp_path, selection):
    [done] = convert(rlu.root, str(tmp_path), progress=False, **selection)
    report = verify_store(done.url, source=rlu.root)
    assert report.ok, report.format()
    assert report.checked["compared"] == done.transitions < len(rlu.truth())


def test_source_returns_that_disagree_are_a_warning(rlu, tmp_path):
    shutil.copytree(rlu.root, tmp_path / "src")
    example = rlu.episodes_of(2)[0].example()
    example.episode_return = 12345.0
    replace_record(
        tmp_path / "src" / "Asterix" / Path(rlu.paths[2]).name, 0, encode_episode(example)
    )
    [done] = convert(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    report = verify_store(done.url)
    assert report.ok, report.format()  # the store copies its source faithfully
    [warning] = report.warnings
    assert "1 of 4 episode_return values differ" in warning and "shard 2, record 0" in warning
    res = cli(done.url)
    assert res.returncode == 0, res.stderr
    assert "OK" in res.stdout and "warning: 1 of 4 episode_return values differ" in res.stdout
