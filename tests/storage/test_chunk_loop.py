"""The compiled loop: many chunks checked and decoded in one call, off the GIL."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import numpy as np
import pytest
import zarr
from numcodecs import Blosc

from atari_zarr.read.chunks import ChunkReader
from atari_zarr.storage import chunk_loop as loop_module
from atari_zarr.storage.chunk_loop import DECODED, Destinations, RowCopies, chunk_loop
from atari_zarr.storage.engine import ChunkEngine

from ..read.test_chunks import _array, _frames


def _stored(rows: np.ndarray, *, cname="zstd", shuffle=Blosc.SHUFFLE) -> bytes:
    body = Blosc(cname=cname, clevel=5, shuffle=shuffle).encode(rows)
    return body + google_crc32c.value(body).to_bytes(4, "little")


def _run(loop, sources, destsize, n_out=None, **kw):
    srcs = [np.frombuffer(s, dtype=np.uint8) for s in sources]
    out = np.zeros((n_out or len(srcs), destsize), dtype=np.uint8)
    status = loop.run(
        np.array([s.ctypes.data if s.size else 0 for s in srcs], dtype=np.uint64),
        np.array([s.size for s in srcs], dtype=np.int64),
        np.array([o.ctypes.data for o in out], dtype=np.uint64),
        destsize,
        **kw,
    )
    return status, out


def test_the_loop_is_built_and_passes_its_check_here():
    """The install builds it (a compiler is part of the test setup): a missing loop
    would silently read at one core."""
    assert chunk_loop() is not None


@pytest.mark.parametrize("cname", ["zstd", "lz4", "blosclz"])
@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32"])
def test_decodes_what_numcodecs_decodes(cname, dtype):
    rng = np.random.default_rng(0)
    rows = (rng.integers(0, 40, (6, 3000)) * np.arange(3000) % 977).astype(dtype)
    shuffles = [Blosc.NOSHUFFLE, Blosc.SHUFFLE, Blosc.BITSHUFFLE]
    stored = [_stored(r, cname=cname, shuffle=shuffles[i % 3]) for i, r in enumerate(rows)]
    status, out = _run(chunk_loop(), stored, rows[0].nbytes, checksum=True)
    assert status.tolist() == [DECODED] * 6
    np.testing.assert_array_equal(out.view(dtype), rows)
    plain = [s[:-4] for s in stored]  # no crc32c after the Blosc buffer
    status, out = _run(chunk_loop(), plain, rows[0].nbytes, checksum=False)
    assert status.tolist() == [DECODED] * 6
    np.testing.assert_array_equal(out.view(dtype), rows)


def test_each_kind_of_damage_is_reported_and_nothing_else_is_touched():
    """Not decoded, and the destination left as it was, for: too short, a wrong crc32c,
    a buffer not whole, the wrong decoded size, a body that does not decode, no bytes."""
    want = (np.arange(8000) % 251).astype(np.uint8)
    good = _stored(want)
    body = Blosc(cname="zstd").encode(want)
    flipped = bytearray(body)
    flipped[16:20] = (1 << 30).to_bytes(4, "little")  # its first block past its end,
    # with a crc32c that matches
    spoiled = bytes(flipped) + google_crc32c.value(bytes(flipped)).to_bytes(4, "little")
    other = _stored(want[:4000])
    cut = bytearray(body[:-10])
    cut_stored = bytes(cut) + google_crc32c.value(bytes(cut)).to_bytes(4, "little")
    cases = [good, good[:12], good[:-1] + bytes([good[-1] ^ 1]), cut_stored, other, spoiled, b""]
    status, out = _run(chunk_loop(), cases, want.nbytes, checksum=True)
    assert status[0] == DECODED and (out[0] == want).all()
    assert status.tolist()[1:] == [1, 2, 3, 4, 5, 1]
    assert not out[1:5].any() and not out[6].any()


def test_parts_on_threads_decode_as_one_call_does():
    rows = _frames(64).reshape(64, -1)
    stored = [_stored(r) for r in rows]
    srcs = [np.frombuffer(s, dtype=np.uint8) for s in stored]
    src = np.array([s.ctypes.data for s in srcs], dtype=np.uint64)
    lens = np.array([s.size for s in srcs], dtype=np.int64)
    out = np.zeros_like(rows)
    dests = Destinations(out, np.arange(64)[::-1], 1)  # in reverse, through its addresses
    names: list[str] = []
    # a loop of this test's own (not the process's, which other readers' threads may use)
    loop = loop_module.ChunkLoop(
        loop_module.built_library(),
        loop_module.libblosc2(),
        loop_module._crc32c_value(),
    )
    real_run = loop.run

    def run(*args, **kw):
        names.append(threading.current_thread().name)
        return real_run(*args, **kw)

    loop.run = run  # type: ignore[method-assign]  # see who runs each part
    with ThreadPoolExecutor(3, thread_name_prefix="part") as pool:
        status = loop.run_parts(
            src, lens, dests.addresses(), rows[0].nbytes, checksum=True, executor=pool, parts=4
        )
    assert status.tolist() == [DECODED] * 64
    np.testing.assert_array_equal(out[::-1], rows)
    assert len(names) == 4 and names.count(threading.current_thread().name) == 1
    assert sum(name.startswith("part_") for name in names) == 3  # the others on the pool


def _own_loop():
    """A loop of the test's own (not the process's, which other readers' threads use)."""
    return loop_module.ChunkLoop(
        loop_module.built_library(),
        loop_module.libblosc2(),
        loop_module._crc32c_value(),
    )


