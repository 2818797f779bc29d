"""The episodes of many stores on one axis (read/episode_index.py): the values each store's
own columns give, and batches of a mixture equal to those read store by store."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atari_zarr import MultiGameDataset
from atari_zarr.read.core import ItemDataset
from atari_zarr.read.episode_index import EpisodeIndex
from atari_zarr.read.store import StoreReader, items_of

STORES = 7


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Converted runs of 90 to 330 steps in short episodes, of two games."""
    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert

    source, dest = tmp_path_factory.mktemp("index-source"), tmp_path_factory.mktemp("index")
    for g in range(STORES):
        game, run = ("Pong", "Breakout")[g % 2], str(g + 1)
        steps = 90 + 40 * g
        write_fixture_run(
            str(source), game, run, capacity=64, steps=steps, seed=g, max_episode_length=12
        )
    return [str(s.url) for s in convert(str(source), str(dest), progress=False)]


def _own(store: StoreReader, rows: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "episode": store.episode[rows],
        "first": store.first_row(rows),
        "done": store.done[rows],
        "terminated": store.terminated[rows],
        "truncated": store.truncated[rows],
    }


def test_every_row_of_every_store_as_its_own_columns_say(urls):
    stores = [StoreReader(u) for u in urls]
    index = EpisodeIndex(stores)
    which = np.concatenate([np.full(len(s), g) for g, s in enumerate(stores)])
    rows = np.concatenate([np.arange(len(s)) for s in stores])
    got = index.lookup(which, rows)
    for g, store in enumerate(stores):
        sel = which == g
        for name, want in _own(store, rows[sel]).items():
            np.testing.assert_array_equal(getattr(got, name)[sel], want, err_msg=f"{g} {name}")


def test_stores_join_the_index_as_batches_first_touch_them(urls):
    """Made from stores 1 and 4 first, then asked of every store, in any order: each row
    still answers for its own store (a store's rows never fall into its neighbour's)."""
    stores = [StoreReader(u) for u in urls]
    index = EpisodeIndex(stores)
    rng = np.random.default_rng(0)
    for touched in ([1, 4], [4], [0, 6, 1], list(range(STORES))):
        which = rng.choice(touched, 200)
        rows = np.array([rng.integers(0, len(stores[g])) for g in which])
        got = index.lookup(which, rows)
        for g in set(which.tolist()):
            sel = which == g
            for name, want in _own(stores[g], rows[sel]).items():
                np.testing.assert_array_equal(getattr(got, name)[sel], want)


def _old_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every store asked for its own episode values, as before the index."""
    monkeypatch.setattr(ItemDataset, "_episode_index", property(lambda self: None))


def _assert_same(new, old) -> None:
    assert set(new.keys(True, True)) == set(old.keys(True, True))
    for key in new.keys(True, True):
        assert torch.equal(new[key], old[key]), key


@pytest.mark.parametrize("stack", [1, 4])
def test_a_mixtures_transitions_equal_those_read_store_by_store(urls, monkeypatch, stack):
    mix = MultiGameDataset(urls, frame_stack=stack)
    items = np.random.default_rng(stack).integers(0, len(mix), 300)
    new = mix[items]
    assert mix._episode_index is not None  # the new way: one lookup for every store
    assert all(m.store.episodes_in_table for m in mix.members)
    _old_way(monkeypatch)
    _assert_same(new, MultiGameDataset(urls, frame_stack=stack)[items])


def test_a_mixtures_windows_equal_those_read_store_by_store(urls, monkeypatch):
    """Windows with padding, return-to-go and timesteps: the same either way."""
    wins = MultiGameDataset(urls, frame_stack=4).windows(6)
    items = np.random.default_rng(9).integers(0, len(wins), 120)
    new = wins[items]
    _old_way(monkeypatch)
    _assert_same(new, MultiGameDataset(urls, frame_stack=4).windows(6)[items])


def test_items_of_groups_a_batch_by_store_in_one_pass():
    which = np.random.default_rng(1).integers(0, 50, 1000)
    groups = items_of(which)
    assert list(groups) == sorted(set(which.tolist()))
    for g, sel in groups.items():
        np.testing.assert_array_equal(sel, np.flatnonzero(which == g))
