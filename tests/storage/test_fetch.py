"""Where the engine's bytes come from: memory maps of local stores, bounded per process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atari_zarr.errors import StoreFormatError
from atari_zarr.storage import fetch


def _files(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() * 4)


def test_the_maps_of_every_store_share_one_bound(tmp_path: Path, monkeypatch) -> None:
    """A mixture of many stores keeps at most MAX_MAPS maps in all, not per store (the
    kernel allows 65,530 maps per process)."""
    monkeypatch.setattr(fetch, "_MAPS", type(fetch._MAPS)())
    monkeypatch.setattr(fetch, "MAX_MAPS", 3)
    stores = [tmp_path / "a", tmp_path / "b"]
    for root in stores:
        _files(root, ["c/0/0/0", "c/1/0/0"])
    readers = [fetch.LocalBytes(root) for root in stores]
    for reader in readers:
        got = reader.get([("c/0/0/0", 0, 7), ("c/1/0/0", 0, 7)])
        assert [bytes(g) for g in got] == [b"c/0/0/0", b"c/1/0/0"]
    def kept() -> set[str]:
        return {name for _, name in fetch._MAPS}

    assert len(fetch._MAPS) == 3  # four files read, three kept
    assert str(stores[0] / "c/0/0/0") not in kept()  # the least recently used went
    # a map dropped is opened again when asked for
    assert bytes(readers[0].get([("c/0/0/0", 2, 5)])[0]) == b"0/0"
    readers[1].forget("c/1/0/0")
    assert str(stores[1] / "c/1/0/0") not in kept()
    # a reader that is gone takes its maps with it
    del readers, reader
    import gc

    gc.collect()
    assert len(fetch._MAPS) == 0


def test_a_reader_opened_after_a_store_was_written_again_reads_the_new_files(
    tmp_path: Path,
) -> None:
    """Maps are kept per reader: the map of a replaced file (which stays valid, on the
    old inode) is never served to a reader of the new one."""
    _files(tmp_path, ["c/0/0/0"])
    old = fetch.LocalBytes(tmp_path)
    assert bytes(old.get([("c/0/0/0", 0, 4)])[0]) == b"c/0/"
    (tmp_path / "c/0/0/0").unlink()
    (tmp_path / "c/0/0/0").write_bytes(b"new bytes")
    new = fetch.LocalBytes(tmp_path)
    assert bytes(new.get([("c/0/0/0", 0, 4)])[0]) == b"new "


def test_a_missing_file_is_none_and_a_link_is_refused(tmp_path: Path) -> None:
    _files(tmp_path, ["c/0/0/0"])
    os.symlink(tmp_path / "c/0/0/0", tmp_path / "c/0/0/1")
    reader = fetch.LocalBytes(tmp_path)
    assert reader.get([("c/9/0/0", 0, 4)]) == [None]
    with pytest.raises(StoreFormatError, match="symbolic link"):
        reader.get([("c/0/0/1", 0, 4)])
