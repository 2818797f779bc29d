"""Selections: presets, checkpoints and limits, against the truth of fixture runs."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import Truth, write_fixture_run

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import InvalidArgumentError, SourceNotFoundError
from atari_zarr.layout import (
    ACTION,
    ATTRS_KEY,
    EPISODE,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
)
from atari_zarr.sources.dqn_replay.files import RunSource
from atari_zarr.sources.dqn_replay.planner import plan_run
from atari_zarr.sources.dqn_replay.selection import build_plan, limit_plan
from atari_zarr.sources.selection import CHECKPOINT_PRESETS, Selection, parse_checkpoints


def cut(truth: Truth, n: int) -> Truth:
    """The first ``n`` rows of ``truth``, the last one ending its episode."""
    terminated = truth.terminated[:n].copy()
    truncated = truth.truncated[:n].copy()
    truncated[-1] = not terminated[-1]
    return Truth(
        truth.observation[:n],
        truth.action[:n],
        truth.reward[:n],
        terminated,
        truncated,
        truth.episode[:n],
        truth.source_row[:n],
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
        [
            float(truth.reward[a : b + 1].astype(np.float64).sum())
            for a, b in zip(starts, ends, strict=True)
        ],
    )
    assert meta["episodes"]["terminated"] == truth.terminated[ends].tolist()
    assert meta["counts"]["transitions"] == len(truth)
    assert meta["counts"]["episodes"] == len(ends)


def test_presets_are_d4rl_atari_checkpoints(source_root, dest_root):
    assert CHECKPOINT_PRESETS == {"mixed": [1], "medium": [10], "expert": [50]}
    pong_run = write_fixture_run(
        str(source_root), "Pong", "1", capacity=32, steps=450, seed=3, max_episode_length=25
    )
    assert 10 in pong_run.suffixes and 50 not in pong_run.suffixes
    [store] = convert(str(source_root), str(dest_root), checkpoints="medium", progress=False)
    assert_matches(store.url, pong_run.truth([10]))
    [store] = convert(
        str(source_root), str(dest_root), checkpoints="mixed", progress=False, overwrite=True
    )
    assert_matches(store.url, pong_run.truth([1]))
    # the fixture has fewer than 51 checkpoints: the error names what exists
    with pytest.raises(SourceNotFoundError, match=r"checkpoints 50 .*choose among"):
        convert(
            str(source_root), str(dest_root), checkpoints="expert", progress=False, overwrite=True
        )


@pytest.mark.parametrize("where", ["mid-episode", "episode-end", "lap-end", "one"])
def test_max_transitions(pong_run, source_root, dest_root, where):
    truth = pong_run.truth()
    ends = np.flatnonzero(truth.terminated)
    plan = build_plan(RunSource(pong_run.url, "Pong", "1"))
    lap_ends = [lap.out_start + lap.n_out for lap in plan.laps]
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
    [store] = convert(
        str(source_root),
        str(dest_root / "b"),
        max_episodes=6,
        max_transitions=int(ep_end[5]) - 3,
        progress=False,
    )
    assert_matches(store.url, cut(truth, int(ep_end[5]) - 3))
    [store] = convert(
        str(source_root),
        str(dest_root / "c"),
        max_episodes=10_000,
        max_transitions=10**9,
        progress=False,
    )
    assert_matches(store.url, truth)
    with pytest.raises(InvalidArgumentError, match="max_episodes must be a positive number"):
        convert(str(source_root), str(dest_root / "d"), max_episodes=0, progress=False)


def test_limit_with_selected_checkpoints(pong_run, source_root, dest_root):
    truth = pong_run.truth([2, 3, 4])
    [store] = convert(
        str(source_root), str(dest_root), checkpoints="2-4", max_transitions=100, progress=False
    )
    assert_matches(store.url, cut(truth, 100))


def test_selection_records_what_was_asked_for():
    sel = Selection(range(2, 5), max_transitions=100)
    assert sel.checkpoints == (2, 3, 4)
    assert sel.attributes() == {
        "checkpoints": [2, 3, 4],
        "max_transitions": 100,
        "max_episodes": None,
    }
    # what a store records gives back the same selection (after a JSON round trip)
    assert Selection.from_attributes(sel.attributes()) == sel
    assert Selection.from_attributes({}) == Selection()
    assert Selection("expert,1-2").suffixes(range(60)) == [1, 2, 50]
    assert Selection("all").suffixes(range(3)) is None
    for bad in ({"max_transitions": 0}, {"max_episodes": -2}):
        with pytest.raises(InvalidArgumentError, match="must be a positive number"):
            Selection(**bad)
    with pytest.raises(SourceNotFoundError, match=r"checkpoints 50 were asked for"):
        Selection("expert").suffixes(range(3))


def test_build_plan_is_the_plan_then_the_limits(pong_run):
    src = RunSource(pong_run.url, "Pong", "1")
    sel = Selection("2-6", max_transitions=150, max_episodes=5)
    expected = limit_plan(plan_run(src, [2, 3, 4, 5, 6]), src, max_transitions=150, max_episodes=5)
    plan = build_plan(src, sel)
    assert plan.attributes() == expected.attributes()
    assert plan.episodes.as_attributes() == expected.episodes.as_attributes()
    assert plan.n_rows == min(150, expected.episodes.transitions) <= 150
    assert build_plan(src).n_rows == len(pong_run.truth())


def test_parse_checkpoints():
    assert parse_checkpoints("0-3,7", range(10)) == [0, 1, 2, 3, 7]
    assert parse_checkpoints("all", range(3)) is None
    with pytest.raises(InvalidArgumentError, match="not a suffix or a range"):
        parse_checkpoints("1-x", range(3))
    with pytest.raises(SourceNotFoundError, match=r"checkpoints 9 were asked for"):
        parse_checkpoints("9", range(3))
