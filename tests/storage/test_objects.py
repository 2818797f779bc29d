"""The local cache of whole objects: each object fetched once, complete or absent,
bounded by evicting the least recently used, and reads going on where it cannot write."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import MemoryStore

from atari_zarr.storage.objects import ObjectCacheStore, evict, parse_size


def _remote(n: int = 40) -> tuple[MemoryStore, np.ndarray]:
    store = MemoryStore()
    data = np.arange(n * 100, dtype="int32").reshape(n, 100)
    zarr.create_array(store, shape=data.shape, chunks=(4, 100), dtype="int32")[:] = data
    return store, data


def _cached(store: MemoryStore, root: Path, fetched: list[str]) -> ObjectCacheStore:
    from zarr.core.buffer import default_buffer_prototype

    async def fetch(key: str) -> bytes | None:
        fetched.append(key)
        await asyncio.sleep(0.01)  # concurrent readers meet while it is under way
        found = await store.get(key, default_buffer_prototype())
        return None if found is None else found.to_bytes()

    async def folder() -> str:
        return "host/datasets/org/x/0123abcd"

    return ObjectCacheStore(store.with_read_only(True), fetch, folder, "memory://x", root)


def test_each_object_is_fetched_once_and_ranges_come_from_disk(tmp_path: Path) -> None:
    remote, data = _remote()
    fetched: list[str] = []
    cached = _cached(remote, tmp_path, fetched)
    array = zarr.open_array(cached, mode="r", zarr_format=3)
    np.testing.assert_array_equal(array[:], data)
    np.testing.assert_array_equal(array[3:17], data[3:17])  # again: from disk
    assert sorted(fetched) == sorted(set(fetched)), "an object was fetched twice"
    assert len(fetched) == 10 + 1  # ten chunks and zarr.json
    kept = tmp_path / "host/datasets/org/x/0123abcd"
    assert (kept / "zarr.json").is_file() and len(list((kept / "c").iterdir())) == 10
    assert not list(tmp_path.rglob(".part-*"))


def test_an_absent_object_is_none_and_not_kept(tmp_path: Path) -> None:
    from zarr.core.buffer import default_buffer_prototype

    remote, _ = _remote()
    cached = _cached(remote, tmp_path, [])
    assert asyncio.run(cached.get("c/99/0", default_buffer_prototype())) is None
    assert asyncio.run(cached.exists("c/99/0")) is False
    assert not [p for p in tmp_path.rglob("99/*") if not p.name.endswith(".lock")]


def test_the_bound_evicts_the_least_recently_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote, data = _remote(400)
    monkeypatch.setenv("ATARI_ZARR_OBJECT_CACHE_SIZE", "6K")
    cached = _cached(remote, tmp_path, fetched := [])
    assert cached.bound == 6 * 1024
    array = zarr.open_array(cached, mode="r", zarr_format=3)
    for lo in range(0, 400, 40):
        np.testing.assert_array_equal(array[lo : lo + 40], data[lo : lo + 40])
    sizes = [p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and ".lock" not in p.name]
    # one pass runs per twentieth of the bound added: the total stays near the bound
    assert sum(sizes) <= 6 * 1024 + max(sizes)
    assert len(fetched) > 100  # the chunks evicted and fetched again
    # what was used last is what is kept
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(b"x" * 800)
    new.write_bytes(b"y" * 800)
    past = time.time() - 100
    os.utime(old, (past, past))
    assert evict(tmp_path, 1000) <= 900
    assert new.exists() and not old.exists()


def test_what_a_killed_download_left_is_never_read_and_is_swept(tmp_path: Path) -> None:
    remote, data = _remote()
    folder = tmp_path / "host/datasets/org/x/0123abcd/c/0"
    folder.mkdir(parents=True)
    stale = folder / ".part-abc"
    stale.write_bytes(b"half an object")
    past = time.time() - 7200
    os.utime(stale, (past, past))
    cached = _cached(remote, tmp_path, [])
    np.testing.assert_array_equal(zarr.open_array(cached, mode="r", zarr_format=3)[:], data)
    evict(tmp_path, 1 << 30)
    assert not stale.exists()


def test_an_unwritable_cache_reads_on_with_one_warning(tmp_path: Path) -> None:
    remote, data = _remote()
    root = tmp_path / "not-a-directory"
    root.write_bytes(b"")  # nothing can be made under it, whoever the user is
    cached = _cached(remote, root, fetched := [])
    with pytest.warns(RuntimeWarning, match="cannot be written") as caught:
        got = zarr.open_array(cached, mode="r", zarr_format=3)[:]
    np.testing.assert_array_equal(got, data)
    assert len(caught) == 1 and not cached.writable
    assert fetched  # read from the remote all the same


def test_sizes_are_read_as_people_write_them() -> None:
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("20GiB") == 20 << 30
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="ATARI_ZARR_OBJECT_CACHE_SIZE"):
        parse_size("lots")


def test_a_key_out_of_the_store_is_refused(tmp_path: Path) -> None:
    from zarr.core.buffer import default_buffer_prototype

    remote, _ = _remote()
    cached = _cached(remote, tmp_path / "cache", fetched := [])
    for key in ("../../outside", "/etc/passwd", "c//0"):
        with pytest.raises(OSError, match="not an object's key"):
            asyncio.run(cached.get(key, default_buffer_prototype()))
    assert not fetched and not (tmp_path / "outside").exists()


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-5G", "-1", "1e400", "G", ""])
def test_a_size_that_is_no_size_is_one_line_naming_the_variable(text: str) -> None:
    from atari_zarr.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as err:
        parse_size(text)
    message = str(err.value)
    assert message.startswith(f"ATARI_ZARR_OBJECT_CACHE_SIZE={text!r}") and "\n" not in message
    assert "0 turns the cache off" in message and "e.g. 20G" in message


def test_a_bound_below_one_object_reads_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objects larger than the bound are read and served, never kept (nor evicted as fast
    as they are fetched); those that fit are kept."""
    remote, data = _remote(40)
    for bound in ("100", "1K"):
        monkeypatch.setenv("ATARI_ZARR_OBJECT_CACHE_SIZE", bound)
        root = tmp_path / bound
        cached = _cached(remote, root, [])
        np.testing.assert_array_equal(zarr.open_array(cached, mode="r", zarr_format=3)[:], data)
        kept = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]
        assert sum(p.stat().st_size for p in kept if not p.name.endswith(".lock")) <= 1024


def test_a_kept_copy_that_fails_its_check_is_thrown_away_or_named(tmp_path: Path) -> None:
    """``discard``: the kept copy goes and the next read fetches it again; one that cannot
    be removed is named in one line, the store never called damaged for it."""
    from atari_zarr.errors import StoreWriteError

    remote, data = _remote()
    cached = _cached(remote, tmp_path, fetched := [])
    array = zarr.open_array(cached, mode="r", zarr_format=3)
    np.testing.assert_array_equal(array[:], data)
    kept = tmp_path / "host/datasets/org/x/0123abcd/c/0/0"
    assert "the Hub's copy is damaged" in cached.discard("c/0/0") and not kept.exists()
    np.testing.assert_array_equal(array[0:4], data[0:4])
    assert fetched.count("c/0/0") == 2 and kept.is_file()
    kept.unlink()
    kept.mkdir()  # what cannot be unlinked, whoever the user is
    with pytest.raises(StoreWriteError) as err:
        cached.discard("c/0/0")
    assert str(kept) in str(err.value) and "damaged" not in str(err.value)
