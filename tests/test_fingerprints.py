"""Another writer's object is caught without the source: by plain verify and by every reader."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from atari_zarr import AtariZarrDataset
from atari_zarr.errors import StoreCorruptError, StoreFormatError
from atari_zarr.fingerprints import FINGERPRINTS_KEY, recorded
from atari_zarr.layout import OBSERVATION, mark_complete
from atari_zarr.verify import verify_store
from tests.read.test_stream import frame_of, write_store


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two stores of 10,000 rows: other actions, and other frames in shard 1."""
    root = tmp_path_factory.mktemp("fp")
    a = write_store(str(root / "a.zarr"), 10_000, seed=0, final=False)
    b = write_store(str(root / "b.zarr"), 10_000, seed=1, final=False)
    group = zarr.open_group(b, mode="r+")
    group[OBSERVATION][4096:8192] = frame_of(np.arange(4096, 8192) + 7)
    mark_complete(group, {})
    return Path(a), Path(b)


def fresh(two, tmp_path) -> tuple[Path, Path]:
    a, b = two
    copy = Path(shutil.copytree(a, tmp_path / "a.zarr"))
    return copy, b


def swap(dest: Path, src: Path, rel: str) -> None:
    (dest / rel).write_bytes((src / rel).read_bytes())


def test_every_object_is_recorded_at_completion(two) -> None:
    a, _ = two
    group = zarr.open_group(str(a), mode="r")
    assert len(recorded(group[OBSERVATION])) == 3  # shards of 4096 rows
    assert len(recorded(group["next/reward"])) == 1  # one 65,536-row chunk
    assert (recorded(group[OBSERVATION]) != 0).all()


def test_a_frame_shard_of_another_store_is_caught(two, tmp_path) -> None:
    a, b = fresh(two, tmp_path)
    swap(a, b, "observation/c/1/0/0")  # valid bytes, every crc32c right: another store's
    report = verify_store(str(a))
    assert not report.ok and "observation/c/1/0/0" in report.format()
    assert "copied in from another store or conversion" in report.format()
    ds = AtariZarrDataset(str(a))
    assert ds[np.array([10])]["observation"].shape[0] == 1  # other shards read
    with pytest.raises(StoreCorruptError, match="not the one this store's writer wrote") as err:
        ds[np.array([5000])]
    assert "\n" not in str(err.value) and "observation/c/1/0/0" in str(err.value)
    with pytest.raises(StoreCorruptError, match="another store or conversion"):
        list(AtariZarrDataset(str(a)).stream(512, seed=0))


def test_a_step_chunk_of_another_store_is_caught(two, tmp_path) -> None:
    a, b = fresh(two, tmp_path)
    swap(a, b, "action/c/0")
    assert "action/c/0" in verify_store(str(a)).format()
    with pytest.raises(StoreCorruptError, match="'action'"):
        AtariZarrDataset(str(a))[np.array([3])]


def test_a_converted_store_copied_whole_passes(pong_store_copy) -> None:
    group = zarr.open_group(pong_store_copy.url, mode="r")
    assert recorded(group[OBSERVATION]) is not None  # the converter records them
    assert verify_store(pong_store_copy.url).ok


def test_an_older_store_reads(two, tmp_path) -> None:
    a, _ = fresh(two, tmp_path)
    # a store written before fingerprints were recorded: nothing to compare, all read
    group = zarr.open_group(str(a), mode="r+")
    for name in (OBSERVATION, "action"):
        attrs = dict(group[name].attrs)
        attrs.pop(FINGERPRINTS_KEY)
        group[name].attrs.clear()
        group[name].attrs.update(attrs)
    zarr.consolidate_metadata(str(a))
    assert AtariZarrDataset(str(a))[np.array([5000])]["observation"].shape[0] == 1


def test_a_linked_chunk_directory_is_refused_like_a_linked_object(two, tmp_path) -> None:
    a, b = fresh(two, tmp_path)
    shutil.rmtree(a / "observation" / "c")
    (a / "observation" / "c").symlink_to(b / "observation" / "c", target_is_directory=True)
    with pytest.raises(StoreFormatError, match="symbolic link") as err:
        AtariZarrDataset(str(a))[np.array([10])]
    assert "\n" not in str(err.value) and str(a / "observation" / "c") in str(err.value)
    report = verify_store(str(a))
    assert not report.ok and "symbolic link" in report.format()
