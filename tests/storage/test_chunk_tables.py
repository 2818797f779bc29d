"""Where the chunks of many arrays lie, on one axis: located together, grown safely."""

from __future__ import annotations

import numpy as np
import zarr

from atari_zarr.read.chunks import ChunkReader, read_rows_of
from atari_zarr.read.options import ReadOptions
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
