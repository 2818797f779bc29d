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
    """A mixture of many stores keeps at most map_limit() descriptors in its maps in all,
    not per store (the kernel allows 65,530 maps per process): a map holds one, a file
    being mapped two."""
    monkeypatch.setattr(fetch, "_MAPS", type(fetch._MAPS)())
    monkeypatch.setattr(fetch, "_DESCRIPTORS", fetch._Descriptors())
    monkeypatch.setattr(fetch, "map_limit", lambda: 4)
    stores = [tmp_path / "a", tmp_path / "b"]
    for root in stores:
        _files(root, ["c/0/0/0", "c/1/0/0"])
    readers = [fetch.LocalBytes(root) for root in stores]
    for reader in readers:
        got = [bytes(g) for g in reader.get([("c/0/0/0", 0, 7), ("c/1/0/0", 0, 7)])]
        assert got == [b"c/0/0/0", b"c/1/0/0"]

    def kept() -> set[tuple[int, str]]:
        return set(fetch._MAPS)

    # four files read; the fourth's two descriptors fit beside two maps: three kept
    assert len(fetch._MAPS) == 3 and fetch._DESCRIPTORS.held == 3
    assert (readers[0]._id, "c/0/0/0") not in kept()  # the least recently used went
    # a map dropped is opened again when asked for
    assert bytes(readers[0].get([("c/0/0/0", 2, 5)])[0]) == b"0/0"
    readers[1].forget("c/1/0/0")
    assert (readers[1]._id, "c/1/0/0") not in kept()
    # a reader that is gone takes its maps with it, and their descriptors
    del readers, reader
    import gc

    gc.collect()
    assert len(fetch._MAPS) == 0 and fetch._DESCRIPTORS.held == 0


def test_a_map_table_follows_the_process_maps(tmp_path: Path, monkeypatch) -> None:
    """A map table answers for many objects at once, with the bytes each one holds; its
    rows are emptied when the process lets their maps go (the bound, a replaced object,
    a reader gone), so it never keeps more maps than the bound, and a row let go is
    opened again when asked for."""
    monkeypatch.setattr(fetch, "_MAPS", type(fetch._MAPS)())
    monkeypatch.setattr(fetch, "_WATCHERS", {})
    monkeypatch.setattr(fetch, "_DESCRIPTORS", fetch._Descriptors())
    monkeypatch.setattr(fetch, "map_limit", lambda: 4)
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
    # the bound counts descriptors, as the kernel does: three maps, the absent one none
    assert len(fetch._MAPS) == 4 and fetch._DESCRIPTORS.held == 3 and held() <= 3
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
    assert len(fetch._MAPS) == 0 and not fetch._WATCHERS and fetch._DESCRIPTORS.held == 0


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


