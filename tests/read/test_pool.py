"""Batch memory is reused only once nothing refers to it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from atari_zarr.read.pool import BufferPool, resident


def test_a_block_held_through_a_tensor_view_is_never_handed_out_again():
    pool = BufferPool(keep=2)
    a = pool.take((4, 8))
    a[:] = 1
    t = torch.from_numpy(a)[1:3]  # a view of a tensor of it
    del a
    b = pool.take((4, 8))
    b[:] = 2
    assert bool((t == 1).all())  # the held batch was not overwritten
    del t
    c = pool.take((2, 2, 8))
    assert c.base is not None and np.shares_memory(c, np.asarray(c.base))


def test_dropped_blocks_are_reused_and_sizes_can_change():
    pool = BufferPool(keep=1)
    first = id(pool.take((16,)).base)  # dropped at once
    assert id(pool.take((8,)).base) == first  # smaller: the same block
    bigger = pool.take((64,))
    assert bigger.shape == (64,)
    held = [pool.take((4,)) for _ in range(3)]  # more held than kept: fresh memory
    assert len({id(h.base) for h in held}) == 3
    typed = pool.take((3,), np.float32)
    assert typed.dtype == np.float32 and typed.shape == (3,)


def test_a_resident_buffer_is_mapped_populated_and_lives_with_its_array():
    """Large: an anonymous mapping made resident at once (zeros, as fresh memory is),
    freed with the last array that refers to it; small: ``np.empty``."""
    import gc
    import mmap

    big = resident((256, 84, 84))
    assert big.shape == (256, 84, 84) and big.dtype == np.uint8 and big.flags.writeable
    if hasattr(mmap, "MAP_POPULATE"):
        owner = big
        while isinstance(owner, np.ndarray):
            owner = owner.base
        assert isinstance(getattr(owner, "obj", owner), mmap.mmap)  # through a memoryview
        assert not big.any()
    view = big[3:5]
    del big
    gc.collect()
    view[:] = 7  # the mapping is still there: the view refers to it
    assert int(view.sum()) == 7 * view.size
    small = resident((4, 4), np.int32)
    assert small.base is None and small.dtype == np.int32


def _resident_bytes(a: np.ndarray) -> int:
    """Bytes of the mapping holding ``a`` that are in memory (``/proc/self/smaps``)."""
    at, found = a.ctypes.data, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                found = lo <= at < hi
            elif found and line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the array")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")
@pytest.mark.parametrize("advice", ["populate-write", "refused"])
def test_a_large_resident_buffer_is_made_resident_by_a_thread_per_core(
    monkeypatch, advice: str
) -> None:
    """Split between threads (two cores here), every page is in memory before it is
    written; where the kernel refuses the advice, the mapping is populated as before."""
    import threading

    from atari_zarr.read import pool

    monkeypatch.setattr(pool, "cpu_count", lambda: 2)
    if advice == "refused":
        monkeypatch.setattr(pool, "_MADV_POPULATE_WRITE", 10_000)  # EINVAL
    started = []
    real_start = threading.Thread.start

    def start(self):  # type: ignore[no-untyped-def]
        started.append(self)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    big = resident((10_000, 84, 84))  # 70 MB: two parts
    assert len(started) == 1  # one thread beside the caller
    assert _resident_bytes(big) >= big.nbytes
    assert not big.any() and big.flags.writeable
    big[-1] = 3
    assert int(big[-1].sum()) == 3 * 84 * 84


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")
def test_where_no_thread_starts_the_caller_makes_every_part_resident(monkeypatch) -> None:
    import threading

    from atari_zarr.read import pool

    monkeypatch.setattr(pool, "cpu_count", lambda: 2)

    def start(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", start)
    big = resident((10_000, 84, 84))
    assert _resident_bytes(big) >= big.nbytes and not big.any()


def test_a_block_held_by_a_batch_is_not_given_out_again():
    """Blocks are plain arrays, whose count of references shows a batch holding one."""
    pool = BufferPool(keep=2)
    a = pool.take((1 << 20,))
    assert a.base is not None and isinstance(a.base, np.ndarray)
    a[:] = 1
    b = pool.take((1 << 20,))
    b[:] = 2
    assert int(a[0]) == 1
