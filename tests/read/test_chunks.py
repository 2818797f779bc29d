"""The fast read path returns exactly what zarr-python returns, or fails loudly."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from atari_zarr_testkit import fixture_frame
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec

from atari_zarr import AtariZarrDataset
from atari_zarr.errors import StoreCorruptError
from atari_zarr.layout import (
    ARRAYS,
    EPISODE,
    OBSERVATION,
    TERMINATED,
    TRUNCATED,
    create_store,
)
from atari_zarr.read import chunk_cache
from atari_zarr.read.budget import Budget
from atari_zarr.read.chunks import ChunkReader, ReaderSet, read_rows_of
from atari_zarr.read.options import ReadOptions

FRAME_CODECS = ARRAYS[OBSERVATION].compressors()


def _frames(n: int, seed: int = 0) -> np.ndarray:
    """Compressible but row-distinct frames (like fixture frames, plus noise)."""
    rng = np.random.default_rng(seed)
    out = np.stack([fixture_frame(i) for i in range(n)])
    out[:, 40:44, 40:44] = rng.integers(0, 256, size=(n, 4, 4), dtype=np.uint8)
    return out


def _array(store, n, *, chunk=8, shard=64, row=(6, 5), index_location="start", compressors=None):
    kwargs = {}
    if shard:
        kwargs["shards"] = {"shape": (shard, *row), "index_location": index_location}
    return zarr.create_array(
        store,
        shape=(n, *row),
        chunks=(chunk, *row),
        dtype="uint8",
        compressors=compressors or FRAME_CODECS,
        fill_value=0,
        **kwargs,
    )


def _check_rows(reader, array, rows):
    rows = np.asarray(rows, dtype=np.int64)
    expect = array.oindex[np.unique(rows)][np.unique(rows, return_inverse=True)[1]]
    np.testing.assert_array_equal(reader.read(rows), expect)


def _row_sets(n, chunk, shard):
    rng = np.random.default_rng(1)
    edges = sorted(
        {0, n - 1, chunk - 1, chunk, shard - 1, shard, n - shard % n - 1} & set(range(n))
    )
    return [
        rng.integers(0, n, 300),  # random
        np.array([5, 5, 5, 0, n - 1, 5, n - 1]),  # duplicates, out of order
        np.array(edges),  # chunk and shard boundaries
        np.arange(n),  # everything, in order: whole chunks decode straight into the output
        np.arange(3, n - 2),  # a range with partial chunks at both ends
        np.arange(n)[::-1],  # reversed
        np.array([n - 1]),
        np.array([], dtype=np.int64),
    ]


@pytest.mark.parametrize("index_location", ["start", "end"])
def test_sharded_local_matches_zarr(tmp_path, index_location):
    n, chunk, shard = 64 * 3 + 21, 8, 64  # three full shards and a partial last one
    a = _array(zarr.storage.LocalStore(tmp_path / "a.zarr"), n, index_location=index_location)
    data = np.random.default_rng(0).integers(0, 4, size=a.shape, dtype=np.uint8)
    a[:] = data
    reader = ChunkReader(a, where=str(tmp_path), threads=2)
    assert reader.fast
    for rows in _row_sets(n, chunk, shard):
        _check_rows(reader, a, rows)
    np.testing.assert_array_equal(reader.read(np.arange(n)), data)


def test_layout_store_through_memory_store_and_threads():
    """The real frame layout (16-frame chunks, 4096-frame shards) through a non-local store."""
    n = 4096 + 37
    group = create_store(zarr.storage.MemoryStore(), n, {})
    obs = group[OBSERVATION]
    frames = _frames(n)
    obs[:] = frames
    reader = ChunkReader(obs, where="memory://x", threads=2, cache_bytes=0)
    assert reader.fast
    rows = np.random.default_rng(2).integers(0, n, 512)  # > _SPLIT_MIN_CHUNKS: split over threads
    np.testing.assert_array_equal(reader.read(rows), frames[rows])
    np.testing.assert_array_equal(
        reader.read([n - 1, 4095, 4096, 0]), frames[[n - 1, 4095, 4096, 0]]
    )
    assert reader.stats["hits"] == 0  # cache disabled


def test_unsharded_and_missing_chunks(tmp_path):
    n = 100
    a = _array(zarr.storage.LocalStore(tmp_path / "u.zarr"), n, shard=None)
    data = np.random.default_rng(0).integers(1, 9, size=a.shape, dtype=np.uint8)
    data[16:32] = 0  # an all-fill chunk: zarr does not write it
    a[:] = data
    assert not (tmp_path / "u.zarr" / "c" / "2" / "0" / "0").exists()
    reader = ChunkReader(a, where="u")
    assert reader.fast
    for rows in _row_sets(n, 8, 8):
        _check_rows(reader, a, rows)


def test_missing_inner_chunks_and_missing_shard(tmp_path):
    n = 64 * 4
    a = _array(zarr.storage.LocalStore(tmp_path / "m.zarr"), n)
    data = np.random.default_rng(0).integers(1, 9, size=a.shape, dtype=np.uint8)
    data[8:24] = 0  # two inner chunks absent from shard 0's index
    data[128:192] = 0  # shard 2 absent entirely
    a[:] = data
    assert not (tmp_path / "m.zarr" / "c" / "2" / "0" / "0").exists()
    reader = ChunkReader(a, where="m")
    np.testing.assert_array_equal(reader.read(np.arange(n)), data)
    rows = np.array([9, 130, 200, 8, 191, 23, 24])
    np.testing.assert_array_equal(reader.read(rows), data[rows])


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_the_loop_copies_out_are_the_rows_read_the_old_way(tmp_path, monkeypatch, threads):
    """Rows of chunks not kept in the cache, copied out as each chunk decodes: the
    same as decoding whole chunks into the scratch buffer and gathering from it (the
    way before), with absent chunks (read the careful way, then gathered) and chunks
    the cache holds among them."""
    from atari_zarr.storage import chunk_loop as loop_module

    n = 64 * 4
    a = _array(zarr.storage.LocalStore(tmp_path / "p.zarr"), n)
    data = _frames(n)[:, :6, :5].copy()
    data[8:24] = 0  # two inner chunks absent from shard 0's index
    data[128:192] = 0  # shard 2 absent entirely
    a[:] = data
    # a loop of this test's own (the process's may serve other readers' threads)
    loop = loop_module.ChunkLoop(
        loop_module.built_library(),
        loop_module.libblosc2(),
        loop_module._crc32c_value(),
    )
    monkeypatch.setattr("atari_zarr.read.chunks.chunk_loop", lambda: loop)
    copied = []
    real = loop.run_rows

    def run_rows(src, srclen, destsize, copies, **kw):
        copied.append(int(copies.count.sum()))
        return real(src, srclen, destsize, copies, **kw)

    loop.run_rows = run_rows  # type: ignore[method-assign]
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, n, 300), np.array([9, 130, 200, 8, 191, 23, 24, 0, 0, 255])]
    reader = ChunkReader(a, where="p", cache_bytes=4 * 8 * 6 * 5, threads=threads)
    reader.read(np.array([9, 0, 12, 3]))  # chunks 0 and 1 kept: hits in the batches below
    hits = reader.stats["hits"]
    got = [reader.read(rows) for rows in batches]
    assert reader.stats["hits"] > hits and sum(copied) > 0
    loop._rows_fn = None  # the way before: whole chunks, a gather
    old = ChunkReader(a, where="p", cache_bytes=0, threads=threads)
    for rows, mine in zip(batches, got, strict=True):
        np.testing.assert_array_equal(mine, data[rows])
        np.testing.assert_array_equal(old.read(rows), mine)


def test_nonzero_fill_value(tmp_path):
    a = zarr.create_array(
        zarr.storage.LocalStore(tmp_path / "f.zarr"),
        shape=(40, 3),
        chunks=(8, 3),
        shards=(16, 3),
        dtype="int16",
        fill_value=-7,
        compressors=[BloscCodec(), Crc32cCodec()],
    )
    a[:8] = 1
    reader = ChunkReader(a, where="f")
    np.testing.assert_array_equal(reader.read(np.arange(40)), a[:])
    assert reader.read([39])[0, 0] == -7


def test_corrupt_chunk_names_store_and_chunk(tmp_path):
    n = 64
    a = _array(zarr.storage.LocalStore(tmp_path / "c.zarr"), n)
    a[:] = np.random.default_rng(0).integers(0, 4, size=a.shape, dtype=np.uint8)
    shard = tmp_path / "c.zarr" / "c" / "0" / "0" / "0"
    index = np.frombuffer(shard.read_bytes()[: 8 * 16], dtype="<u8").reshape(8, 2)
    off = int(index[3, 0])
    raw = bytearray(shard.read_bytes())
    raw[off + 20] ^= 0xFF
    shard.write_bytes(bytes(raw))
    reader = ChunkReader(a, where=str(tmp_path / "c.zarr"))
    np.testing.assert_array_equal(reader.read([0, 63]), a.oindex[[0, 63]])  # other chunks fine
    with pytest.raises(StoreCorruptError, match=r"c\.zarr: chunk 3 of array .*rows 24-31.*crc32c"):
        reader.read([25])
    with pytest.raises(ValueError, match="damaged; write it again, or copy the object again"):
        reader.read(np.arange(n))


def test_corrupt_shard_index(tmp_path):
    a = _array(zarr.storage.LocalStore(tmp_path / "i.zarr"), 64)
    a[:] = 1
    shard = tmp_path / "i.zarr" / "c" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[5] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match=r"index of shard .* crc32c"):
        ChunkReader(a, where="i").read([0])


def test_unsupported_layouts_fall_back_to_zarr(tmp_path):
    gz = _array(zarr.storage.LocalStore(tmp_path / "g.zarr"), 50, compressors=[GzipCodec()])
    gz[:] = np.arange(50 * 30, dtype=np.uint8).reshape(50, 6, 5)
    split = zarr.create_array(
        zarr.storage.LocalStore(tmp_path / "s.zarr"),
        shape=(50, 6, 5),
        chunks=(8, 3, 5),
        dtype="uint8",
        compressors=FRAME_CODECS,
    )
    split[:] = gz[:]
    for a in (gz, split):
        reader = ChunkReader(a, where="x")
        assert not reader.fast
        for rows in _row_sets(50, 8, 8):
            _check_rows(reader, a, rows)


def test_cache_is_bounded_and_reused(tmp_path):
    a = _array(zarr.storage.LocalStore(tmp_path / "b.zarr"), 256)
    data = np.random.default_rng(0).integers(0, 4, size=a.shape, dtype=np.uint8)
    a[:] = data
    chunk_bytes = 8 * 6 * 5
    reader = ChunkReader(a, where="b", cache_bytes=8 * chunk_bytes, decode_ahead=False)
    np.testing.assert_array_equal(reader.read([1, 9, 17]), data[[1, 9, 17]])
    decoded = reader.stats["decoded"]
    np.testing.assert_array_equal(reader.read([2, 10, 18, 3]), data[[2, 10, 18, 3]])
    assert reader.stats["decoded"] == decoded and reader.stats["hits"] == 3
    rng = np.random.default_rng(3)
    for _ in range(50):  # many small batches cycle through the 8 slots
        rows = rng.integers(0, 256, 5)
        np.testing.assert_array_equal(reader.read(rows), data[rows])
        assert reader.cached_chunks <= 8
    # a batch wider than half the cache is served from a buffer of its own
    rows = np.arange(0, 256, 8)[::-1]
    np.testing.assert_array_equal(reader.read(rows), data[rows])
    assert reader.cached_chunks <= 8
    # every cached slot holds exactly its chunk
    from atari_zarr.read.chunk_cache import chunk_keys

    cids = np.arange(256 // 8)
    slots = reader._cache.lookup(chunk_keys(reader._token, cids))
    assert (slots >= 0).sum() == reader.cached_chunks > 0
    for c, s in zip(cids[slots >= 0], slots[slots >= 0]):
        np.testing.assert_array_equal(reader._cache.slab[s], data[c * 8 : c * 8 + 8])


def test_sequential_reads_prefetch(tmp_path):
    n = 64 * 4
    a = _array(zarr.storage.LocalStore(tmp_path / "r.zarr"), n)
    data = np.random.default_rng(0).integers(0, 4, size=a.shape, dtype=np.uint8)
    a[:] = data
    reader = ChunkReader(a, where="r", threads=2)
    got = [reader.read(np.arange(i, min(i + 20, n))) for i in range(0, n, 20)]
    np.testing.assert_array_equal(np.concatenate(got), data)
    reader.close()
    assert reader.stats["decoded_ahead"] > 0


def test_dataset_batches_match_zarr(pong_store):
    store = pong_store  # shared, read-only
    ds = AtariZarrDataset(store.url)
    assert ds._store.frames.fast
    g = zarr.open_group(store.url, mode="r")
    obs = g[OBSERVATION][:]
    done = g[TERMINATED][:] | g[TRUNCATED][:]
    for seed in range(3):
        b = ds.sample(64, generator=torch.Generator().manual_seed(seed))
        rows = b["index"].numpy()
        np.testing.assert_array_equal(b["observation"].numpy(), obs[rows])
        nxt = np.where(done[rows, None, None], 0, obs[np.minimum(rows + 1, len(obs) - 1)])
        np.testing.assert_array_equal(b["next", "observation"].numpy(), nxt)
    np.testing.assert_array_equal(ds.episodes.numpy(), g[EPISODE][:])


def test_remote_store_reads_only_needed_ranges(pong_store):
    """Through gcsfs against fake-gcs-server: same batches, range requests, cache hits."""
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    store = pong_store  # shared, read-only (uploaded, never changed)
    local = AtariZarrDataset(store.url)
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket("bench")
        opts = server.storage_options(endpoint_url=proxy.endpoint_url)
        fs = fsspec.filesystem("gs", **opts)
        fs.put(store.url, "bench/Pong/1.zarr", recursive=True)
        remote = AtariZarrDataset("gs://bench/Pong/1.zarr", storage_options=opts)
        assert remote._store.frames.fast
        rows = np.array([0, 5, 5, len(local) - 1, 300, 17])
        proxy.reset()
        got = remote[rows]
        want = local[rows]
        for key in (
            "observation",
            ("next", "observation"),
            "action",
            ("next", "reward"),
            "episode",
        ):
            assert torch.equal(got[key], want[key]), key
        obs_bytes = sum(
            f.stat().st_size for f in (Path(store.url) / OBSERVATION).rglob("*") if f.is_file()
        )
        frame_reads = [e for e in proxy.log if "observation" in e[1]]
        assert frame_reads and all(e[2] == 206 for e in frame_reads)  # byte ranges only
        assert proxy.bytes_received < obs_bytes
        proxy.reset()
        remote[rows]  # every chunk is cached now
        assert not [e for e in proxy.log if "observation" in e[1]]


# --------------------------------------------------------------------------- #
# merged requests (ranges merged by the engine: tests/read/test_ranges.py)
# --------------------------------------------------------------------------- #


def test_adjacent_chunks_of_a_shard_are_one_request(tmp_path):
    """Over http: chunks of one shard become one ranged GET; the bytes are the same."""
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    from atari_zarr.storage.remote import RemoteStore

    local = _array(zarr.storage.LocalStore(tmp_path / "a.zarr"), 256, chunk=8, shard=64)
    local[:] = _frames(256)[:, :6, :5]
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket("coalesce")
        fs = fsspec.filesystem("gs", **server.storage_options())
        fs.put(str(tmp_path / "a.zarr"), "coalesce/a.zarr", recursive=True)
        url = f"{proxy.endpoint_url}/coalesce/a.zarr"
        remote = zarr.open_array(RemoteStore(url, read_only=True), mode="r", zarr_format=3)
        rows = np.array([3, 12, 20, 30, 70, 100])  # chunks 0-3 of shard 0, 8 and 12 of shard 1
        merged = ChunkReader(remote, where=url, cache_bytes=0)
        merged.read(rows[:1])  # shard indexes of shard 0
        merged.read(rows[4:5])  # and shard 1
        proxy.reset()
        _check_rows(merged, local, rows)
        assert proxy.requests == 2, proxy.log  # one per shard
        assert merged.stats["requests"] == 2 + 2 + 2  # two shard indexes, two chunks, two merged
        single = ChunkReader(
            remote, where=url, cache_bytes=0, options=ReadOptions(coalesce_gap=-1, kept_bytes=0)
        )
        single.read(rows[:1])
        single.read(rows[4:5])
        proxy.reset()
        _check_rows(single, local, rows)
        assert proxy.requests == 6, proxy.log  # one per chunk
        # a gap larger than the tolerance splits the shard's ranges (nothing kept, so
        # that each read below fetches its chunks)
        small_gap = ChunkReader(
            remote, where=url, cache_bytes=0, options=ReadOptions(coalesce_gap=0, kept_bytes=0)
        )
        small_gap.read(rows[:1])
        small_gap.read(rows[4:5])
        proxy.reset()
        _check_rows(small_gap, local, np.array([3, 12, 20, 30]))  # touching chunks
        assert proxy.requests == 1, proxy.log
        proxy.reset()
        _check_rows(small_gap, local, np.array([3, 30]))  # chunks 0 and 3: a gap
        assert proxy.requests == 2, proxy.log


def test_a_large_cache_takes_slots_into_use_as_misses_pay_for_them(pong_store):
    """A fresh slot's first write costs its page faults: the cache starts with 128 MB of
    slots and takes one more per 8 chunks decoded, up to its bound; hits cost nothing."""
    from atari_zarr.read import chunk_cache as chunks_module

    frames = zarr.open_group(pong_store.url, mode="r")["observation"]
    chunk = 16 * 84 * 84
    r = ChunkReader(frames, where=pong_store.url, cache_bytes=50 * chunk)
    first = r._cache.active
    assert first == 50  # the first 128 MB hold more than this bound
    small = ChunkReader(frames, where=pong_store.url, cache_bytes=10_000 * chunk)
    start = small._cache.active
    assert start == (128 << 20) // chunk < small._cache.n_slots
    n = frames.shape[0]
    small.read(np.arange(n))  # a range: decoded straight into the output
    assert small._cache.active == start
    rows = np.arange(0, n, 16)  # one row per chunk: (nearly) every chunk a miss
    small.read(rows)
    grown = small._cache.active - start
    assert 0 < grown <= len(rows) // chunks_module.MISSES_PER_SLOT + 1
    before = small._cache.active
    small.read(rows)  # all hits: nothing more taken
    assert small._cache.active == before and small.stats["hits"] >= len(rows)


def _admission_gaps(cache, read, batches: int) -> list[int]:
    """Batches between the batches the cache admitted, over ``batches`` calls of ``read``."""
    admitted, last = [], cache._batch
    for i in range(batches):
        read()
        if cache._batch != last:
            admitted.append(i)
            last = cache._batch
    return np.diff(admitted).tolist()


def test_a_cache_far_smaller_than_its_array_stops_admitting_what_it_never_hits(tmp_path):
    """Random reads over 512 chunks through a 16-slot cache hit about 3%: after the first
    batches its misses are decoded for the batch only (a probe batch still admits: the
    16th, then the 32nd after it, and so on up to one in 256), and reads that come back
    to a few rows fill it again."""
    a = _array(zarr.storage.LocalStore(tmp_path / "adm.zarr"), 4096)
    data = _frames(4096)[:, :6, :5].copy()
    a[:] = data
    reader = ChunkReader(a, where="adm", cache_bytes=16 * 8 * 6 * 5, decode_ahead=False)
    cache = reader._cache
    rng = np.random.default_rng(0)

    def read(high: int = 4096) -> None:
        rows = rng.integers(0, high, 4)
        np.testing.assert_array_equal(reader.read(rows), data[rows])

    for _ in range(40):
        read()
    assert cache.hit_rate < 0.1
    # the probes back off, each gap twice the one before up to 256: a dozen batches of
    # 1,000 admitted, where one in 16 would be 62 (a lucky run of hits starts over)
    gaps = _admission_gaps(cache, read, 1000)
    assert gaps[:4] == [32, 64, 128, 256] and max(gaps) == chunk_cache.ADMIT_EVERY_MAX
    assert len(gaps) + 1 <= 15
    # reads that come back to 8 chunks: admitted again at the next probe at the latest,
    # then served from the cache, the probes back at one in 16
    for _ in range(300):
        read(64)
    assert cache.hit_rate > 0.9 and reader.cached_chunks >= 8
    assert cache.probe_every == chunk_cache.ADMIT_EVERY
    decoded = reader.stats["decoded"]
    for _ in range(20):
        read(64)
    assert reader.stats["decoded"] == decoded


def test_a_mixtures_shared_cache_far_smaller_than_its_stores_stops_admitting(tmp_path):
    """Four stores of 1,024 rows read at random through one shared 16-slot cache: the
    mixture's batches stop admitting their misses (but for the probe batches), the
    rows stay right, and reads that come back to a few rows fill the cache again."""
    # each store's share: 4 chunks of 8 rows (a group's bound is the sum of its shares)
    opts = ReadOptions(frame_cache_bytes=4 * 8 * 6 * 5, budget=Budget())
    data, readers = [], []
    for k in range(4):
        a = _array(zarr.storage.LocalStore(tmp_path / f"m{k}.zarr"), 1024)
        d = _frames(1024, seed=k)[:, :6, :5].copy()
        a[:] = d
        data.append(d)
        readers.append(ChunkReader(a, where=f"m{k}", options=opts, decode_ahead=False))
    cache = readers[0]._cache
    assert all(r._cache is cache for r in readers) and cache.chunks_behind == 4 * 128
    rng = np.random.default_rng(0)
    out = np.empty((4, 6, 5), dtype=np.uint8)

    def batch(high: int) -> None:
        which, rows = rng.integers(0, 4, 4), rng.integers(0, high, 4)
        read_rows_of(readers, which, rows, out)
        np.testing.assert_array_equal(out, np.stack([data[w][r] for w, r in zip(which, rows)]))

    for _ in range(40):
        batch(1024)
    assert cache.hit_rate < 0.1
    gaps = _admission_gaps(cache, lambda: batch(1024), 500)
    assert min(gaps) >= chunk_cache.ADMIT_EVERY and len(gaps) + 1 <= 10  # not every batch
    for _ in range(300):
        batch(32)  # 4 chunks of each store: admitted again, then served from the cache
    assert cache.hit_rate > 0.9
    decoded = sum(r.stats["decoded"] for r in readers)
    for _ in range(20):
        batch(32)
    assert sum(r.stats["decoded"] for r in readers) == decoded


def _readers_of(tmp_path, k, *, n=512, own=()):
    """``k`` stores of ``n`` rows and their readers, those of ``own`` with caches of
    their own, the others sharing one budget: (data, readers)."""
    shared = ReadOptions(frame_cache_bytes=16 * 8 * 6 * 5, budget=Budget())
    alone = ReadOptions(frame_cache_bytes=16 * 8 * 6 * 5)
    data, readers = [], []
    for g in range(k):
        a = _array(zarr.storage.LocalStore(tmp_path / f"r{g}.zarr"), n)
        d = _frames(n, seed=g)[:, :6, :5].copy()
        a[:] = d
        data.append(d)
        opts = alone if g in own else shared
        readers.append(ChunkReader(a, where=f"r{g}", options=opts, decode_ahead=False))
    return data, readers


def _read_together(readers, data, rng, n=512, size=64):
    """One batch of random rows of random readers through ``readers`` (a ReaderSet or
    a list), checked against the data and against each reader reading alone."""
    k = len(data)
    which, rows = rng.integers(0, k, size), rng.integers(0, n, size)
    out = np.empty((size, 6, 5), dtype=np.uint8)
    read_rows_of(readers, which, rows, out)
    want = np.stack([data[w][r] for w, r in zip(which, rows, strict=True)])
    np.testing.assert_array_equal(out, want)
    return which, rows, out


def test_a_reader_set_reads_each_readers_rows_and_asks_for_each_reader_once(tmp_path):
    """Six stores read together through a ReaderSet: a batch's rows are each store's
    own, as the readers read them alone and as a list of readers reads them. The set
    asks for each reader once over 30 batches, and again after the shared cache loses
    a reader (one closed: its token changes), whose new token it then holds."""
    data, readers = _readers_of(tmp_path, 6)
    asked = []

    def reader_of(g):
        asked.append(g)
        return readers[g]

    together = ReaderSet(6, reader_of)
    rng = np.random.default_rng(7)
    for _ in range(30):
        which, rows, out = _read_together(together, data, rng)
        sel = which == 3
        np.testing.assert_array_equal(out[sel], readers[3].read(rows[sel]))
        again = np.empty_like(out)
        np.testing.assert_array_equal(read_rows_of(readers, which, rows, again), out)
    assert sorted(asked) == list(range(6))
    before = readers[2]._token
    readers[2].close()
    assert readers[2]._token != before
    asked.clear()
    for _ in range(10):
        _read_together(together, data, rng)
    assert sorted(asked) == list(range(6))
    held, tokens = together.tokens(np.arange(6))
    assert tokens.tolist() == [r._token for r in readers]
    assert held.cache is readers[0]._cache


def test_a_reader_set_reads_a_reader_of_another_cache_by_itself(tmp_path):
    """A reader of a cache of its own, in a set whose others share one: batches that
    touch it read each reader by itself, the others together, all with their rows."""
    data, readers = _readers_of(tmp_path, 3, own=(1,))
    together = ReaderSet(3, readers.__getitem__)
    rng = np.random.default_rng(8)
    for _ in range(10):
        _read_together(together, data, rng)
    assert together.tokens(np.array([0, 2, 2])) is not None
    assert together.tokens(np.array([0, 1])) is None
    assert readers[1].stats["decoded"] > 0


def test_a_reader_set_takes_its_readers_again_in_a_forked_child(tmp_path):
    """A child forked after the set read reads its readers' rows through caches of its
    own (new tokens), never through what the parent's set held."""
    data, readers = _readers_of(tmp_path, 4)
    together = ReaderSet(4, readers.__getitem__)
    rng = np.random.default_rng(9)
    _read_together(together, data, rng)
    parent_cache = together.tokens(np.arange(4))[0].cache
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            for _ in range(5):
                _read_together(together, data, rng)
            held, tokens = together.tokens(np.arange(4))
            mine = held.cache is readers[0]._cache and held.cache is not parent_cache
            code = 0 if mine and tokens.tolist() == [r._token for r in readers] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    _read_together(together, data, rng)
    assert together.tokens(np.arange(4))[0].cache is parent_cache


