"""Planning an RL Unplugged store from its scans: offsets, ids, limits, gaps, returns."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from atari_zarr.layout import ACTION, EPISODE, REWARD, SOURCE_ROW, TERMINATED, TRUNCATED
from atari_zarr.sources.rl_unplugged.planner import (
    SHARD_STRIDE,
    check_returns,
    plan_shards,
    return_disagreements,
    scans_needed,
)
from atari_zarr.sources.rl_unplugged.rows import shard_step_arrays
from atari_zarr.sources.rl_unplugged.scan import ShardScan


def make_scan(index: int, real: list[int], terminal: list[bool], seed: int = 0) -> ShardScan:
    """A scan of ``len(real)`` records with these real steps (terminal ones have one more)."""
    rng = np.random.default_rng(seed + index)
    n = sum(real)
    reward = rng.integers(-1, 2, n).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(real)])
    sums = np.array([reward[a:b].sum() for a, b in itertools.pairwise(offsets)], np.float64)
    return ShardScan(
        index=index,
        steps=np.array(real) + np.array(terminal, int),
        real=np.array(real, np.int64),
        terminal=np.array(terminal, bool),
        checkpoint_idx=np.full(len(real), index, np.int64),
        episode_idx=np.arange(len(real), dtype=np.int64) + 100 * index,
        episode_return=sums * 2,
        clipped_episode_return=sums.copy(),
        has_clipped=np.ones(len(real), bool),
        unclipped_sum=sums * 2,
        clipped_sum=sums,
        action=rng.integers(0, 6, n).astype(np.int64),
        reward=reward,
        unclipped_reward=reward * 2,
    )


SCANS = {
    0: make_scan(0, [5, 3, 4], [True, True, False]),
    2: make_scan(2, [6, 0, 2], [True, True, False]),  # record 1: a terminal frame alone
    3: make_scan(3, [4], [False]),
}


def plan(**limits):
    return plan_shards(SCANS, num_shards=4, present=[0, 2, 3], selected=[0, 2, 3], **limits)


def test_offsets_ids_and_gaps():
    p = plan()
    assert p.n_rows == 24 and p.n_episodes == 6
    assert [(s.index, s.out_start, s.rows, s.first_episode) for s in p.parts] == [
        (0, 0, 12, 0),
        (2, 12, 8, 3),
        (3, 20, 4, 5),
    ]
    assert p.episodes.length == [5, 3, 4, 6, 2, 4]
    assert p.episodes.terminated == [True, True, False, True, False, False]
    assert p.dropped["no_real_step"] == 1
    assert p.gaps == [{"from_shard": 1, "to_shard": 2, "shards": 1, "absent": [1]}]
    assert p.table["episode_idx"] == [0, 1, 2, 200, 202, 300]
    steps = shard_step_arrays(p.parts[1], SCANS[2])
    assert steps[EPISODE].tolist() == [3] * 6 + [4] * 2
    assert np.flatnonzero(steps[TERMINATED]).tolist() == [5]
    assert np.flatnonzero(steps[TRUNCATED]).tolist() == [7]
    # source rows count the Example steps of the shard: record 1 had one (terminal) step
    assert (steps[SOURCE_ROW] - 2 * SHARD_STRIDE).tolist() == [0, 1, 2, 3, 4, 5, 8, 9]
    assert np.array_equal(steps[ACTION], SCANS[2].action)
    assert np.array_equal(steps[REWARD], SCANS[2].reward)
    assert p.returns_check["episode_return"] == {"checked": 6, "disagree": 0, "first": []}


def test_limits():
    p = plan(max_episodes=4)
    assert p.n_rows == 18 and p.n_episodes == 4 and [s.index for s in p.parts] == [0, 2]
    assert p.episodes.terminated[-1]  # kept whole
    p = plan(max_transitions=15)  # cuts the first episode of shard 2 after 3 rows
    assert p.n_rows == 15 and p.episodes.length == [5, 3, 4, 3]
    assert p.episodes.terminated == [True, True, False, False]
    assert p.episodes.returns[-1] == pytest.approx(float(SCANS[2].reward[:3].sum()))
    steps = shard_step_arrays(p.parts[-1], SCANS[2])
    assert steps[TRUNCATED].tolist() == [False, False, True]
    p = plan(max_transitions=18)  # exactly at the end of a terminal episode
    assert p.episodes.terminated[-1] and p.parts[-1].cut_rows is None


def test_scans_needed_stop_at_the_limits():
    assert scans_needed([0, 2, 3], {}, max_transitions=10, batch=2) == [0, 2]
    assert scans_needed([0, 2, 3], {0: (12, 3)}, max_transitions=10) == []
    assert scans_needed([0, 2, 3], {0: (12, 3)}, max_episodes=5, batch=4) == [2, 3]
    assert scans_needed([0, 2, 3], {0: (12, 3), 2: (8, 2)}) == [3]


def test_return_disagreements():
    bad = make_scan(0, [5, 3], [True, False])
    bad.episode_return[1] = 99.0
    bad.clipped_episode_return[:] = np.nan  # absent: not checked
    check = check_returns([(bad, 2)])
    assert check["episode_return"]["disagree"] == 1
    assert check["clipped_episode_return"] == {"checked": 0, "disagree": 0, "first": []}
    [line] = return_disagreements({"conversion": {"returns_check": check}})
    assert line.startswith("1 of 2 episode_return values differ") and "record 1" in line
    assert return_disagreements({"kind": "dqn-replay"}) == []
