"""Where the engine's bytes come from: memory maps of local stores, bounded per process."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from atari_zarr.errors import StoreFormatError
from atari_zarr.storage import fetch


def _files(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() * 4)


def test_the_maps_of_every_store_share_one_bound(tmp_path: Path, monkeypatch) -> None:
    """A mixture of many stores keeps at most map_limit() maps in all, not per store (the
    kernel allows 65,530 maps per process)."""
    monkeypatch.setattr(fetch, "_MAPS", type(fetch._MAPS)())
    monkeypatch.setattr(fetch, "map_limit", lambda: 3)
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


def test_a_map_table_follows_the_process_maps(tmp_path: Path, monkeypatch) -> None:
    """A map table answers for many objects at once, with the bytes each one holds; its
    rows are emptied when the process lets their maps go (the bound, a replaced object,
    a reader gone), so it never keeps more maps than the bound, and a row let go is
    opened again when asked for."""
    monkeypatch.setattr(fetch, "_MAPS", type(fetch._MAPS)())
    monkeypatch.setattr(fetch, "_WATCHERS", {})
    monkeypatch.setattr(fetch, "map_limit", lambda: 3)
    names = [f"c/{i}/0/0" for i in range(5)]
    _files(tmp_path, names[:4])  # the fifth object is absent
    reader = fetch.LocalBytes(tmp_path)
    table = fetch.MapTable()
    assert table.add(reader, lambda i: f"c/{i}/0/0", 5) == 0

    def held() -> int:
        return int(sum(m is not None for m in table._maps))

    def read(numbers: list[int]) -> list[bytes | None]:
        maps, addrs, sizes = table.at(np.array(numbers))
        out = []
        for mm, addr, size in zip(maps, addrs.tolist(), sizes.tolist(), strict=True):
            if addr == 0:
                out.append(None)
                continue
            # the address is the map's first byte, and the size its length
            view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * size).from_address(addr))
            assert bytes(view) == bytes(mm)
            out.append(bytes(view))
        return out

    assert read([0, 1, 4]) == [n.encode() * 4 for n in names[:2]] + [None]
    assert held() == 2 and len(fetch._MAPS) == 3  # the absent one is remembered too
    assert read([2, 3]) == [n.encode() * 4 for n in names[2:4]]
    assert len(fetch._MAPS) == 3 and held() <= 3  # the bound, table included
    assert not table.known[0] and table.addr[0] == 0  # the first let go ...
    assert read([0]) == [names[0].encode() * 4]  # ... and opened again
    reader.forget("c/0/0/0")
    assert not table.known[0] and table._maps[0] is None
    # a map let go between opening and answering reads as 0, for the caller to go
    # another way (here: the bound of one map, two asked for)
    monkeypatch.setattr(fetch, "map_limit", lambda: 1)
    maps, addrs, _ = table.at(np.array([1, 2]))
    assert (addrs == 0).sum() >= 1 and held() <= 1
    del reader, maps
    table = None  # type: ignore[assignment]  # let it go (held() refers to it)
    import gc

    gc.collect()
    assert len(fetch._MAPS) == 0 and not fetch._WATCHERS


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


_FEW_FILES = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from atari_zarr.storage import fetch

reader = fetch.LocalBytes(sys.argv[1])
names = sorted(os.listdir(sys.argv[1]))
for name in names:  # every file read through its map, the slice dropped
    assert bytes(reader.get([(name, 0, 4)])[0]) == name.encode()
open_fds = len(os.listdir("/proc/self/fd"))
print(len(names), fetch.map_limit(), len(fetch._MAPS), open_fds)
"""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux /proc")
def test_maps_never_exhaust_a_low_limit_of_open_files(tmp_path: Path) -> None:
    """Under ``ulimit -n 256``, 600 files read through maps: the limit less a quarter of
    it stays mapped (each map holds a descriptor on Python 3.11), and nothing runs out."""
    import subprocess
    import sys

    _files(tmp_path, [f"{i:04d}" for i in range(600)])
    out = subprocess.run(
        [sys.executable, "-c", _FEW_FILES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    files, limit, maps, open_fds = (int(x) for x in out.stdout.split())
    assert (files, limit) == (600, 192) and maps <= limit
    assert limit <= open_fds < 256  # the maps' descriptors and the interpreter's own
