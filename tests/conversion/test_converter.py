"""The converter against the ground truth of fixture runs."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import Truth, store_files, write_fixture_run
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from atari_zarr import convert
from atari_zarr.cli import main
from atari_zarr.errors import SourceNotFoundError
from atari_zarr.layout import (
    ACTION,
    ATTRS_KEY,
    EPISODE,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
)


def assert_store_equals(url: str, truth: Truth) -> None:
    group = zarr.open_group(url, mode="r")
    laps = group.attrs[ATTRS_KEY]["conversion"]["checkpoints"]
    exact = np.ones(len(truth), dtype=bool)
    for lap in laps:
        if not lap["source_rows_exact"]:
            exact[lap["first_transition"] : lap["first_transition"] + lap["transitions"]] = False
    np.testing.assert_array_equal(group[OBSERVATION][:], truth.observation)
    np.testing.assert_array_equal(group[ACTION][:], truth.action)
    np.testing.assert_array_equal(group[REWARD][:], truth.reward)
    np.testing.assert_array_equal(group[TERMINATED][:], truth.terminated)
    np.testing.assert_array_equal(group[TRUNCATED][:], truth.truncated)
    np.testing.assert_array_equal(group[EPISODE][:], truth.episode)
    source_row = group[SOURCE_ROW][:]
    np.testing.assert_array_equal(source_row[exact], truth.source_row[exact])
    # where the number of missed laps is unknown, rows are still in order
    assert np.all(np.diff(source_row) > 0)


@pytest.fixture(scope="module")
def pong_converted(tmp_path_factory):
    """The pong_run of conftest.py, converted once for the tests that only read the store."""
    root = tmp_path_factory.mktemp("dqn")
    run = write_fixture_run(
        str(root), "Pong", "1", capacity=64, steps=700, seed=0, max_episode_length=25
    )
    [store] = convert(str(root), str(tmp_path_factory.mktemp("stores")), progress=False)
    return run, store


def test_full_run_matches_truth(pong_converted):
    pong_run, store = pong_converted
    truth = pong_run.truth()
    assert store.transitions == len(truth) > 400
    assert_store_equals(store.url, truth)
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    conv = meta["conversion"]
    # this seed exercises every trap of the format
    assert conv["gaps"], "expected a missed log in the fixture"
    assert conv["checkpoints"][-1]["kind"] == "final"
    assert conv["dropped_rows"]["never_written"] == 1
    assert conv["dropped_rows"]["stale"] > 0
    assert conv["dropped_rows"]["padding"] > 0
    assert meta["complete"] is True
    assert meta["counts"]["transitions"] == len(truth)
    # per-episode statistics agree with the truth
    ends = np.flatnonzero(truth.terminated | truth.truncated)
    lengths = np.diff(np.concatenate([[-1], ends]))
    assert meta["episodes"]["length"] == lengths.tolist()
    returns = [
        float(truth.reward[a + 1 : b + 1].sum())
        for a, b in zip([-1, *ends[:-1]], ends, strict=True)
    ]
    np.testing.assert_allclose(meta["episodes"]["return"], returns)
    assert meta["episodes"]["terminated"] == truth.terminated[ends].tolist()
    # the command that makes the store again, and the selection as asked for
    assert meta["command"] == f"atari-zarr convert {pong_run.url} {Path(store.url).parents[1]}"
    assert meta["selection"] == {"checkpoints": None, "max_transitions": None, "max_episodes": None}


def test_missed_log_truncates_the_episode(pong_converted):
    _, store = pong_converted
    group = zarr.open_group(store.url, mode="r")
    src = group[SOURCE_ROW][:]
    jumps = np.flatnonzero(np.diff(src) > 4)  # more than a padding run apart: a gap
    assert jumps.size
    trunc = group[TRUNCATED][:]
    term = group[TERMINATED][:]
    episode = group[EPISODE][:]
    for j in jumps:
        assert trunc[j] or term[j]
        assert episode[j + 1] == episode[j] + 1
    assert trunc[-1] or term[-1]


def test_recorded_command_makes_the_same_store(pong_run, source_root, dest_root):
    """The command a store records repeats its conversion: same options, same bytes."""
    [store] = convert(
        str(source_root),
        str(dest_root),
        checkpoints="mixed,2-3",
        max_episodes=3,
        return_to_go=True,
        progress=False,
    )
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    assert meta["command"] == (
        f"atari-zarr convert {pong_run.url} {dest_root} --checkpoints mixed,2-3 --max-episodes 3 "
        f"--return-to-go"
    )
    assert meta["selection"] == {
        "checkpoints": "mixed,2-3",
        "max_transitions": None,
        "max_episodes": 3,
    }
    before = store_files(store.url, dest_root)
    argv = shlex.split(meta["command"])
    assert argv[0] == "atari-zarr"
    assert main([*argv[1:], "--overwrite", "-q"]) == 0
    assert store_files(store.url, dest_root) == before


def test_selected_checkpoints(pong_run, source_root, dest_root):
    chosen = [1, 2, 5, pong_run.suffixes[-1]]
    [store] = convert(
        str(source_root), str(dest_root), checkpoints=",".join(map(str, chosen)), progress=False
    )
    assert_store_equals(store.url, pong_run.truth(chosen))


def test_final_checkpoint_alone_takes_only_new_rows(pong_run, source_root, dest_root):
    final = pong_run.suffixes[-1]
    [store] = convert(str(source_root), str(dest_root), checkpoints=[final], progress=False)
    truth = pong_run.truth([final])
    assert len(truth) < pong_run.capacity  # stale rows excluded
    assert_store_equals(store.url, truth)


def test_missing_checkpoint_before_final(source_root, dest_root):
    """Without the checkpoint before the final one, the final's stale part is new data."""
    run = write_fixture_run(str(source_root), "Pong", "1", capacity=32, steps=300, seed=5)
    gone = run.suffixes[-2]
    logs = source_root / "Pong" / "1" / "replay_logs"
    for f in logs.glob(f"*_ckpt.{gone}.gz"):
        f.unlink()
    available = [s for s in run.suffixes if s != gone]
    [store] = convert(str(source_root), str(dest_root), progress=False)
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    assert meta["conversion"]["checkpoints"][-1]["kind"] == "final-after-missed-log"
    assert_store_equals(store.url, run.truth(available=available))


