"""Conversion options: presets, limits, full-space actions and return-to-go, against fixture truth."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.conversion.derived import return_to_go
from atari_zarr.errors import InvalidArgumentError, SourceFormatError, SourceNotFoundError
from atari_zarr.info import format_info, store_info
from atari_zarr.layout import (
    ACTION,
    ACTION_FULL,
    ATTRS_KEY,
    EPISODE,
    OBSERVATION,
    RETURN_TO_GO,
    REWARD,
    TERMINATED,
    TRUNCATED,
)
from atari_zarr.sources.dqn_replay.selection import CHECKPOINT_PRESETS
from atari_zarr.testing import Truth, write_fixture_run


def cut(truth: Truth, n: int) -> Truth:
    """The first ``n`` rows of ``truth``, the last one ending its episode."""
    terminated = truth.terminated[:n].copy()
    truncated = truth.truncated[:n].copy()
    truncated[-1] = not terminated[-1]
    return Truth(
        truth.observation[:n], truth.action[:n], truth.reward[:n], terminated, truncated,
        truth.episode[:n], truth.source_row[:n],
    )


def assert_matches(url: str, truth: Truth) -> None:
    g = zarr.open_group(url, mode="r")
    np.testing.assert_array_equal(g[OBSERVATION][:], truth.observation)
    np.testing.assert_array_equal(g[ACTION][:], truth.action)
    np.testing.assert_array_equal(g[REWARD][:], truth.reward)
    np.testing.assert_array_equal(g[TERMINATED][:], truth.terminated)
    np.testing.assert_array_equal(g[TRUNCATED][:], truth.truncated)
    np.testing.assert_array_equal(g[EPISODE][:], truth.episode)
    meta = g.attrs[ATTRS_KEY]
    assert meta["complete"] is True
    # per-episode statistics agree with the rows
    ends = np.flatnonzero(truth.terminated | truth.truncated)
    starts = np.r_[0, ends[:-1] + 1]
    assert meta["episodes"]["length"] == (ends - starts + 1).tolist()
    np.testing.assert_allclose(
        meta["episodes"]["return"],
        [float(truth.reward[a : b + 1].astype(np.float64).sum()) for a, b in zip(starts, ends)],
    )
    assert meta["episodes"]["terminated"] == truth.terminated[ends].tolist()
    assert meta["counts"]["transitions"] == len(truth)
    assert meta["counts"]["episodes"] == len(ends)


def test_presets_are_d4rl_atari_checkpoints(source_root, dest_root):
    assert CHECKPOINT_PRESETS == {"mixed": [1], "medium": [10], "expert": [50]}
    pong_run = write_fixture_run(str(source_root), "Pong", "1", capacity=32, steps=450, seed=3,
                                 max_episode_length=25)
    assert 10 in pong_run.suffixes and 50 not in pong_run.suffixes
    [store] = convert(str(source_root), str(dest_root), checkpoints="medium", progress=False)
    assert_matches(store.url, pong_run.truth([10]))
    [store] = convert(
        str(source_root), str(dest_root), checkpoints="mixed", progress=False, overwrite=True
    )
    assert_matches(store.url, pong_run.truth([1]))
    # the fixture has fewer than 51 checkpoints: the error names what exists
    with pytest.raises(SourceNotFoundError, match=r"checkpoints \[50\].*choose among"):
        convert(str(source_root), str(dest_root), checkpoints="expert", progress=False,
                overwrite=True)


@pytest.mark.parametrize("where", ["mid-episode", "episode-end", "lap-end", "one"])
def test_max_transitions(pong_run, source_root, dest_root, where):
    truth = pong_run.truth()
    ends = np.flatnonzero(truth.terminated)
    laps = convert(str(source_root), str(dest_root / "all"), progress=False)
    g = zarr.open_group(laps[0].url, mode="r")
    lap_ends = [c["first_transition"] + c["transitions"]
                for c in g.attrs[ATTRS_KEY]["conversion"]["checkpoints"]]
    n = {
        "mid-episode": int(ends[5]) - 2,  # inside a terminated episode
        "episode-end": int(ends[7]) + 1,  # right after a terminal row
        "lap-end": lap_ends[3],
        "one": 1,
    }[where]
    [store] = convert(str(source_root), str(dest_root), max_transitions=n, progress=False)
    expected = cut(truth, n)
    assert store.transitions == n
    assert_matches(store.url, expected)
    if where == "episode-end":
        assert expected.terminated[-1] and not expected.truncated[-1]
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    assert meta["conversion"]["dropped_rows"]["over_limit"] == len(truth) - n
    assert f"--max-transitions {n}" in meta["command"]
    assert meta["selection"]["max_transitions"] == n
    # the reader agrees, and nothing beyond the cut is written
    ds = AtariZarrDataset(store.url)
    assert len(ds) == n and bool(ds[n - 1]["next", "done"])


def test_max_episodes_and_both_limits(pong_run, source_root, dest_root):
    truth = pong_run.truth()
    ep_end = np.flatnonzero(truth.terminated | truth.truncated)
    [store] = convert(str(source_root), str(dest_root), max_episodes=6, progress=False)
    assert_matches(store.url, cut(truth, int(ep_end[5]) + 1))
    assert store.episodes == 6
    # whichever limit comes first
    [store] = convert(str(source_root), str(dest_root / "b"), max_episodes=6,
                      max_transitions=int(ep_end[5]) - 3, progress=False)
    assert_matches(store.url, cut(truth, int(ep_end[5]) - 3))
    [store] = convert(str(source_root), str(dest_root / "c"), max_episodes=10_000,
                      max_transitions=10**9, progress=False)
    assert_matches(store.url, truth)
    with pytest.raises(InvalidArgumentError, match="max_episodes must be a positive number"):
        convert(str(source_root), str(dest_root / "d"), max_episodes=0, progress=False)


def test_limit_with_selected_checkpoints(pong_run, source_root, dest_root):
    truth = pong_run.truth([2, 3, 4])
    [store] = convert(str(source_root), str(dest_root), checkpoints="2-4", max_transitions=100,
                      progress=False)
    assert_matches(store.url, cut(truth, 100))


def test_return_to_go_is_the_sum_to_the_episode_end(pong_run, source_root, dest_root):
    [store] = convert(str(source_root), str(dest_root), return_to_go=True, progress=False)
    truth = pong_run.truth()
    rtg = zarr.open_group(store.url, mode="r")[RETURN_TO_GO][:]
    # hand computation, row by row
    expected = np.zeros(len(truth))
    running = 0.0
    for i in range(len(truth) - 1, -1, -1):
        if truth.terminated[i] or truth.truncated[i]:
            running = 0.0
        running += float(truth.reward[i])
        expected[i] = running
    np.testing.assert_array_equal(rtg, expected.astype(np.float32))
    # one episode spelled out: its first row holds the episode's return
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    first_of_ep3 = int(np.flatnonzero(truth.episode == 3)[0])
    assert rtg[first_of_ep3] == pytest.approx(meta["episodes"]["return"][3])
    assert meta["derived"]["return_to_go"]["discount"] == 1.0


def test_return_to_go_across_blocks():
    rng = np.random.default_rng(0)
    reward = rng.choice([-1.0, 0.0, 1.0], 1000)
    done = rng.random(1000) < 0.01
    whole = return_to_go(reward, done)
    # computed in blocks from the end, carrying into the previous block
    parts, carry = [], 0.0
    for lo in range(900, -1, -100):
        part = return_to_go(reward[lo : lo + 100], done[lo : lo + 100], carry)
        parts.insert(0, part)
        carry = float(part[0])
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_action_full_agrees_with_ale(pong_run, source_root, dest_root):
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    [store] = convert(str(source_root), str(dest_root), full_action_space=True, progress=False)
    g = zarr.open_group(store.url, mode="r")
    minimal = gymnasium.make("ALE/Pong-v5")
    full = gymnasium.make("ALE/Pong-v5", full_action_space=True)
    try:
        min_set = [a.value for a in minimal.unwrapped.ale.getMinimalActionSet()]
        full_set = [a.value for a in full.unwrapped.ale.getLegalActionSet()]
    finally:
        minimal.close()
        full.close()
    assert len(full_set) == 18
    action = g[ACTION][:]
    assert set(np.unique(action)) == set(range(6))  # every Pong action occurs
    # the full-space index that performs the same ALE action as the minimal index
    expected = np.array([full_set.index(min_set[a]) for a in action], dtype=np.int32)
    np.testing.assert_array_equal(g[ACTION_FULL][:], expected)
    assert g.attrs[ATTRS_KEY]["derived"]["action_full"]["minimal_action_set"] == min_set


def test_action_full_refuses_actions_outside_the_minimal_set(source_root, dest_root):
    write_fixture_run(str(source_root), "Pong", "1", capacity=64, steps=200,
                      actions=lambda k: 17 if k == 50 else 0)
    with pytest.raises(SourceFormatError, match="has action 17.*6 actions"):
        convert(str(source_root), str(dest_root), full_action_space=True, progress=False)


def test_info_shows_episode_statistics(pong_run, source_root, dest_root):
    [store] = convert(str(source_root), str(dest_root), return_to_go=True, progress=False)
    info = store_info(store.url)
    truth = pong_run.truth()
    ends = np.flatnonzero(truth.terminated | truth.truncated)
    lengths = np.diff(np.r_[-1, ends])
    assert info["length_min"] == lengths.min() and info["length_max"] == lengths.max()
    assert len(info["episode_list"]) == len(ends)
    assert info["optional_arrays"] == [RETURN_TO_GO]
    text = format_info(info, episodes=True)
    assert "lengths      mean" in text and "optional     return_to_go" in text
    assert text.count("terminated") >= int(truth.terminated.sum())
