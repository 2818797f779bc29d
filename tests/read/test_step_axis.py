"""Actions and rewards of many stores on one axis (read/step_axis.py): the values each
store's own columns give, loaded lazily, and a store that cannot be on it read alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr

from atari_zarr import MultiGameDataset
from atari_zarr.read.columns import StepColumn
from atari_zarr.read.step_axis import StepAxis
from atari_zarr.read.store import StoreReader


class _Steps:
    """What the axis asks of a store: its length and its action and reward columns."""

    def __init__(self, n: int, seed: int, chunk: int = 8) -> None:
        rng = np.random.default_rng(seed)
        self.actions = rng.integers(0, 18, n).astype(np.int32)
        self.rewards = rng.integers(-1, 2, n).astype(np.float32)
        self.action = StepColumn(self._array(self.actions, chunk), where=f"actions {seed}")
        self.reward = StepColumn(self._array(self.rewards, chunk), where=f"rewards {seed}")

    @staticmethod
    def _array(values: np.ndarray, chunk: int) -> zarr.Array:
        a = zarr.create_array({}, shape=values.shape, chunks=(chunk,), dtype=values.dtype)
        a[:] = values
        return a

    def __len__(self) -> int:
        return len(self.actions)


def test_values_are_each_stores_own_loaded_as_first_asked():
    """Random rows of five stores, over many batches: every value is its store's, each
    chunk is loaded once, by its store, when a batch first asks for one of its rows."""
    stores = [_Steps(40 + 13 * g, seed=g) for g in range(5)]
    axis = StepAxis(stores)
    rng = np.random.default_rng(0)
    for _ in range(30):
        which = rng.integers(0, 5, 16)
        rows = np.array([rng.integers(0, len(stores[w])) for w in which])
        got = axis.values(which, rows, ["action", "reward"])
        assert got is not None
        assert got["action"].dtype == np.int32 and got["reward"].dtype == np.float32
        for name, attr in (("action", "actions"), ("reward", "rewards")):
            want = [getattr(stores[w], attr)[r] for w, r in zip(which, rows, strict=True)]
            np.testing.assert_array_equal(got[name], want)
    # the values live on the axis, compact: one int8 array for all stores
    col = axis._columns["action"]
    assert col.values.dtype == np.int8 and len(col.values) == sum(len(s) for s in stores)
    assert col.on.all() and 0 < col.loaded.sum() <= len(col.loaded)
    assert all(np.shares_memory(s.action._values, col.values) for s in stores)


def test_a_store_whose_values_widen_leaves_the_axis_and_reads_right():
    """A reward of 0.5 in a chunk first loaded through the axis: that store's values move
    to arrays of its own (float32), batches touching it are read store by store, and
    the values stay right, on the axis and off it."""
    stores = [_Steps(64, seed=g) for g in range(3)]
    stores[1].rewards[50] = 0.5
    stores[1].reward = StepColumn(_Steps._array(stores[1].rewards, 8), where="rewards 1")
    axis = StepAxis(stores)
    first = axis.values(np.array([0, 1, 2]), np.array([3, 4, 5]), ["reward"])
    assert first is not None and first["reward"].tolist() == [
        stores[0].rewards[3],
        stores[1].rewards[4],
        stores[2].rewards[5],
    ]
    # the chunk holding 0.5 is loaded now: the store leaves the axis, the batch is refused
    assert axis.values(np.array([1, 0]), np.array([50, 9]), ["reward"]) is None
    assert stores[1].reward._values.dtype == np.float32
    np.testing.assert_array_equal(stores[1].reward[np.array([50, 4])], stores[1].rewards[[50, 4]])
    # the others stay on it
    got = axis.values(np.array([0, 2]), np.array([60, 61]), ["reward"])
    assert got is not None
    assert got["reward"].tolist() == [stores[0].rewards[60], stores[2].rewards[61]]


def test_a_store_twice_in_one_mixture_is_read_by_itself():
    """One store's columns can be on one axis once: the second place is read alone."""
    store = _Steps(32, seed=0)
    axis = StepAxis([store, store])
    assert axis.values(np.array([0, 1]), np.array([1, 2]), ["action"]) is None


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Six converted runs of 90 to 290 steps, of two games."""
    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert

    source, dest = tmp_path_factory.mktemp("axis-source"), tmp_path_factory.mktemp("axis")
    for g in range(6):
        game, run = ("Pong", "Breakout")[g % 2], str(g + 1)
        write_fixture_run(str(source), game, run, capacity=64, steps=90 + 40 * g, seed=g)
    return [str(s.url) for s in convert(str(source), str(dest), progress=False)]


def test_a_mixtures_batches_take_actions_and_rewards_from_the_axis(urls, monkeypatch):
    """A mixture's batches ask no store for its actions or rewards, and give what
    reading each item from its own store gives."""
    mix = MultiGameDataset(urls)
    asked: list[list[str] | None] = []
    real = StoreReader.step_values

    def step_values(self, rows, window, names=None):
        asked.append(names)
        return real(self, rows, window, names)

    monkeypatch.setattr(StoreReader, "step_values", step_values)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        assert mix.sample(64, generator=gen)["action"].shape == (64,)
    assert asked == []
    # each item as its own store reads it
    items = np.random.default_rng(1).integers(0, len(mix), 50)
    batch = mix[items]
    monkeypatch.undo()
    for k, item in enumerate(items.tolist()):
        one = mix[item]
        assert int(batch["action"][k]) == int(one["action"])
        assert float(batch["next", "reward"][k]) == float(one["next", "reward"])
