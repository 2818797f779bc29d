"""Where the chunks of many arrays lie, on one axis: located together, grown safely."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from atari_zarr.errors import StoreCorruptError
from atari_zarr.read.chunks import ChunkReader, read_rows_of
from atari_zarr.read.options import ReadOptions
from atari_zarr.shard_format import crc_bytes
from atari_zarr.storage.chunk_tables import ChunkTables
from atari_zarr.storage.engine import ChunkEngine
from atari_zarr.storage.fetch import LocalBytes

from ..read.test_chunks import _array, _frames


def _bytes_at(addr: int, n: int) -> bytes:
    return bytes(np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * n).from_address(addr)))


def _stores(tmp_path, k: int, rows: int = 256) -> list[zarr.Array]:
    out = []
    for i in range(k):
        a = _array(zarr.storage.LocalStore(tmp_path / f"{i}.zarr"), rows, chunk=8, shard=64)
        a[:] = _frames(rows, seed=i)[:, :6, :5]
        out.append(a)
    return out


def test_the_chunks_of_several_arrays_are_located_at_once_where_fetch_finds_them(tmp_path):
    """Engines sharing tables take consecutive rows; one locate of chunks of all of them
    gives the bytes each engine's careful fetch gives."""
    tables = ChunkTables()
    engines = [
        ChunkEngine(a, where=f"{i}", tables=tables) for i, a in enumerate(_stores(tmp_path, 3))
    ]
    joined = [e.rows() for e in engines]
    assert all(j[0] is tables for j in joined)
    assert [j[1].chunk_base for j in joined] == [0, 32, 64]
    assert [j[1].shard_base for j in joined] == [0, 4, 8]
    rng = np.random.default_rng(0)
    which, cids = rng.integers(0, 3, 40), rng.integers(0, 32, 40)
    for k, e in enumerate(engines):
        e.learn(np.unique(cids[which == k] // 8))
    chunk_rows = np.array([joined[k][1].chunk_base for k in which]) + cids
    shard_rows = np.array([joined[k][1].shard_base for k in which]) + cids // 8
    located = tables.locate(chunk_rows, shard_rows)
    for k, c, addr, n in zip(which, cids, located.src, located.srclen, strict=True):
        [chunk] = engines[k].fetch([int(c)])
        assert addr != 0 and _bytes_at(int(addr), int(n)) == bytes(chunk.data)


def test_growing_keeps_what_was_learned(tmp_path):
    """Arrays joining one by one grow the tables: the shards learned before stay learned
    with their entries, and an array that joins later reads its real bytes."""
    arrays = _stores(tmp_path, 6, rows=128)
    tables = ChunkTables()
    first = ChunkEngine(arrays[0], where="0", tables=tables)
    want = first.locate(np.arange(16)).src.tolist()  # both its shards learned
    before = tables.entries
    others = [ChunkEngine(a, where=f"{i}", tables=tables) for i, a in enumerate(arrays[1:], 1)]
    for e in others:
        e.rows()  # each joins: the tables grow (to twice their size at least)
    assert not np.shares_memory(before, tables.entries) and len(tables.entries) >= 6 * 16
    assert tables.known[:2].all() and not tables.known[2:].any()
    assert first.locate(np.arange(16)).src.tolist() == want
    e = others[-1]
    located = e.locate(np.arange(16))
    for c, addr, n in zip(range(16), located.src, located.srclen, strict=True):
        [chunk] = e.fetch([c])
        assert _bytes_at(int(addr), int(n)) == bytes(chunk.data)


def test_a_shard_learned_into_rows_of_before_a_growth_is_not_learned(tmp_path):
    """A shard learned into rows taken before the tables grew reads as not learned in the
    grown tables (address 0: learned again), never as learned with rows it lacks."""
    (tmp_path / "s0").write_bytes(b"..chunk0chunk1")
    source = LocalBytes(tmp_path)
    tables = ChunkTables()
    assert tables.join(source, lambda s: f"s{s}", chunks_per_shard=2, n_shards=1)[:2] == (0, 0)
    entries, known = tables.views(0, 0, chunks_per_shard=2, n_shards=1)
    tables.join(source, lambda s: f"t{s}", chunks_per_shard=2, n_shards=1)  # grows
    entries[:] = [[2, 6], [8, 6]]
    known[0] = True  # learned, in the rows of before
    assert not tables.known[0]
    assert tables.locate(np.array([0, 1]), np.array([0, 0])).src.tolist() == [0, 0]
    entries, known = tables.views(0, 0, chunks_per_shard=2, n_shards=1)  # learned again
    entries[:] = [[2, 6], [8, 6]]
    known[0] = True
    loc = tables.locate(np.array([1]), np.array([0]))
    assert _bytes_at(int(loc.src[0]), int(loc.srclen[0])) == b"chunk1"


def test_a_mixture_batch_locates_every_store_with_one_call(tmp_path, monkeypatch):
    """read_rows_of over 12 stores of one budget: their chunks are located by one call
    of the shared tables, no engine locating its own, and the rows are right."""
    opts = ReadOptions(frame_cache_bytes=1 << 16).divided(12)
    arrays = _stores(tmp_path, 12)
    readers = [ChunkReader(a, where=f"{i}", options=opts) for i, a in enumerate(arrays)]
    tables = opts.budget.tables()
    calls = []
    real = ChunkTables.locate

    def counted(self, *args):
        calls.append(self)
        return real(self, *args)

    def alone(self, cids):
        raise AssertionError("an engine located its own chunks")

    monkeypatch.setattr(ChunkTables, "locate", counted)
    monkeypatch.setattr(ChunkEngine, "locate", alone)
    rng = np.random.default_rng(1)
    which, rows = rng.integers(0, 12, 300), rng.integers(0, 256, 300)
    want = np.stack([arrays[w][int(r)] for w, r in zip(which, rows, strict=True)])
    out = np.empty_like(want)
    read_rows_of(readers, which, rows, out)
    np.testing.assert_array_equal(out, want)
    assert calls and all(t is tables for t in calls)
    assert len(calls) <= 2  # one a batch (a batch wider than half the cache is one too)
    # each store's chunks counted as its own (one batch, the cache empty before it)
    for k, r in enumerate(readers):
        assert r.stats["decoded"] == len(np.unique(rows[which == k] // 8)), k


def _craft_index(path, entries: np.ndarray) -> None:
    """Write ``entries`` as the shard index at the start of ``path``, with a valid crc32c
    (in place: the object keeps its size, so no map of it is cut short)."""
    raw = np.ascontiguousarray(entries, dtype="<u8").tobytes()
    with open(path, "r+b") as f:
        f.write(raw + crc_bytes(raw))


def test_an_entry_that_wraps_around_past_2_64_is_not_located(tmp_path):
    """``(2**64 - 50, 60)`` with a valid index crc32c: ``off + size`` wraps around to 10 in
    uint64, which fits any shard; it must get no address (the compiled loop would read
    before the map), and the careful way names the object."""
    [a] = _stores(tmp_path, 1)
    path = tmp_path / "0.zarr" / "c" / "1" / "0" / "0"
    engine = ChunkEngine(a, where="0")
    entries = engine.indexes([1])[1].copy()
    for off in (50, 1 << 40):
        entries[3] = [2**64 - off, off + 10]
        _craft_index(path, entries)
        engine = ChunkEngine(a, where="0")
        located = engine.locate(np.arange(8, 16))  # array steps (more than a few chunks)
        assert located.src[3] == 0 and located.srclen[3] == 0
        assert (located.src[[0, 1, 2, 4, 5, 6, 7]] != 0).all()
        with pytest.raises(StoreCorruptError, match=r"chunk 11 .*'c/1/0/0'.* is cut short"):
            ChunkReader(a, where="0", cache_bytes=0).read(np.arange(64, 128, 3))


# A shard index filled with crafted entries (each with a valid crc32c), read by every
# path of the engine, in a process of its own: a crash is a return code here, not a dead
# test worker. One result line per read, flushed, so the last one shows where it died.
_FUZZ_READS = r"""
import hashlib, json, os, sys
import numpy as np, zarr
from atari_zarr.errors import StoreCorruptError
from atari_zarr.read.chunks import ChunkReader
from atari_zarr.shard_format import crc_bytes
import atari_zarr.read.chunks as chunks

root, cases, mode = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
if mode == "pure":  # no compiled loop: chunks decode one call each
    chunks.chunk_loop = lambda: None
path = os.path.join(root, "c", "1", "0", "0")


def unit(lo, hi, halo):
    def read(r):
        out = np.empty((hi - lo, 6, 5), np.uint8)
        return np.concatenate([out, r.read_unit(lo, hi, out, np.array(halo))])
    return read


reads = {
    "scattered": lambda r: r.read(np.r_[np.arange(0, 256, 3)[::-1], [70, 66]]),
    "few": lambda r: r.read(np.array([90, 75])),
    "range": lambda r: r.read(np.arange(64, 128)),
    "unit": unit(64, 128, [63, 128]),
    "part": unit(72, 120, [71, 121]),
}
for i, entries in enumerate(cases):
    raw = np.array([int(x) for x in entries], dtype="<u8").tobytes()
    with open(path, "r+b") as f:
        f.write(raw + crc_bytes(raw))
    array = zarr.open_array(zarr.storage.LocalStore(root, read_only=True), mode="r")
    for name, read in reads.items():
        reader = ChunkReader(array, where=root, cache_bytes=0, threads=2)
        try:
            got = read(reader)
            out = {"data": hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()}
        except StoreCorruptError as exc:
            out = {"error": str(exc)}
        except Exception as exc:
            out = {"other": f"{type(exc).__name__}: {exc}"}
        finally:
            reader.close()
        print(json.dumps({"case": i, "read": name, **out}), flush=True)
"""

_READ_ROWS = {  # the rows each read of _FUZZ_READS gives, in order
    "scattered": np.r_[np.arange(0, 256, 3)[::-1], [70, 66]],
    "few": np.array([90, 75]),
    "range": np.arange(64, 128),
    "unit": np.r_[np.arange(64, 128), [63, 128]],
    "part": np.r_[np.arange(72, 120), [71, 121]],
}


def _crafted_entry(rng: np.random.Generator, good: np.ndarray, shard_bytes: int) -> list[int]:
    """One index entry a hostile writer might craft, of many kinds."""
    top = 2**64
    near = int(2 ** rng.uniform(0, 48))  # how far below 2**64
    off, size = (int(x) for x in good[rng.integers(len(good))])
    kind = rng.integers(10)
    return [
        [top - near, near + int(rng.integers(1, 200))],  # wraps around to a small end
        [top - near, int(rng.integers(0, top, dtype=np.uint64))],
        [top - 1, top - 1],  # Zarr's marker of an absent chunk
        [top - 1, size],  # half the marker
        [off, top - 1],
        [off, shard_bytes - off + int(rng.integers(1, 100))],  # past the end of the shard
        [off, 0],
        [shard_bytes, 0],
        [int(rng.integers(0, shard_bytes)), int(rng.integers(0, shard_bytes))],
        [int(rng.integers(0, top, dtype=np.uint64)), int(rng.integers(0, top, dtype=np.uint64))],
    ][kind]


@pytest.mark.slow
def test_a_crafted_shard_index_never_crashes_and_reads_right_or_names_the_object(tmp_path):
    """Seeded fuzzing of a real shard's index (a valid crc32c each time): offsets and
    lengths near 2**64, absent markers whole and half, entries past the shard, lengths 0,
    random ones. Read by every path (scattered rows, a few, a range, a stream's unit,
    part of one), with the compiled loop and without, each in a process of its own: the
    process never crashes, and each read gives the right rows (an absent chunk: the fill
    value) or one line, a ``StoreCorruptError`` naming the shard's object."""
    import hashlib
    import json
    import subprocess
    import sys

    [a] = _stores(tmp_path, 1)
    data = a[:]
    path = tmp_path / "0.zarr" / "c" / "1" / "0" / "0"
    shard_bytes = path.stat().st_size
    good = ChunkEngine(a, where="0").indexes([1])[1].copy()
    rng = np.random.default_rng(73)
    cases, expected = [], []
    for _ in range(120):
        entries = good.astype(object).tolist()
        for k in rng.choice(8, size=int(rng.integers(1, 4)), replace=False).tolist():
            entries[k] = _crafted_entry(rng, good, shard_bytes)
        cases.append([str(x) for pair in entries for x in pair])
        absent = [k for k in range(8) if entries[k] == [2**64 - 1] * 2]
        crafted = [k for k in range(8) if entries[k] != good[k].tolist() and k not in absent]
        want = data.copy()
        for k in absent:
            want[64 + 8 * k : 72 + 8 * k] = 0  # a chunk never written: the fill value
        row = {}
        for name, rows in _READ_ROWS.items():
            chunks_read = {int(r) // 8 - 8 for r in rows if 64 <= r < 128}
            if chunks_read & set(crafted):
                row[name] = None  # damage: named
            else:
                row[name] = hashlib.sha256(np.ascontiguousarray(want[rows]).tobytes()).hexdigest()
        expected.append(row)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    outcomes = {}
    for mode in ("compiled", "pure"):
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                _FUZZ_READS,
                str(tmp_path / "0.zarr"),
                str(tmp_path / "cases.json"),
                mode,
            ],
            capture_output=True,
            text=True,
            timeout=600,  # a hang guard only
            check=False,
        )
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        last = lines[-1] if lines else None
        assert proc.returncode == 0, (mode, proc.returncode, last, proc.stderr[-2000:])
        assert len(lines) == len(cases) * len(_READ_ROWS)
        for got in lines:
            want = expected[got["case"]][got["read"]]
            entries = cases[got["case"]]
            assert "other" not in got, (mode, entries, got)
            if want is None:
                message = got.get("error", "")
                assert "'c/1/0/0'" in message and "\n" not in message, (mode, entries, got)
            else:
                assert got.get("data") == want, (mode, entries, got)
            outcomes[mode, got["case"], got["read"]] = "data" if "data" in got else "error"
    # both paths agree on every read
    assert all(v == outcomes["pure", c, r] for (m, c, r), v in outcomes.items() if m == "compiled")
