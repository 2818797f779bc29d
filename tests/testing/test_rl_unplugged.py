"""The RL Unplugged fixture writer: files as TensorFlow writes them, truth that the reader meets."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
from atari_zarr_testkit.rl_unplugged import (
    TERMINAL_STEP_REWARD,
    RluFixture,
    corrupt_record_byte,
    read_shard_records,
    rename_shard,
    spoil_record,
    truncate_shard,
    write_fixture_rlu,
)

from atari_zarr.errors import SourceFormatError
from atari_zarr.sources.rl_unplugged.example import parse_episode
from atari_zarr.sources.rl_unplugged.png import decode_frames
from atari_zarr.sources.rl_unplugged.tfrecord import iter_records, open_shard
from atari_zarr.storage.filesystem import get_fs


def read_run(fixture: RluFixture, shards=None) -> dict[str, np.ndarray]:
    """Every transition of the fixture as the format layer reads it (what a converter does)."""
    rows: dict[str, list] = {k: [] for k in ("observation", "action", "unclipped", "next")}
    episodes: dict[str, list] = {k: [] for k in ("checkpoint", "idx", "ret", "cret", "final")}
    fs, _ = get_fs(fixture.root)
    for shard in sorted(fixture.paths if shards is None else shards):
        path = fixture.paths[shard]
        with open_shard(fs, path) as stream:
            for index, data in iter_records(stream, path):
                ep = parse_episode(data, path, index)
                frames = decode_frames(ep.observations, path, index)
                n = ep.real_steps
                rows["observation"].append(frames[:n])
                rows["action"].append(ep.actions[:n])
                rows["unclipped"].append(ep.unclipped_rewards[:n])
                nxt = np.zeros_like(frames[:n])
                nxt[: n - 1] = frames[1:n]
                final = frames[n] if ep.terminal else np.zeros_like(frames[0])
                nxt[n - 1] = final
                rows["next"].append(nxt)
                episodes["checkpoint"].append(ep.checkpoint_idx)
                episodes["idx"].append(ep.episode_idx)
                nan = float("nan")
                episodes["ret"].append(nan if ep.episode_return is None else ep.episode_return)
                cret = ep.clipped_episode_return
                episodes["cret"].append(nan if cret is None else cret)
                episodes["final"].append(final)
    out = {k: np.concatenate(v) for k, v in rows.items()}
    out |= {k: np.array(v) for k, v in episodes.items()}
    return out


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> RluFixture:
    return write_fixture_rlu(tmp_path_factory.mktemp("rlu"))


def test_names_and_layout(fixture):
    assert fixture.present == (0, 2)
    names = sorted(os.listdir(fixture.game_dir))
    assert names == ["run_1-00000-of-00003", "run_1-00002-of-00003"]
    assert fixture.paths[2] == f"{fixture.root}/Asterix/run_1-00002-of-00003"
    assert [e.checkpoint_idx for e in fixture.episodes] == [0, 0, 2, 2]
    assert [e.episode_idx for e in fixture.episodes] == [0, 1, 2, 3]


def test_episodes_are_terminal_and_cut_with_rewards_to_clip(fixture):
    terminal = [e.terminal for e in fixture.episodes]
    assert terminal == [True, False, True, False]
    for e in fixture.episodes:
        if e.terminal:
            assert e.discounts[-1] == 0 and (e.discounts[:-1] == 1).all()
            assert e.unclipped_rewards[-1] == TERMINAL_STEP_REWARD
        else:
            assert (e.discounts == 1).all()
        assert len(e.observations) == len(e.actions) == len(e.discounts)
    rewards = np.concatenate([e.unclipped_rewards for e in fixture.episodes])
    assert (np.abs(rewards) > 1).any()  # clipping matters
    frames = np.concatenate([e.observations for e in fixture.episodes])
    assert 300 < len(frames) < 2000 and len({f.tobytes() for f in frames}) > 100


def test_reader_meets_the_truth(fixture):
    truth = fixture.truth()
    read = read_run(fixture)
    assert len(truth) == len(read["action"]) == sum(e.real_steps for e in fixture.episodes)
    np.testing.assert_array_equal(read["observation"], truth.observation)
    np.testing.assert_array_equal(read["next"], truth.next_observation)
    np.testing.assert_array_equal(read["action"], truth.action)
    np.testing.assert_array_equal(read["unclipped"], truth.unclipped_reward)
    np.testing.assert_array_equal(np.clip(read["unclipped"], -1, 1), truth.reward)
    np.testing.assert_array_equal(read["final"], truth.final_observation)
    np.testing.assert_array_equal(read["checkpoint"], truth.checkpoint_idx)
    np.testing.assert_array_equal(read["idx"], truth.episode_idx)
    np.testing.assert_array_equal(read["ret"].astype(np.float32), truth.episode_return)
    np.testing.assert_array_equal(read["cret"].astype(np.float32), truth.clipped_episode_return)
    # the truth's own bookkeeping
    ends = truth.terminated | truth.truncated
    assert not (truth.terminated & truth.truncated).any()
    assert ends.sum() == len(truth.length) == truth.episode.max() + 1
    np.testing.assert_array_equal(np.bincount(truth.episode), truth.length)
    np.testing.assert_array_equal(truth.terminated[ends], truth.episode_terminated)
    assert not truth.final_observation[~truth.episode_terminated].any()
    assert truth.final_observation[truth.episode_terminated].any(axis=(1, 2)).all()
    assert TERMINAL_STEP_REWARD not in truth.unclipped_reward
    sums = np.bincount(truth.episode, weights=truth.unclipped_reward)
    np.testing.assert_allclose(sums, truth.episode_return)


def test_truth_of_some_shards(fixture):
    whole, part = fixture.truth(), fixture.truth(shards=[2])
    first = whole.length[0] + whole.length[1]
    np.testing.assert_array_equal(part.observation, whole.observation[first:])
    np.testing.assert_array_equal(part.episode, whole.episode[first:] - 2)
    assert part.checkpoint_idx.tolist() == [2, 2]
    assert len(fixture.truth(shards=[1])) == 0


def test_newer_release_without_clipped_features(tmp_path):
    fixture = write_fixture_rlu(tmp_path, clipped=False, returns=False)
    path = fixture.paths[2]
    with gzip.open(path) as stream:
        eps = [parse_episode(d, path, i, observations=False) for i, d in iter_records(stream, path)]
    assert all(e.clipped_rewards is None and e.episode_return is None for e in eps)
    assert all(e.clipped_episode_return is None for e in eps)
    truth = fixture.truth()
    assert np.isnan(truth.episode_return).all() and np.isnan(truth.clipped_episode_return).all()
    np.testing.assert_array_equal(truth.reward, np.clip(truth.unclipped_reward, -1, 1))


def shard_copy(fixture: RluFixture, tmp_path) -> str:
    path = tmp_path / "run_1-00000-of-00003"
    path.write_bytes(Path(fixture.paths[0]).read_bytes())
    return str(path)


def read_all(path: str) -> None:
    with gzip.open(path) as stream:
        for index, data in iter_records(stream, path):
            decode_frames(parse_episode(data, path, index).observations, path, index)


@pytest.mark.parametrize(
    ("spoil", "kwargs", "what"),
    [
        (corrupt_record_byte, {"record": 1}, "record 1: the CRC of the record's data"),
        (truncate_shard, {"keep": 0.5}, "GZIP stream is corrupt or truncated"),
        (truncate_shard, {"keep": 0.95, "compressed": False}, "record 1: the shard ends inside"),
        (spoil_record, {"record": 1, "how": "missing_feature"}, "record 1: feature(s) actions"),
        (spoil_record, {"record": 0, "how": "lengths", "feature": "discounts"}, "record 0: the"),
        (spoil_record, {"record": 1, "how": "png_rgb", "step": 5}, "record 1: step 5: a 84x84"),
        (spoil_record, {"record": 0, "how": "png_corrupt", "step": 7}, "record 0: step 7: the"),
    ],
)
def test_bad_input_makers(fixture, tmp_path, spoil, kwargs, what):
    path = shard_copy(fixture, tmp_path)
    read_all(path)
    spoil(path, **kwargs)
    with pytest.raises(SourceFormatError) as excinfo:
        read_all(path)
    assert str(excinfo.value).startswith(f"{path}: record "), str(excinfo.value)
    assert what in str(excinfo.value)


def test_checkpoint_idx_and_renaming(fixture, tmp_path):
    path = shard_copy(fixture, tmp_path)
    spoil_record(path, 1, "checkpoint_idx", value=9)
    records = read_shard_records(path)
    assert [parse_episode(r, path, 0).checkpoint_idx for r in records] == [0, 9]
    new = rename_shard(path, num_shards=49)
    assert new.endswith("run_1-00000-of-00049") and not os.path.exists(path)
    assert rename_shard(new, index=4).endswith("run_1-00004-of-00049")
