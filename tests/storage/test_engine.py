"""The one engine: where chunks lie, fetching in at most two rounds, verifying, decoding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import zarr

from atari_zarr.errors import StoreCorruptError
from atari_zarr.layout import ARRAYS, OBSERVATION
from atari_zarr.storage.engine import ChunkEngine
from atari_zarr.storage.ranges import ByteRange
from atari_zarr.storage.remote import RemoteStore

CODECS = ARRAYS[OBSERVATION].compressors()


class Counting:
    """A byte source that records every round of requests it serves."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.remote = True
        self.rounds: list[list[ByteRange]] = []

    def get(self, ranges):
        self.rounds.append(list(ranges))
        return self.inner.get(ranges)


def make(store, n=300, *, chunk=8, shard=64, index_location="start"):
    a = zarr.create_array(
        store,
        shape=(n, 6, 5),
        chunks=(chunk, 6, 5),
        shards={"shape": (shard, 6, 5), "index_location": index_location},
        dtype="uint8",
        compressors=CODECS,
        fill_value=0,
    )
    data = (np.arange(n * 30, dtype=np.int64) * 7 % 251).astype(np.uint8).reshape(n, 6, 5)
    a[:] = data
    return a, data


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        yield zarr.storage.LocalStore(tmp_path / "e.zarr")
        return
    url = f"memory://engine-{tmp_path.name}.zarr"
    yield RemoteStore(url, read_only=False)
    import fsspec

    fsspec.filesystem("memory").rm(f"/engine-{tmp_path.name}.zarr", recursive=True)


@pytest.mark.parametrize("where", ["start", "end"])
def test_fetch_and_decode_any_chunks(store, where):
    """Index at the start (a range) or the end (a suffix request): the same values."""
    a, data = make(store, index_location=where)
    engine = ChunkEngine(a, where="w")
    cids = [37, 0, 8, 9, 36]
    chunks = engine.fetch(cids)
    assert [c.cid for c in chunks] == cids
    out = np.empty((8, 6, 5), dtype=np.uint8)
    for c in chunks:
        assert engine.decode(c, out) == len(c.data)
        rows = slice(c.cid * 8, min(c.cid * 8 + 8, len(data)))
        np.testing.assert_array_equal(out[: rows.stop - rows.start], data[rows])


