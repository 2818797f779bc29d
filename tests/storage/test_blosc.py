"""Blosc decoders (storage/blosc.py): each reads what numcodecs wrote, bit for bit; c-blosc2
through ctypes decodes off the GIL, one context per thread, and in a forked child."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from numcodecs import Blosc

from atari_zarr.storage import blosc
from atari_zarr.storage.blosc import DECODERS, blosc_decoder, libblosc2_decoder
from atari_zarr.storage.engine import decode_chunk


@pytest.mark.parametrize("cname", ["zstd", "lz4", "blosclz", "zlib"])
@pytest.mark.parametrize("shuffle", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["uint8", "int32", "float64"])
def test_every_decoder_reads_what_numcodecs_wrote(cname, shuffle, dtype):
    """c-blosc2 (python-blosc2, and its library through ctypes) reads every Blosc1 buffer
    numcodecs writes, bit for bit: several blocks, a tiny buffer stored as is, and frames
    that compress to nearly nothing."""
    rng = np.random.default_rng(0)
    frames = np.repeat(rng.integers(0, 255, (3, 84, 84), dtype=np.uint8), 6, axis=0)
    arrays = [
        frames.reshape(-1).view(dtype),
        rng.normal(size=70_000).astype(dtype),  # several Blosc blocks
        np.arange(3, dtype=dtype),  # too small to compress: stored as is
    ]
    codec = Blosc(cname=cname, clevel=5, shuffle=shuffle, blocksize=0)
    for data in arrays:
        encoded = codec.encode(data)
        for name in DECODERS:
            out = np.full_like(data, 7)
            assert (
                decode_chunk(
                    encoded,
                    out,
                    checksum=False,
                    chunk_nbytes=data.nbytes,
                    decoder=blosc_decoder(name),
                )
                is None
            )
            np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize("name", DECODERS)
def test_a_damaged_blosc_payload_is_reported_by_every_decoder(name):
    """A buffer whose header is whole but whose compressed bytes are not: one problem, no crash."""
    data = np.random.default_rng(0).integers(0, 8, 16 * 7056, dtype=np.uint8)
    spoiled = bytearray(Blosc(cname="zstd", clevel=5, shuffle=0).encode(data))
    assert len(spoiled) > 1000
    spoiled[len(spoiled) // 2 : len(spoiled) // 2 + 64] = b"\xff" * 64
    out = np.empty_like(data)
    problem = decode_chunk(
        bytes(spoiled), out, checksum=False, chunk_nbytes=data.nbytes, decoder=blosc_decoder(name)
    )
    assert problem is not None and problem.startswith("does not decode")


def test_the_default_decoder_is_python_blosc2_and_ctypes_loads_beside_it():
    import importlib.util

    assert importlib.util.find_spec("blosc2") is not None, "python-blosc2 is a base dependency"
    assert blosc_decoder() is blosc_decoder("blosc2")
    assert libblosc2_decoder() is not None
    with pytest.raises(ValueError, match="unknown Blosc decoder 'snappy'"):
        blosc_decoder("snappy")


def test_libblosc2_takes_any_buffer_and_refuses_a_destination_it_cannot_fill():
    data = (np.arange(50_000) % 13).astype(np.uint8)
    encoded = Blosc(cname="zstd", clevel=5, shuffle=0).encode(data)
    decode = blosc_decoder("libblosc2")
    for src in (encoded, bytearray(encoded), memoryview(encoded), np.frombuffer(encoded, "u1")):
        out = np.zeros_like(data)
        assert decode(src, out) == data.nbytes
        np.testing.assert_array_equal(out, data)
    with pytest.raises(ValueError, match="C-contiguous"):
        decode(encoded, np.zeros((2, data.size), np.uint8)[:, ::2].reshape(-1)[::2])
    with pytest.raises(ValueError, match="c-blosc2 error"):
        decode(encoded, np.zeros(data.size // 2, np.uint8))  # too small for it


def _many_buffers(n: int = 64) -> tuple[list[bytes], np.ndarray]:
    rng = np.random.default_rng(1)
    want = np.repeat(rng.integers(0, 255, (n, 16, 441), dtype=np.uint8), 16, axis=2)
    codec = Blosc(cname="zstd", clevel=5, shuffle=0)
    return [codec.encode(w) for w in want], want


def test_threads_decode_at_once_each_with_its_own_context():
    """Four threads decode the same buffers over and over: every result exact (a context
    shared between threads would mix their blocks)."""
    encoded, want = _many_buffers()
    decode = blosc_decoder("libblosc2")
    bad: list[int] = []

    def work(seed: int) -> None:
        out = np.empty_like(want[0])
        for i in np.random.default_rng(seed).integers(0, len(encoded), 400).tolist():
            decode(encoded[i], out)
            if not np.array_equal(out, want[i]):
                bad.append(i)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_decodes_with_the_context_it_inherited_and_new_threads():
    encoded, want = _many_buffers(8)
    decode = blosc_decoder("libblosc2")
    out = np.empty_like(want[0])
    decode(encoded[0], out)  # this thread's context exists before the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = True
        try:
            for i in range(len(encoded)):
                decode(encoded[i], out)
                ok &= bool(np.array_equal(out, want[i]))
            got = []
            t = threading.Thread(target=lambda: got.append(decode(encoded[1], np.empty_like(out))))
            t.start()
            t.join()
            ok &= got == [want[1].nbytes]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_library_that_does_not_load_or_decodes_wrongly_is_not_used(monkeypatch):
    """The check at first use: anything wrong leaves the choice to python-blosc2."""

    def broken():
        raise OSError("no such library")

    def clear():
        libblosc2_decoder.cache_clear()
        blosc.libblosc2.cache_clear()
        blosc._decoder.cache_clear()

    try:
        clear()
        monkeypatch.setattr(blosc, "_library", broken)
        assert libblosc2_decoder() is None
        clear()
        monkeypatch.undo()
        monkeypatch.setattr(blosc.LibBlosc2, "decode", lambda self, src, dest: dest.nbytes)
        assert libblosc2_decoder() is None  # "decoded" nothing: the check sees it
    finally:
        monkeypatch.undo()
        clear()
    assert libblosc2_decoder() is not None
