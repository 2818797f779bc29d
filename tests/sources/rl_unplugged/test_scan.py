"""Pass 1: a shard's per-step and per-record columns, frames left out."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from atari_zarr_testkit.rl_unplugged import spoil_record, write_fixture_rlu

from atari_zarr.errors import SourceFormatError
from atari_zarr.sources.rl_unplugged.scan import ShardScan, clip_reward, scan_shard


@pytest.fixture(scope="module")
def rlu(tmp_path_factory):
    return write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=3, present=(0, 2))


def test_scan_keeps_the_real_steps(rlu):
    with gzip.open(rlu.paths[2]) as stream:
        scan = scan_shard(stream, rlu.paths[2], 2)
    episodes = rlu.episodes_of(2)
    assert scan.records == len(episodes)
    assert scan.real.tolist() == [e.real_steps for e in episodes]
    assert scan.steps.tolist() == [len(e.actions) for e in episodes]
    assert scan.terminal.tolist() == [e.terminal for e in episodes]
    assert scan.checkpoint_idx.tolist() == [2] * len(episodes)
    actions = np.concatenate([e.actions[: e.real_steps] for e in episodes])
    assert np.array_equal(scan.action, actions)
    unclipped = np.concatenate([e.unclipped_rewards[: e.real_steps] for e in episodes])
    assert np.array_equal(scan.unclipped_reward, unclipped)
    assert np.array_equal(scan.reward, np.clip(unclipped, -1, 1))
    assert scan.episode_return.tolist() == [e.episode_return for e in episodes]
    assert np.allclose(scan.unclipped_sum, scan.episode_return)
    # round trip through plain arrays, with or without the steps
    again = ShardScan.from_arrays(scan.to_arrays())
    assert np.array_equal(again.action, scan.action) and again.index == 2
    records = {k: v for k, v in scan.to_arrays().items() if k not in ("action", "reward")}
    assert ShardScan.from_arrays(records).action is None


def test_checkpoint_idx_must_be_the_shard_index(rlu, tmp_path):
    path = tmp_path / "run_1-00002-of-00003"
    path.write_bytes(Path(rlu.paths[2]).read_bytes())
    spoil_record(path, 1, "checkpoint_idx", value=7)
    with (
        gzip.open(path) as stream,
        pytest.raises(
            SourceFormatError,
            match=r"run_1-00002-of-00003: record 1: checkpoint_idx is 7; expected 2",
        ),
    ):
        scan_shard(stream, str(path), 2)


@pytest.mark.parametrize("how", ["same member", "second gzip member"])
def test_a_repeated_record_is_refused_naming_both(rlu, tmp_path, how):
    """The last record written again, with valid CRCs: 43 more rows that verify passed."""
    from atari_zarr.record.rl_unplugged import frame_records
    from atari_zarr.sources.rl_unplugged.tfrecord import iter_records

    path = tmp_path / "run_1-00002-of-00003"
    with gzip.open(rlu.paths[2]) as stream:
        records = [data for _, data in iter_records(stream, "fixture")]
    last = len(records) - 1
    if how == "same member":
        path.write_bytes(gzip.compress(frame_records([*records, records[-1]])))
    else:
        path.write_bytes(
            Path(rlu.paths[2]).read_bytes() + gzip.compress(frame_records(records[-1:]))
        )
    with gzip.open(path) as stream, pytest.raises(SourceFormatError) as err:
        scan_shard(stream, str(path), 2)
    message = str(err.value)
    assert f"run_1-00002-of-00003: record {last + 1}: episode_idx" in message
    assert f"is record {last}'s too" in message and "\n" not in message


def test_clip_reward():
    assert clip_reward(np.array([-5, -0.5, 0, 2], np.float32)).tolist() == [-1, -0.5, 0, 1]
