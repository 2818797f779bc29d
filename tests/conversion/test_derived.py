"""Derived arrays: return-to-go and full-space actions, against fixture truth."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import write_fixture_run

from atari_zarr import convert
from atari_zarr.episodes import return_to_go
from atari_zarr.errors import SourceFormatError
from atari_zarr.info import format_info, store_info
from atari_zarr.layout import ACTION, ACTION_FULL, ATTRS_KEY, RETURN_TO_GO


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
    write_fixture_run(
        str(source_root),
        "Pong",
        "1",
        capacity=64,
        steps=200,
        actions=lambda k: 17 if k == 50 else 0,
    )
    with pytest.raises(SourceFormatError, match=r"has action 17.*6 actions"):
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
