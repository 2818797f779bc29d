"""Batch memory is reused only once nothing refers to it."""

from __future__ import annotations

import numpy as np
import torch

from atari_zarr.read.pool import BufferPool


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