def test_checkpoints_are_placed_by_add_count_not_suffix(source_root, dest_root):
    """Renumbering the files (as a missed log does) changes nothing."""
    run = write_fixture_run(str(source_root), "Pong", "1", capacity=32, steps=260, seed=9)
    logs = source_root / "Pong" / "1" / "replay_logs"
    # shift suffixes 3.. up by 10: the order of suffixes is kept, the numbers are not
    for s in sorted(run.suffixes, reverse=True):
        if s >= 3:
            for f in logs.glob(f"*_ckpt.{s}.gz"):
                f.rename(f.with_name(f.name.replace(f"_ckpt.{s}.gz", f"_ckpt.{s + 10}.gz")))
    [store] = convert(str(source_root), str(dest_root), progress=False)
    assert_store_equals(store.url, run.truth())


def test_run_that_ended_before_the_first_log(source_root, dest_root):
    run = write_fixture_run(str(source_root), "Pong", "1", capacity=256, steps=100, seed=1)
    assert run.suffixes == [0]
    [store] = convert(str(source_root), str(dest_root), progress=False)
    truth = run.truth()
    assert len(truth) == 100
    assert_store_equals(store.url, truth)


def test_several_games_and_filters(source_root, dest_root):
    for game in ("Pong", "Breakout"):
        for r in ("1", "2"):
            write_fixture_run(str(source_root), game, r, capacity=32, steps=80, seed=int(r))
    done = convert(str(source_root), str(dest_root), progress=False)
    assert sorted((d.game, d.run) for d in done) == [
        ("Breakout", "1"),
        ("Breakout", "2"),
        ("Pong", "1"),
        ("Pong", "2"),
    ]
    only = convert(
        str(source_root), str(dest_root / "b"), games=["Pong"], runs=["2"], progress=False
    )
    assert [(d.game, d.run) for d in only] == [("Pong", "2")]
    # a run directory as SOURCE
    single = convert(str(source_root / "Breakout" / "1"), str(dest_root / "c"), progress=False)
    assert [(d.game, d.run) for d in single] == [("Breakout", "1")]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    capacity=st.integers(8, 80),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    steps=st.integers(0, 400),
    final_log=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_round_trip_property(tmp_path_factory, capacity, lengths, steps, final_log, seed, data):
    root = tmp_path_factory.mktemp("src")
    dest = tmp_path_factory.mktemp("dst")
    run = write_fixture_run(
        str(root),
        "Pong",
        "1",
        capacity=capacity,
        steps=steps,
        seed=seed,
        episode_lengths=lengths,
        final_log=final_log,
    )
    # Only a final log after a wrap: the files cannot show the wrap (see docs/format.md).
    assume(not run.wrapped_before_first_log)
    if not run.suffixes:
        with pytest.raises(SourceNotFoundError, match="no checkpoints found"):
            convert(str(root), str(dest), progress=False)
        return
    chosen = data.draw(
        st.lists(st.sampled_from(run.suffixes), min_size=1, unique=True).map(sorted) | st.none()
    )
    [store] = convert(str(root), str(dest), checkpoints=chosen, progress=False)
    assert_store_equals(store.url, run.truth(chosen))