def test_a_cache_that_holds_a_share_of_its_array_always_admits(tmp_path):
    """A cache of a quarter of the array's chunks keeps admitting, whatever its hit rate."""
    a = _array(zarr.storage.LocalStore(tmp_path / "all.zarr"), 1024)
    data = _frames(1024)[:, :6, :5].copy()
    a[:] = data
    reader = ChunkReader(a, where="all", cache_bytes=32 * 8 * 6 * 5, decode_ahead=False)
    rng = np.random.default_rng(0)
    for _ in range(100):
        rows = rng.integers(0, 1024, 4)
        np.testing.assert_array_equal(reader.read(rows), data[rows])
    assert reader._cache._batch == 100


def _big_rows(tmp_path, n=640):
    """Rows of 32 KB in chunks of 16 (512 KB decoded: long enough to split between
    threads), compressible but distinct."""
    store = zarr.storage.LocalStore(tmp_path / "big.zarr")
    a = _array(store, n, chunk=16, shard=128, row=(128, 256))
    data = np.repeat(np.arange(n, dtype=np.uint8)[:, None, None], 128, axis=1)
    data = np.repeat(data, 256, axis=2)
    data[:, :, :7] = np.random.default_rng(0).integers(0, 255, (n, 128, 7), dtype=np.uint8)
    a[:] = data
    return a


