"""One budget per dataset and process (read/budget.py): shared by its stores, passed down
explicitly, empty again in a process that unpickles it or is forked."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time

import numpy as np
import pytest
import torch

from atari_zarr import MultiGameDataset
from atari_zarr.read.budget import Budget

SHAPE = (16, 84, 84)


def test_one_cache_per_chunk_shape_and_one_kept_cache() -> None:
    budget = Budget()
    a = budget.frame_cache(SHAPE, np.dtype("uint8"))
    assert budget.frame_cache(SHAPE, np.dtype("uint8")) is a
    assert budget.frame_cache((8, 84, 84), np.dtype("uint8")) is not a
    assert Budget().frame_cache(SHAPE, np.dtype("uint8")) is not a  # another dataset's
    assert budget.kept() is budget.kept() and budget.kept().max_bytes == 0


def test_a_mixtures_stores_share_its_budget_and_a_pickle_of_it_shares_a_new_one(
    pong_store,
) -> None:
    mix = MultiGameDataset([pong_store.url] * 3)
    budgets = {id(m.store.options.budget) for m in mix.members}
    assert len(budgets) == 1 and None not in {m.store.options.budget for m in mix.members}
    caches = {id(m.store.open().frames._cache) for m in mix.members}
    assert len(caches) == 1
    again = pickle.loads(pickle.dumps(mix))
    theirs = {id(m.store.options.budget) for m in again.members}
    assert len(theirs) == 1 and theirs != budgets  # one, new, for all of its stores
    again.sample(8)
    assert len({id(m.store.frames._cache) for m in again.members}) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_an_empty_budget(pong_store) -> None:
    """The parent's cache is its share and its threads stay behind: a forked child's
    readers make their own cache and pools, with one hook run at the fork, and the
    parent's cache is left as it was."""
    mix = MultiGameDataset([pong_store.url] * 2)
    mix.sample(64)
    parent = mix.members[0].store.frames._cache
    held = parent.held(mix.members[0].store.frames._token)
    assert held > 0
    mix.members[0].store.frames._executor()  # the parent's decoding threads
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once
        try:
            torch.set_num_threads(1)  # as a DataLoader worker does
            frames = mix.members[0].store.frames
            fresh = frames._cache is None and mix.members[0].store.options.budget._caches == {}
            fresh = fresh and frames._pool is None  # no pool whose threads stayed behind
            mix[np.arange(0, 64)]  # rows of the first store, no random draw
            own = frames._cache is not None and frames._cache is not parent
            os.write(write, b"ok" if fresh and own else b"no")
        finally:
            os._exit(0)
    os.close(write)
    done = 0
    for _ in range(1200):  # a child that hangs fails the test, never the suite
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    if not done:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    got = os.read(read, 2)
    assert got == b"ok"
    assert mix.members[0].store.frames._cache is parent
    assert parent.held(mix.members[0].store.frames._token) == held
    assert sys.modules["atari_zarr.forks"]._HOOKS  # the one place forks are handled
