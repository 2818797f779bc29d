"""An opened store (read/store.py): a complete store's missing objects are damage, and a
store replaced under a running reader is reported as changed, never as zeros."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import write_fixture_run
from atari_zarr_testkit.gcs import FakeGCSServer

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import (
    StoreChangedError,
    StoreCorruptError,
    StoreFormatError,
    StoreIncompleteError,
)
from atari_zarr.layout import ATTRS_KEY
from atari_zarr.read.store import StoreReader


@pytest.fixture
def big(tmp_path: Path):
    """A store of several observation shards (4096 rows each) and several reward chunks."""
    source = tmp_path / "src"
    run = write_fixture_run(str(source), "Pong", "1", capacity=4096, steps=9000, seed=4)
    [store] = convert(str(source), str(tmp_path / "stores"), progress=False)
    return {"source": source, "store": store, "truth": run.truth(), "dest": tmp_path / "stores"}


def _shard_objects(url: str, name: str) -> list[Path]:
    return sorted(p for p in (Path(url) / name / "c").rglob("*") if p.is_file())


def test_a_missing_frame_shard_is_damage_in_every_reader(big):
    url = big["store"].url
    shards = _shard_objects(url, "observation")
    assert len(shards) >= 3
    gone = shards[1]
    gone.unlink()
    key = "observation/" + str(gone.relative_to(Path(url) / "observation"))
    ds = AtariZarrDataset(url)
    rows = np.array([4096 + 5, 4096 + 700])
    with pytest.raises(StoreCorruptError) as info:
        ds[rows]
    text = str(info.value)
    assert "\n" not in text and "is missing" in text and "rows 4096-" in text
    assert key.split("/")[0] in text and "damaged" in text
    # rows of the other shards still read
    assert ds[np.array([3, 8500])]["observation"].shape == (2, 84, 84)
    with pytest.raises(StoreCorruptError, match="is missing"):
        for _ in ds.stream(256, seed=0):
            pass
    windows = AtariZarrDataset(url, frame_stack=4).windows(4)
    with pytest.raises(StoreCorruptError, match="is missing"):
        windows[np.searchsorted(windows.starts(np.arange(len(windows))), 4200)]


def test_a_missing_reward_chunk_is_damage_not_reward_zero(big):
    url = big["store"].url
    [chunk] = _shard_objects(url, "next/reward")[:1]
    chunk.unlink()
    ds = AtariZarrDataset(url)
    with pytest.raises(StoreCorruptError, match=r"array 'next/reward' \(rows 0-"):
        ds[np.array([10])]


def test_a_missing_object_in_a_bucket_is_damage(big, tmp_path):
    with FakeGCSServer() as server:
        server.create_bucket("damage")
        opts = server.storage_options()
        import fsspec

        fs = fsspec.filesystem("gs", skip_instance_cache=True, **opts)
        fs.put(big["store"].url.rstrip("/") + "/", "damage/Pong/1.zarr/", recursive=True)
        objects = sorted(p for p in fs.find("damage/Pong/1.zarr/observation/c"))
        fs.rm(objects[0])  # a 404 now
        ds = AtariZarrDataset("gs://damage/Pong/1.zarr", storage_options=opts)
        with pytest.raises(StoreCorruptError, match="is missing"):
            ds[np.array([1, 2])]


def test_only_the_json_true_marks_a_store_complete(big):
    """A complete store is read with missing chunks as damage; ``"complete": "false"``
    (a string) is an unfinished store for the reader, ``ls`` and ``verify`` alike."""
    from atari_zarr.catalog import store_state
    from atari_zarr.verify import verify_store

    url = big["store"].url
    assert StoreReader(url).engine.missing_is_damage
    group = zarr.open_group(url, mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])
    meta["complete"] = "false"
    group.attrs[ATTRS_KEY] = meta
    with pytest.raises(StoreIncompleteError):
        StoreReader(url)
    assert store_state(url) == "incomplete"
    report = verify_store(url, progress=False)
    assert not report.ok and "incomplete" in " ".join(str(p) for p in report.problems)


def test_a_store_replaced_under_a_running_reader_is_reported_as_changed(big):
    url = big["store"].url
    ds = AtariZarrDataset(url)
    first = ds[np.array([0, 1])]
    assert first["observation"].shape == (2, 84, 84)
    # another conversion writes a smaller selection over it (convert --overwrite)
    [again] = convert(
        str(big["source"]), str(big["dest"]), checkpoints="0", overwrite=True, progress=False
    )
    assert again.url == url and again.transitions < 4096 + 700
    with pytest.raises(StoreChangedError) as info:
        ds[np.array([4096 + 700])]
    text = str(info.value)
    assert "\n" not in text and "changed while it was being read" in text
    assert "written again" in text and "AtariZarrDataset(" in text and "damaged" not in text


def test_a_store_being_rewritten_is_not_called_damaged(big):
    url = big["store"].url
    ds = AtariZarrDataset(url)
    ds[np.array([0])]
    # the first steps of convert --overwrite: marker down, arrays going
    group = zarr.open_group(url, mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])
    meta["complete"] = False
    group.attrs[ATTRS_KEY] = meta
    shutil.rmtree(Path(url) / "observation" / "c")
    with pytest.raises(StoreChangedError, match=r"being written again.*once it is complete"):
        ds[np.array([5000])]


# A memory limit far below what the declared sizes would take: a regression fails
# (MemoryError, a hang, or a one-line error missing) instead of exhausting the machine.
_OPEN_UNDER_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
import numpy as np
from atari_zarr import AtariZarrDataset, StoreFormatError
from atari_zarr.verify import verify_store
url = sys.argv[1]
try:
    ds = AtariZarrDataset(url)
    ds[np.array([0, 1])]
    print("opened")
except StoreFormatError as exc:
    print("refused:", exc)
report = verify_store(url)
print("verify:", report.ok, " ".join(str(p) for p in report.problems)[:300])
"""