def _read_threads() -> set:
    import threading

    return {t for t in threading.enumerate() if t.name.startswith("atari_zarr-read")}


def test_large_chunks_decode_on_the_reading_threads_with_the_rows_zarr_reads(tmp_path, monkeypatch):
    """A batch of many chunks is split between the reader's threads (named, at most
    ``threads``), which decode off the GIL; the rows are zarr-python's; closing the
    reader stops them. Small chunks (Atari frames) of a local store are split too (the
    compiled loop takes a share of them in one call); one call a chunk, they stay on
    the calling thread."""
    a = _big_rows(tmp_path)
    before = _read_threads()
    reader = ChunkReader(a, where="big", cache_bytes=0, threads=2)
    rows = np.random.default_rng(3).integers(0, a.shape[0], 300)
    _check_rows(reader, a, rows)
    started = _read_threads() - before
    assert 1 <= len(started) <= 2
    _check_rows(reader, a, rows[::-1])
    assert _read_threads() - before == started  # the same pool, not new threads
    reader.close()
    assert _read_threads() <= before
    _check_rows(reader, a, rows[:40])  # reads again after close, with new threads
    reader.close()
    small = _array(zarr.storage.LocalStore(tmp_path / "small.zarr"), 640, chunk=16, shard=128)
    small[:] = _frames(640)[:, :6, :5]
    one = ChunkReader(small, where="small", cache_bytes=0, threads=2)
    _check_rows(one, small, rows)
    assert _read_threads() - before  # the compiled loop on both threads
    one.close()
    monkeypatch.setattr("atari_zarr.read.chunks.chunk_loop", lambda: None)
    one = ChunkReader(small, where="small", cache_bytes=0, threads=2)
    _check_rows(one, small, rows)
    assert _read_threads() <= before
    one.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_the_reading_threads_do_not_survive_a_fork_and_the_child_reads_anew(tmp_path):
    """A child forked while the reader's threads run has none of them (threads do not
    cross a fork): its first read starts its own pool and reads the same rows."""
    a = _big_rows(tmp_path)
    reader = ChunkReader(a, where="big", cache_bytes=0, threads=2)
    rows = np.random.default_rng(4).integers(0, a.shape[0], 300)
    want = reader.read(rows)
    assert _read_threads()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            gone = not _read_threads()
            same = bool(np.array_equal(reader.read(rows), want))
            again = bool(_read_threads())
            reader.close()
            code = 0 if gone and same and again and not _read_threads() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_array_equal(reader.read(rows), want)  # the parent's pool still works
    reader.close()


def test_a_range_read_into_an_array_that_is_not_contiguous(tmp_path):
    """Whole chunks of a range decode straight into ``out``; an ``out`` that is a strided
    view gets them one by one, with the same rows."""
    a = _array(zarr.storage.LocalStore(tmp_path / "r.zarr"), 256, chunk=8, shard=64)
    data = _frames(256)[:, :6, :5]
    a[:] = data
    reader = ChunkReader(a, where="r", cache_bytes=0, decode_ahead=False)
    wide = np.zeros((200, 12, 5), dtype=np.uint8)
    out = wide[:, ::2]
    assert not out.flags.c_contiguous
    got = reader.read(np.arange(24, 224), out=out)
    assert got is out
    np.testing.assert_array_equal(wide[:, ::2], data[24:224])
    assert not wide[:, 1::2].any()