@pytest.mark.parametrize("parts", [1, 3])
def test_rows_copied_out_are_those_of_the_whole_chunks_and_a_damaged_one_copies_none(parts):
    """run_rows (through run_parts, on one thread or three): the rows each chunk is
    asked for, duplicates and any order included, land where they are wanted, as the
    whole chunks decoded by run give them. A chunk with a wrong crc32c copies nothing,
    its status says so, and its done flag stays unset."""
    chunks = _frames(8 * 12).reshape(12, 8, -1)  # 12 chunks of 8 rows
    stored = [_stored(c) for c in chunks]
    stored[5] = stored[5][:-1] + bytes([stored[5][-1] ^ 1])
    srcs = [np.frombuffer(s, dtype=np.uint8) for s in stored]
    src = np.array([s.ctypes.data for s in srcs], dtype=np.uint64)
    lens = np.array([s.size for s in srcs], dtype=np.int64)
    rng = np.random.default_rng(3)
    chunk, within = rng.integers(0, 12, 200), rng.integers(0, 8, 200)
    out = np.zeros((200, chunks.shape[2]), dtype=np.uint8)
    done = np.zeros(12, dtype=bool)
    order = np.array([7, 0, 5, 11, 3, 9, 1, 10, 2, 8, 4, 6])  # decoded in another order
    scratch = np.zeros((12 * 8, chunks.shape[2]), dtype=np.uint8)
    copies = RowCopies.of(chunk, within, np.arange(12), out, done=done)
    dests = Destinations(scratch, np.arange(12) * 8, 8, copies).take(order)
    loop = _own_loop()
    with ThreadPoolExecutor(2) as pool:
        status = loop.run_parts(
            src[order], lens[order], dests, chunks[0].nbytes, checksum=True,
            executor=pool, parts=parts,
        )  # fmt: skip
    assert status.tolist() == [DECODED if c != 5 else 2 for c in order]
    assert done.tolist() == [c != 5 for c in range(12)]
    good = chunk != 5
    np.testing.assert_array_equal(out[good], chunks[chunk[good], within[good]])
    assert not out[~good].any() and not scratch.any()  # nothing went to the places
    _, whole = _run(loop, stored, chunks[0].nbytes, checksum=True)  # the whole chunks
    whole = whole.reshape(12, 8, -1)
    np.testing.assert_array_equal(out[good], whole[chunk[good], within[good]])


def test_destinations_are_views_and_addresses_of_one_array():
    buf = np.zeros((12, 3), dtype=np.int16)
    d = Destinations(buf, [6, 0, 3], 3)
    assert [len(v) for v in d] == [3, 3, 3] and len(d) == 3
    assert d.addresses().tolist() == [buf.ctypes.data + k * 6 for k in (6, 0, 3)]
    d.take([2])[0][...] = 5
    assert buf[3:6].min() == 5 and buf[:3].max() == 0
    assert d[1:].starts.tolist() == [0, 3]
    with pytest.raises(ValueError, match="C-contiguous"):
        Destinations(buf[:, :2], [0], 3)


def test_locate_points_at_the_bytes_fetch_returns(tmp_path):
    """Every chunk's address and length are those of the bytes the careful way fetches;
    an absent shard and a shard whose index points past its object get no address."""
    a = _array(zarr.storage.LocalStore(tmp_path / "s.zarr"), 64 * 4, chunk=8, shard=64)
    a[: 64 * 3] = _frames(64 * 3)[:, :6, :5]  # the fourth shard never written
    engine = ChunkEngine(a, where="s")
    cids = np.array([0, 9, 3, 30, 17, 8], dtype=np.int64)
    located = engine.locate(cids)
    few = engine.locate(cids[:3])  # the one-by-one path, for a few
    assert few.src.tolist() == located.src[:3].tolist()
    assert few.srclen.tolist() == located.srclen[:3].tolist()
    for c, addr, n, chunk in zip(
        cids, located.src, located.srclen, engine.fetch(cids.tolist()), strict=True
    ):
        if c >= 24:
            assert addr == 0 and chunk.data is None
            continue
        got = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * int(n)).from_address(int(addr)))
        assert bytes(got) == bytes(chunk.data)
    # an index entry past the end of its object (a cut file): not located
    path = tmp_path / "s.zarr" / "c" / "1" / "0" / "0"
    path.write_bytes(path.read_bytes()[:-200])
    for cids in ([8, 15], list(range(8, 16))):  # one by one, and with array steps
        engine = ChunkEngine(a, where="s")
        located = engine.locate(np.array(cids, dtype=np.int64))
        assert located.src[-1] == 0 and located.src[0] != 0 and located.srclen[-1] == 0


