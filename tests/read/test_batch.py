"""The one batch builder: distinct frames, stacks as views, padding, the TED TensorDict."""

from __future__ import annotations

import numpy as np
import torch

from atari_zarr.read.batch import FrameBuffer, FramePlan, item_fields, ted_batch
from atari_zarr.read.pool import BufferPool


def test_plan_of_windows_with_stacks_and_padding():
    plan = FramePlan(
        starts=np.array([5, 20]),
        length=3,
        stack=2,
        first=np.array([5, 19]),
        last_done=np.array([False, True]),
        n_rows=100,
        valid=np.array([3, 2]),
    )
    assert plan.rows.tolist() == [[4, 5, 6, 7, 8], [19, 20, 21, 22, 23]]
    # item 0: the frame before its episode is padding; the frame after its last row exists
    # item 1: two real rows, then its episode ended: nothing after
    assert plan.valid.tolist() == [
        [False, True, True, True, True],
        [True, True, True, False, False],
    ]
    assert plan.next_pos.tolist() == [4, 3] and plan.padded


def test_the_end_of_the_store_has_no_next_frame():
    plan = FramePlan(
        starts=np.array([9]),
        length=1,
        stack=1,
        first=np.array([0]),
        last_done=np.array([False]),
        n_rows=10,
    )
    assert plan.valid.tolist() == [[True, False]]


def test_window_stacks_are_strided_views_of_the_distinct_frames():
    pool = BufferPool()
    buf = FrameBuffer(pool, batch=2, length=4, stack=3, frame_shape=(2, 2))
    buf.frames[:] = np.arange(len(buf.frames), dtype=np.uint8)[:, None, None]
    obs, nxt = buf.views()
    assert obs.shape == (2, 4, 3, 2, 2) and nxt.shape == (2, 4, 3, 2, 2)
    # item 1, step 2: frames 2, 3, 4 of item 1 (row 7 of the buffer = 1 * 7 + 2 ...)
    assert obs[1, 2, :, 0, 0].tolist() == [9, 10, 11]
    assert nxt[1, 2, :, 0, 0].tolist() == [10, 11, 12]
    assert obs.untyped_storage().data_ptr() == nxt.untyped_storage().data_ptr()


def test_single_transitions_keep_two_contiguous_blocks():
    buf = FrameBuffer(BufferPool(), batch=3, length=1, stack=1, frame_shape=(2, 2))
    rows = np.array([[10, 11], [20, 21], [30, 31]])
    buf.frames[:] = buf.flat(rows)[:, None, None]
    obs, nxt = buf.views()
    assert obs.is_contiguous() and nxt.is_contiguous()
    assert obs[:, 0, 0].tolist() == [10, 20, 30] and nxt[:, 0, 0].tolist() == [11, 21, 31]
    w_obs, _ = buf.views(window=True)
    assert w_obs.shape == (3, 1, 2, 2)


def test_padding_fields_are_zeros_and_minus_one():
    rows = np.array([[4, 5, 6], [9, 10, 11]])
    exists = np.array([[True, True, True], [True, False, False]])
    steps = {"action": np.array([1, 2, 3, 4, 4, 4]), "reward": np.ones(6, np.float32)}
    fields = item_fields(rows, exists, steps, window=True)
    assert fields["action"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert fields["index"].tolist() == [[4, 5, 6], [9, -1, -1]]
    assert fields["mask"].tolist() == exists.tolist()


def test_ted_batch_shapes():
    z = torch.zeros(2, 3, 84, 84, dtype=torch.uint8)
    td = ted_batch(
        z,
        z,
        action=np.zeros((2, 3)),
        reward=np.zeros((2, 3), np.float32),
        terminated=np.zeros((2, 3), bool),
        truncated=np.zeros((2, 3), bool),
        episode=np.zeros((2, 3)),
        index=np.zeros((2, 3)),
        extra={"mask": np.ones((2, 3), bool)},
    )
    assert td.batch_size == (2, 3) and td["next", "reward"].shape == (2, 3, 1)
    assert td["action"].dtype == torch.int64 and td["mask"].dtype == torch.bool
    td["done"][0, 0] = True  # the three flags are separate tensors
    assert not td["terminated"].any()