def test_a_whole_shard_is_one_request_and_brings_its_index(tmp_path):
    a, data = make(RemoteStore(f"memory://span-{tmp_path.name}.zarr", read_only=False))
    engine = ChunkEngine(a, where="w")
    engine.bytes = counting = Counting(engine.bytes)
    out = np.empty((64, 6, 5), dtype=np.uint8)
    halo = np.array([63, 128])  # the row before and after the shard 64-127
    span, extra = engine.fetch_span(64, 128, [63 // 8, 128 // 8])
    # round 1: the whole shard and the two neighbours' indexes; round 2: their chunks
    assert [len(r) for r in counting.rounds] == [3, 2]
    assert counting.rounds[0][0] == ByteRange.whole(counting.rounds[0][0].key)
    got = engine.decode_span(64, 128, out, span, halo, extra)
    np.testing.assert_array_equal(out, data[64:128])
    np.testing.assert_array_equal(got, data[halo])
    # indexes are kept: the chunk of shard 1 comes in round 1; shard 3's index is new
    counting.rounds.clear()
    engine.fetch_span(128, 192, [127 // 8, 192 // 8])
    assert [len(r) for r in counting.rounds] == [3, 1]
    counting.rounds.clear()
    engine.fetch_span(128, 192, [127 // 8])
    assert [len(r) for r in counting.rounds] == [2]


def test_part_of_a_shard_is_one_range(tmp_path):
    a, data = make(RemoteStore(f"memory://part-{tmp_path.name}.zarr", read_only=False))
    engine = ChunkEngine(a, where="w")
    engine.bytes = counting = Counting(engine.bytes)
    span, _ = engine.fetch_span(80, 112)  # chunks 10-13 of shard 1: its index first
    assert [len(r) for r in counting.rounds] == [1, 1]
    assert counting.rounds[1][0].bounded
    out = np.empty((32, 6, 5), dtype=np.uint8)
    engine.decode_span(80, 112, out, span, np.zeros(0, np.int64), [])
    np.testing.assert_array_equal(out, data[80:112])
    with pytest.raises(ValueError, match="not inside one shard"):
        engine.fetch_span(60, 70)


def test_damage_is_named(tmp_path):
    a, _ = make(zarr.storage.LocalStore(tmp_path / "d.zarr"))
    engine = ChunkEngine(a, where="d.zarr", remedy="do this.")
    [chunk] = engine.fetch([3])
    out = np.empty((8, 6, 5), dtype=np.uint8)
    spoiled = bytearray(bytes(chunk.data))
    spoiled[20] ^= 0xFF
    with pytest.raises(
        StoreCorruptError, match=r"chunk 3 .* \(rows 24-31\).*fails its crc32c.*do this"
    ):
        engine.decode(chunk._replace(data=bytes(spoiled)), out)
    with pytest.raises(StoreCorruptError, match="is cut short"):
        engine.decode(chunk._replace(data=bytes(chunk.data)[:-3]), out)


def _random_fetches(engine: ChunkEngine, data: np.ndarray, batches: int) -> list[ByteRange]:
    """Fetch random chunks ``batches`` times; check the values; the chunk ranges requested."""
    engine.bytes = counting = Counting(engine.bytes)
    rng = np.random.default_rng(0)
    out = np.empty((8, 6, 5), dtype=np.uint8)
    for _ in range(batches):
        for c in engine.fetch(sorted(set(rng.integers(0, len(data) // 8, 6).tolist()))):
            engine.decode(c, out)
            np.testing.assert_array_equal(out, data[c.cid * 8 : c.cid * 8 + 8])
    return [r for rnd in counting.rounds for r in rnd if r.bounded]  # the indexes are suffixes


def test_random_reads_fetch_each_byte_once(tmp_path):
    """A merged request's bytes are kept: no byte is fetched twice, never more than the store."""
    a, data = make(
        RemoteStore(f"memory://once-{tmp_path.name}.zarr", read_only=False),
        n=4096,
        shard=512,
        index_location="end",
    )
    import fsspec

    mem = fsspec.filesystem("memory")
    stored = sum(len(mem.cat(f"/once-{tmp_path.name}.zarr/c/{s}/0/0")) for s in range(8))
    engine = ChunkEngine(a, where="w", coalesce_gap=4096)
    fetched = _random_fetches(engine, data, 40)
    covered = np.zeros((8, max(r.stop for r in fetched)), dtype=np.int64)
    for r in fetched:
        covered[int(r.key.split("/")[-3]), r.start : r.stop] += 1
    assert covered.max() == 1, "a byte was fetched twice"
    assert sum(r.stop - r.start for r in fetched) <= stored
    assert engine.stats["kept_hits"] > 0
    # what the bytes kept prevent: the same reads without them fetch bytes again
    again = _random_fetches(ChunkEngine(a, where="w", coalesce_gap=4096, kept_bytes=0), data, 40)
    covered[:] = 0
    for r in again:
        covered[int(r.key.split("/")[-3]), r.start : r.stop] += 1
    assert covered.max() > 1


def _main_thread_steps_while_decoding(decode, calls: int = 10) -> list[int]:
    """Steps the main thread took during each of ``calls`` decodes of 16 MB on another thread.

    The switch interval is raised to 10 s, so a thread that holds the GIL keeps it for
    the whole decode; the main thread's loop gives the GIL back at every step."""
    import sys
    import threading
    import time

    from numcodecs import Blosc

    data = np.repeat(np.random.default_rng(0).integers(0, 255, 1 << 22, dtype=np.uint8), 4)
    encoded = Blosc(cname="zstd", clevel=5, shuffle=0).encode(data)
    out = np.empty_like(data)
    count, during, stop = [0], [], threading.Event()

    def work() -> None:
        try:
            for _ in range(calls):
                before = count[0]
                decode(encoded, out)
                during.append(count[0] - before)
        finally:
            stop.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        thread = threading.Thread(target=work)
        thread.start()
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    np.testing.assert_array_equal(out, data)
    return during


def test_the_background_decoder_lets_the_main_thread_run_while_it_decodes(monkeypatch):
    """On a second core, the stream's units decode without the GIL (c-blosc2 through
    ctypes), so the loop that gathers batches runs meanwhile; python-blosc2, the
    default alone, holds it."""
    from atari_zarr.storage import engine as engine_module
    from atari_zarr.storage.engine import background_decoder, blosc_decoder

    monkeypatch.setattr(engine_module, "cpu_count", lambda: 2)
    assert background_decoder() is blosc_decoder("libblosc2")
    released = _main_thread_steps_while_decoding(background_decoder())
    assert any(released), released
    held = _main_thread_steps_while_decoding(blosc_decoder("blosc2"), calls=3)
    assert sum(held) < sum(released), (held, released)


def test_without_c_blosc2_through_ctypes_the_background_decoder_is_numcodecs(monkeypatch):
    """Where libblosc2 does not load, numcodecs' c-blosc1, which also releases the GIL."""
    from atari_zarr.storage import engine as engine_module
    from atari_zarr.storage.engine import background_decoder, blosc_decoder

    monkeypatch.setattr(engine_module, "cpu_count", lambda: 2)
    monkeypatch.setattr(engine_module, "libblosc2_decoder", lambda: None)
    assert background_decoder() is blosc_decoder("numcodecs")
    assert any(_main_thread_steps_while_decoding(background_decoder(), calls=3))


def test_on_one_core_the_background_decoder_is_the_default(monkeypatch):
    """Nothing runs beside the decoding on one core: the faster c-blosc2 decodes."""
    from atari_zarr.storage import engine as engine_module
    from atari_zarr.storage.engine import background_decoder, blosc_decoder

    monkeypatch.setattr(engine_module, "cpu_count", lambda: 1)
    assert background_decoder() is blosc_decoder()


def _old_way(engine: ChunkEngine, cids: list[int]) -> np.ndarray:
    out = np.empty((len(cids), 8, 6, 5), dtype=np.uint8)
    nbytes = sum(engine.decode(c, d) for c, d in zip(engine.fetch(cids), out, strict=True))
    engine.count_decoded(len(cids), nbytes)
    return out


def test_decode_into_reads_what_fetch_and_decode_read(tmp_path):
    """The short way of a local store (memory map, crc32c, Blosc) against fetch + decode,
    absent chunks included, and the same counters."""
    a, data = make(zarr.storage.LocalStore(tmp_path / "s.zarr"), n=320)
    a[8:16] = 0  # with write_empty_chunks off, chunk 1 is absent: the fill value
    short, old = ChunkEngine(a, where="s"), ChunkEngine(a, where="s")
    cids = [39, 0, 1, 17, 8, 8, 38, 1]
    got = np.full((len(cids), 8, 6, 5), 7, dtype=np.uint8)
    short.decode_into(cids, list(got))
    np.testing.assert_array_equal(got, _old_way(old, cids))
    assert got[2].max() == 0 and short.stats["decoded"] == len(cids)
    assert short.stats["fetched_bytes"] == old.stats["fetched_bytes"] > 0


def test_decode_into_names_damage_as_decode_does(tmp_path):
    """A chunk spoiled on disk: the short way leaves it to ``decode``, whose message names it."""
    a, _ = make(zarr.storage.LocalStore(tmp_path / "d.zarr"))
    engine = ChunkEngine(a, where="d.zarr", remedy="do this.")
    [chunk] = engine.fetch([3])
    path = tmp_path / "d.zarr" / chunk.key
    raw = bytearray(path.read_bytes())
    raw[chunk.offset + 20] ^= 0xFF
    path.write_bytes(bytes(raw))
    fresh = ChunkEngine(a, where="d.zarr", remedy="do this.")
    dests = list(np.empty((2, 8, 6, 5), dtype=np.uint8))
    with pytest.raises(
        StoreCorruptError, match=r"chunk 3 .* \(rows 24-31\).*fails its crc32c.*do this"
    ):
        fresh.decode_into([2, 3], dests)


def test_decode_into_a_remote_store_fetches_as_before(tmp_path):
    url = f"memory://decode-into-{tmp_path.name}.zarr"
    a, data = make(RemoteStore(url, read_only=False))
    engine = ChunkEngine(a, where=url)
    dests = np.empty((3, 8, 6, 5), dtype=np.uint8)
    engine.decode_into([5, 0, 36], list(dests))
    np.testing.assert_array_equal(dests[0], data[40:48])
    np.testing.assert_array_equal(dests[2], data[288:296])
    assert engine.stats["requests"] > 0


@pytest.mark.parametrize(("lo", "hi"), [(64, 128), (67, 101), (64, 70)])
def test_a_spans_partial_and_halo_chunks_are_copied_out_by_the_loop(tmp_path, lo, hi):
    """With the chunk loop, the rows of a span's chunks that lie partly in it and the
    halo rows of the chunks just outside come out of one call that copies them as each
    chunk decodes (no chunk decoded one by one), with an absent chunk among them read
    as its fill value: the rows the per-chunk way (no loop) gives."""
    from atari_zarr.storage.chunk_loop import chunk_loop

    a, data = make(zarr.storage.LocalStore(tmp_path / "s.zarr"))
    data[56:64] = 0  # chunk 7, just before shard 1, absent (all fill value)
    a[56:64] = 0
    loop = chunk_loop()
    assert loop is not None and loop.copies_rows
    halo = np.array([lo - 3, lo - 2, lo - 1, hi, hi + 1])
    engine = ChunkEngine(a, where="s")
    one_by_one = []
    real = engine.decode

    def decode(chunk, out, *args):  # type: ignore[no-untyped-def]
        one_by_one.append(chunk.cid)
        return real(chunk, out, *args)

    engine.decode = decode  # type: ignore[method-assign]
    span, extra = engine.fetch_span(lo, hi, sorted({int(r) // 8 for r in halo}))
    out = np.zeros((hi - lo, 6, 5), dtype=np.uint8)
    got = engine.decode_span(lo, hi, out, span, halo, extra, loop=loop)
    np.testing.assert_array_equal(out, data[lo:hi])
    np.testing.assert_array_equal(got, data[halo])
    assert set(one_by_one) <= {7}  # only the absent chunk, read as its fill value
    before = ChunkEngine(a, where="s")  # the way before: chunk by chunk
    span, extra = before.fetch_span(lo, hi, sorted({int(r) // 8 for r in halo}))
    old = np.zeros_like(out)
    np.testing.assert_array_equal(before.decode_span(lo, hi, old, span, halo, extra), got)
    np.testing.assert_array_equal(old, out)