def test_a_damaged_chunk_read_through_the_loop_is_named_as_before(tmp_path):
    """The loop only reports a chunk it cannot decode; the careful way names it."""
    from atari_zarr.errors import StoreCorruptError

    a = _array(zarr.storage.LocalStore(tmp_path / "d.zarr"), 128, chunk=8, shard=64)
    data = _frames(128)[:, :6, :5]
    a[:] = data
    path = tmp_path / "d.zarr" / "c" / "1" / "0" / "0"
    raw = bytearray(path.read_bytes())
    engine = ChunkEngine(a, where="d")
    [chunk] = engine.fetch([9])
    raw[chunk.offset + 20] ^= 0xFF
    path.write_bytes(bytes(raw))
    reader = ChunkReader(a, where="d", cache_bytes=0, threads=2)
    rows = np.arange(0, 128, 3)
    with pytest.raises(StoreCorruptError, match=r"chunk 9 of array .* fails its crc32c check"):
        reader.read(rows)
    good = rows[(rows < 72) | (rows >= 80)]
    np.testing.assert_array_equal(reader.read(good), data[good])
    reader.close()


def test_without_the_loop_the_rows_are_the_same(tmp_path, monkeypatch):
    """The fallback (no compiler at install): chunks decode one call each."""
    a = _array(zarr.storage.LocalStore(tmp_path / "f.zarr"), 512, chunk=8, shard=64)
    data = _frames(512)[:, :6, :5]
    a[:] = data
    rows = np.random.default_rng(0).integers(0, 512, 300)
    with_loop = ChunkReader(a, where="f", cache_bytes=0, threads=2).read(rows)
    monkeypatch.setattr("atari_zarr.read.chunks.chunk_loop", lambda: None)
    without = ChunkReader(a, where="f", cache_bytes=0, threads=2).read(rows)
    np.testing.assert_array_equal(with_loop, data[rows])
    np.testing.assert_array_equal(without, data[rows])


def test_a_mixture_batch_is_one_loop_run_with_the_rows_read_store_by_store(tmp_path, monkeypatch):
    """read_rows_of over stores sharing a cache: one run for the chunks of every store
    touched; the rows are those read store by store without the loop, and a damaged chunk
    in one store is still named."""
    from atari_zarr.errors import StoreCorruptError
    from atari_zarr.read import chunks as chunks_module
    from atari_zarr.read.chunks import read_rows_of
    from atari_zarr.read.options import ReadOptions

    opts = ReadOptions(frame_cache_bytes=1 << 16).divided(12)
    data, readers = [], []
    for k in range(12):
        a = _array(zarr.storage.LocalStore(tmp_path / f"{k}.zarr"), 256, chunk=8, shard=64)
        rows = _frames(256, seed=k)[:, :6, :5]
        a[:] = rows
        data.append(rows)
        readers.append(ChunkReader(a, where=f"{k}", options=opts, threads=2))
    rng = np.random.default_rng(5)
    which, rows = rng.integers(0, 12, 400), rng.integers(0, 256, 400)
    want = np.stack([data[w][r] for w, r in zip(which, rows, strict=True)])
    runs = []
    real = chunks_module.decode_across

    def counted(readers, tokens, *args, **kw):
        runs.append((len(np.unique(tokens)), real(readers, tokens, *args, **kw)))
        return runs[-1][1]

    monkeypatch.setattr(chunks_module, "decode_across", counted)
    out = np.empty_like(want)
    np.testing.assert_array_equal(read_rows_of(readers, which, rows, out), want)
    # the batch's chunks in one run over the stores touched
    assert [ok for _, ok in runs] == [True] * len(runs) and max(k for k, _ in runs) > 1
    monkeypatch.setattr(chunks_module, "chunk_loop", lambda: None)
    fresh = [ChunkReader(r.array, where=r.where, options=opts) for r in readers]
    np.testing.assert_array_equal(read_rows_of(fresh, which, rows, np.empty_like(want)), want)
    monkeypatch.undo()
    path = tmp_path / "3.zarr" / "c" / "0" / "0" / "0"
    raw = bytearray(path.read_bytes())
    [chunk] = readers[3].engine.fetch([2])
    raw[chunk.offset + 20] ^= 0xFF
    path.write_bytes(bytes(raw))
    fresh = [ChunkReader(r.array, where=r.where, options=opts) for r in readers]
    with pytest.raises(StoreCorruptError, match=r"^3: chunk 2 of array"):
        read_rows_of(
            fresh, np.array([0, 3, 5]), np.array([0, 17, 9]), np.empty((3, 6, 5), np.uint8)
        )
