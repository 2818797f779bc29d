"""ALE play written as RL Unplugged shards: what the demo converts, read back by the reader."""

from __future__ import annotations

import gzip

import numpy as np

from atari_zarr.record.rl_unplugged import write_rlu_run
from atari_zarr.sources.rl_unplugged.example import parse_episode
from atari_zarr.sources.rl_unplugged.tfrecord import iter_records


def test_the_shards_written_are_the_episodes_played(tmp_path):
    run = write_rlu_run(tmp_path, "Pong", num_shards=4, present=(1, 3), episodes_per_shard=1)
    assert sorted(run.paths) == [1, 3] and run.game_dir == f"{tmp_path}/Pong"
    for shard, path in run.paths.items():
        with gzip.open(path) as stream:
            records = list(iter_records(stream, path))
        [written] = run.episodes_of(shard)
        [episode] = [parse_episode(data, path, i) for i, data in records]
        np.testing.assert_array_equal(episode.actions, written.actions)
        np.testing.assert_array_equal(episode.discounts, written.discounts)
        assert len(episode.observations) == len(written.observations)