@pytest.mark.parametrize(
    ("array", "field", "value", "what"),
    [
        ("observation", "chunk_shape", [1 << 31, 84, 84], "chunks"),
        ("action", "shape", [10**12], "rows"),
        ("next/reward", "shape", [10**15], "rows"),
    ],
)
def test_declared_sizes_beyond_the_layout_are_refused(big, array, field, value, what):
    import json
    import subprocess
    import sys

    url = big["store"].url
    meta_path = Path(url) / array / "zarr.json"
    meta = json.loads(meta_path.read_text())
    if field == "shape":
        meta["shape"] = value
    else:
        # the shard and its chunks both declared huge (valid Zarr: one divides the other)
        meta["chunk_grid"]["configuration"]["chunk_shape"] = value
        codecs = meta["codecs"]
        if codecs and codecs[0]["name"] == "sharding_indexed":
            codecs[0]["configuration"]["chunk_shape"] = value
    meta_path.write_text(json.dumps(meta))
    # the consolidated copy in the root zarr.json is what readers open
    root = json.loads((Path(url) / "zarr.json").read_text())
    root["consolidated_metadata"]["metadata"][array] = meta
    (Path(url) / "zarr.json").write_text(json.dumps(root))
    res = subprocess.run(
        [sys.executable, "-c", _OPEN_UNDER_LIMIT, url], capture_output=True, text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("refused:") and f"declares {what}" in lines[0], lines
    assert array in lines[0] and "zarr.json" in lines[0], lines
    assert lines[1].startswith("verify: False"), lines


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero", "symlink to a copy"])
def test_links_and_special_files_in_a_local_store_are_refused(big, kind):
    """Before: a FIFO in place of a shard hung every read, /dev/zero read without end."""
    import os

    url = big["store"].url
    shard = _shard_objects(url, "observation")[1]
    if kind == "fifo":
        shard.unlink()
        os.mkfifo(shard)
    elif kind == "symlink to /dev/zero":
        shard.unlink()
        shard.symlink_to("/dev/zero")
    else:  # even a link to the right bytes: the store is not what it says
        copy = shard.with_name("elsewhere")
        shard.rename(copy)
        shard.symlink_to(copy)
    ds = AtariZarrDataset(url)
    with pytest.raises(StoreFormatError) as info:
        ds[np.array([4096 + 10])]
    text = str(info.value)
    assert "\n" not in text and str(shard) in text and "regular file" in text
    assert ("symbolic link" if "symlink" in kind else "special file") in text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["zarr.json", "observation/zarr.json", "next/reward/zarr.json"])
@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_metadata_that_is_a_link_or_a_special_file_is_refused(pong_store_copy, where, kind):
    """Before: a FIFO in place of a zarr.json hung the open for ever (zarr reads it whole)."""
    import os

    from atari_zarr.info import store_info

    path = Path(pong_store_copy.url) / where
    if kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        copy = path.with_name("zarr.json.copy")
        path.rename(copy)
        path.symlink_to(copy)
    from atari_zarr.verify import verify_store

    expected = "symbolic link" if kind == "symlink" else "special file"
    for call in (lambda: AtariZarrDataset(pong_store_copy.url), lambda: store_info(pong_store_copy.url)):
        with pytest.raises(StoreFormatError, match=expected) as info:
            call()
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    report = verify_store(pong_store_copy.url)
    assert not report.ok and expected in report.format()