_MIXTURE_UNDER_A_LOW_LIMIT = """
import os, resource, sys, threading, json
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
import numpy as np
from atari_zarr import MultiGameDataset
from atari_zarr.storage import fetch

root, names = sys.argv[1], json.loads(sys.argv[2])
# the rest of the process holds files of its own (logs, sockets, a DataLoader's pipes)
own = [os.open(os.devnull, os.O_RDONLY) for _ in range(40)]
urls = [os.path.join(root, f"s{g}.zarr") for g in range(len(names))]
mix = MultiGameDataset(urls)


def frame_of(rows):
    rows = np.asarray(rows, dtype=np.int64)
    frames = np.empty((len(rows), 84, 84), dtype=np.uint8)
    frames[:] = (rows % 251).astype(np.uint8)[:, None, None]
    frames[:, 0, :8] = rows.astype("<i8").view(np.uint8).reshape(-1, 8)
    return frames


def shard_fds():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(root)
        except OSError:  # closed meanwhile
            pass
    return count


peak = [0]
done = threading.Event()


def watch():  # the shards' descriptors while batches are read, not only between them
    while not done.wait(0.02):
        try:
            peak[0] = max(peak[0], shard_fds())
        except OSError:  # no descriptor left to list them: the main thread says so
            pass


def check(batch):
    index = batch["index"].numpy()
    store = np.searchsorted(mix.offsets, index, side="right") - 1
    row = batch["row"].numpy()
    base = np.asarray(names)[store]
    np.testing.assert_array_equal(batch["observation"].numpy(), frame_of(base + row))
    lengths = np.diff(mix.offsets)[store]
    going = ~batch["next", "done"].numpy().reshape(-1) & (row + 1 < lengths)
    nxt = batch["next", "observation"].numpy()
    np.testing.assert_array_equal(nxt[going], frame_of(base + row + 1)[going])
    after.append((shard_fds(), len(os.listdir("/proc/self/fd"))))


after = []
watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
rng = np.random.default_rng(0)
touched = set()
for _ in range(4):
    idx = rng.integers(0, len(mix), 512)
    touched |= set(np.searchsorted(mix.offsets, idx, side="right").tolist())
    check(mix[idx])
seen = []
for batch in mix.stream(512, seed=1, unit_rows=64, shuffle_buffer=1024):
    check(batch)
    seen.append(batch["index"].numpy())
done.set()
watcher.join()
assert sorted(np.concatenate(seen).tolist()) == list(range(len(mix)))
print(json.dumps({"limit": fetch.map_limit(), "touched": len(touched), "peak": peak[0],
                  "shards": max(a for a, _ in after), "fds": max(b for _, b in after)}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux /proc")
def test_a_mixture_of_100_stores_reads_exactly_under_ulimit_128(tmp_path: Path) -> None:
    """``ulimit -n 128``, 40 files the rest of the process holds, 100 small stores (about
    700 shard files) read at random in batches of 512 and by the stream: every
    frame exact, no OSError, and the descriptors the shards' maps hold stay within
    ``map_limit()``, while a batch is read too, whatever holds the maps (a batch's
    decoding, slices handed out)."""
    import json
    import shutil
    import subprocess
    import sys

    from tests.read.test_stream import write_store

    # six stores of their own frames, copied: the maps a batch holds while it is read
    # (one a shard of most stores) are far more than map_limit() (64 here)
    kinds, name, stores = 6, 10_000, 100
    for k in range(kinds):
        write_store(str(tmp_path / f"s{k}.zarr"), 23 + 7 * k, seed=k, max_len=9, name=k * name)
    names = [g % kinds * name for g in range(stores)]
    for g in range(kinds, stores):
        shutil.copytree(tmp_path / f"s{g % kinds}.zarr", tmp_path / f"s{g}.zarr")
    out = subprocess.run(
        [sys.executable, "-c", _MIXTURE_UNDER_A_LOW_LIMIT, str(tmp_path), json.dumps(names)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["limit"] == 64 and got["touched"] > 80  # a batch touches most stores
    assert got["peak"] <= got["limit"] and got["shards"] <= got["limit"]
    assert got["fds"] < 128


_NO_DESCRIPTOR_LEFT = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
from atari_zarr.errors import TooManyOpenFilesError
from atari_zarr.storage import fetch

reader = fetch.LocalBytes(sys.argv[1])
for i in range(20):  # twenty maps kept
    assert bytes(reader.get([(f"{i:04d}", 0, 4)])[0]) == f"{i:04d}".encode()
own = []
while True:  # the rest of the process takes every descriptor left
    try:
        own.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
# the kernel says EMFILE: the maps let theirs go, and the open is tried once more
held = reader.get([("0100", 0, 4)])[0]  # a slice handed out holds its map
assert bytes(held) == b"0100"
while True:
    try:
        own.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
try:  # nothing left to let go
    reader.get([("0101", 0, 4)])
except TooManyOpenFilesError as exc:
    print(exc)
"""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux /proc")
def test_a_process_out_of_descriptors_lets_maps_go_then_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    """Where the rest of the process took the descriptors the maps leave it, the kernel's
    EMFILE lets the maps go and the open is tried once more; where nothing is left to
    let go, one line names the file, the limit and ``ulimit -n``."""
    import subprocess
    import sys

    _files(tmp_path, [f"{i:04d}" for i in range(120)])
    out = subprocess.run(
        [sys.executable, "-c", _NO_DESCRIPTOR_LEFT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    [line] = out.stdout.strip().splitlines()
    assert line.startswith(f"{tmp_path / '0101'}: cannot be opened")
    assert "its limit of 128 open files" in line and "ulimit -n" in line
