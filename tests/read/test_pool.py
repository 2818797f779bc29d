"""Batch memory is reused only once nothing refers to it."""

from __future__ import annotations

import numpy as np
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


def test_a_block_held_by_a_batch_is_not_given_out_again():
    """Blocks are plain arrays, whose count of references shows a batch holding one."""
    pool = BufferPool(keep=2)
    a = pool.take((1 << 20,))
    assert a.base is not None and isinstance(a.base, np.ndarray)
    a[:] = 1
    b = pool.take((1 << 20,))
    b[:] = 2
    assert int(a[0]) == 1
