"""AtariZarrDataset as a map-style Dataset: frame stacking, ``__getitems__``, DataLoader workers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from atari_zarr import AtariZarrDataset
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.dataset import collate_batch


@pytest.fixture
def converted(pong_store, pong_truth):
    """The session's Pong/1 store (read-only here) and its truth."""
    return pong_store, pong_truth


def expected_stacks(truth, rows, k):
    """Stacks built the slow, obvious way from the ground truth."""
    done = truth.terminated | truth.truncated
    zero = np.zeros_like(truth.observation[0])
    obs, nxt = [], []
    for r in rows:
        same = lambda j, r=r: 0 <= j < len(truth) and truth.episode[j] == truth.episode[r]  # noqa: E731
        obs.append([truth.observation[j] if same(j) else zero for j in range(r - k + 1, r + 1)])
        stack = [truth.observation[j] if same(j) else zero for j in range(r - k + 2, r + 1)]
        stack.append(zero if done[r] else truth.observation[r + 1])
        nxt.append(stack)
    return np.array(obs), np.array(nxt)


@pytest.mark.parametrize("k", [2, 4])
def test_frame_stack_matches_truth_for_every_row(converted, k):
    store, truth = converted
    ds = AtariZarrDataset(store.url, frame_stack=k)
    rows = np.arange(len(ds))
    b = ds[rows]
    exp_obs, exp_next = expected_stacks(truth, rows, k)
    assert b["observation"].shape == (len(ds), k, 84, 84)
    np.testing.assert_array_equal(b["observation"].numpy(), exp_obs)
    np.testing.assert_array_equal(b["next", "observation"].numpy(), exp_next)
    # the fixture has episode starts, so padding really happened
    starts = np.flatnonzero(np.diff(truth.episode, prepend=-1))
    assert len(starts) > 3
    assert not b["observation"][torch.from_numpy(starts), : k - 1].any()


def test_frame_stack_newest_frame_is_the_unstacked_observation(converted):
    store, _ = converted
    rows = np.array([5, 0, 5, 17, 3])  # any order, repeats
    flat = AtariZarrDataset(store.url)[rows]
    stacked = AtariZarrDataset(store.url, frame_stack=4)[rows]
    assert torch.equal(stacked["observation"][:, -1], flat["observation"])
    assert torch.equal(stacked["next", "observation"][:, -1], flat["next", "observation"])
    assert stacked[1]["observation"].shape == (4, 84, 84)


def test_frame_stack_uses_one_frame_fetch(converted, monkeypatch):
    store, _ = converted
    ds = AtariZarrDataset(store.url, frame_stack=4)
    calls = []
    frames = ds._store.frames
    original = frames.read
    monkeypatch.setattr(
        frames, "read", lambda rows, out=None: calls.append(len(rows)) or original(rows, out)
    )
    ds[np.arange(0, 40, 3)]
    assert len(calls) == 1


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_frame_stack_must_be_a_positive_int(converted, bad):
    store, _ = converted
    with pytest.raises(InvalidArgumentError, match="frame_stack must be a positive integer"):
        AtariZarrDataset(store.url, frame_stack=bad)


def test_getitems_is_the_batched_path(converted):
    store, _ = converted
    ds = AtariZarrDataset(store.url)
    batch = ds.__getitems__([4, 2, 9])
    assert batch["index"].tolist() == [4, 2, 9]
    assert collate_batch(batch) is batch
    stacked = collate_batch([ds[4], ds[2]])
    assert stacked["index"].tolist() == [4, 2]


def test_getitems_never_rounds_nor_casts_an_index(converted):
    """``__getitems__([1.5, 2])`` read rows 1 and 2 (cast to int64 before the check)."""
    store, _ = converted
    ds = AtariZarrDataset(store.url)
    for bad in ([1.5, 2], ["3"], [2.0]):
        with pytest.raises(TypeError, match="indices must be integers") as err:
            ds.__getitems__(bad)
        assert "\n" not in str(err.value)
    assert ds.__getitems__((4, -1))["index"].tolist() == [4, len(ds) - 1]


def test_pickle_keeps_frame_stack(converted):
    store, _ = converted
    ds = pickle.loads(pickle.dumps(AtariZarrDataset(store.url, frame_stack=3)))
    assert ds.frame_stack == 3
    assert ds[[7]]["observation"].shape == (1, 3, 84, 84)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers_return_correct_frames(converted, context):
    store, truth = converted
    ds = AtariZarrDataset(store.url, frame_stack=2)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=32,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=collate_batch,
        generator=torch.Generator().manual_seed(0),
    )
    seen = []
    for batch in loader:
        rows = batch["index"].numpy()
        seen.append(rows)
        exp_obs, exp_next = expected_stacks(truth, rows, 2)
        np.testing.assert_array_equal(batch["observation"].numpy(), exp_obs)
        np.testing.assert_array_equal(batch["next", "observation"].numpy(), exp_next)
        np.testing.assert_array_equal(batch["action"].numpy(), truth.action[rows])
        np.testing.assert_array_equal(batch["next", "reward"].numpy()[:, 0], truth.reward[rows])
    assert sorted(np.concatenate(seen).tolist()) == list(range(len(truth)))
