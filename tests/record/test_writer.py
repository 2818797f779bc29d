"""StoreWriter on its own: no environment, frames made up by the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

from atari_zarr import AtariZarrDataset, StoreIncompleteError
from atari_zarr.errors import InvalidArgumentError, StoreExistsError
from atari_zarr.layout import ARRAYS, ATTRS_KEY, FINAL_OBSERVATION, FLUSHED_KEY, TRUNCATED
from atari_zarr.record.writer import StoreWriter
from atari_zarr.verify import verify_store


def frames(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84), dtype=np.uint8)


def test_flushes_commit_whole_episodes_and_read_back_exactly(tmp_path):
    path = str(tmp_path / "w.zarr")
    w = StoreWriter(path, max_buffer_steps=4, max_buffer_episodes=2, game="Pong", command="X")
    lengths, ends = [3, 7, 1, 5], ["terminated", "truncated", "cut", "terminated"]
    obs = frames(sum(lengths) + len(lengths), seed=0)
    k = 0  # next unused frame
    rewards = []
    flushed_seen = []
    for e, (n, end) in enumerate(zip(lengths, ends, strict=True)):
        w.start_episode(seed=e if e % 2 == 0 else None)
        for i in range(n):
            last = i == n - 1
            reward = float(k % 3)
            rewards.append(reward)
            w.append(
                obs[k],
                action=k % 6,
                reward=reward,
                terminated=last and end == "terminated",
                truncated=last and end == "truncated",
                next_observation=obs[k + 1] if last and end != "cut" else None,
            )
            k += 1
            flushed = zarr.open_group(path, mode="r").attrs[ATTRS_KEY][FLUSHED_KEY]
            flushed_seen.append((flushed["episodes"], flushed["transitions"]))
        if end == "cut":
            w.end_episode(obs[k])
        k += 1  # the frame that ended the episode
    # Flushes every 4 steps (mid-episode too) and every 2 episodes; what a flush
    # commits is always whole episodes.
    assert sorted(set(flushed_seen)) == [(0, 0), (1, 3), (3, 11)]
    with pytest.raises(StoreIncompleteError):
        AtariZarrDataset(path)
    partial = AtariZarrDataset(path, partial=True)
    assert len(partial) == 11
    assert np.array_equal(
        partial[:]["observation"].numpy(), obs[[0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 12]]
    )
    w.close()
    w.close()  # a second close does nothing

    ds = AtariZarrDataset(path)
    meta = ds.metadata
    assert len(ds) == w.transitions == sum(lengths) and w.episodes == 4
    assert meta["episodes"]["length"] == lengths
    assert meta["episodes"]["terminated"] == [True, False, False, True]
    assert meta["episodes"]["seed"] == [0, None, 2, None] and meta["seeds"] == [0, 2]
    assert meta[FLUSHED_KEY] == {"transitions": sum(lengths), "episodes": 4}
    assert (meta["game"], meta["run"], meta["command"], meta["kind"]) == (
        "Pong",
        "collected",
        "X",
        "collected",
    )
    td = ds[:]
    starts = np.cumsum([0, *lengths[:-1]])
    rows = np.concatenate(
        [np.arange(s + e, s + e + n) for e, (s, n) in enumerate(zip(starts, lengths, strict=True))]
    )  # frame index per row
    assert np.array_equal(td["observation"].numpy(), obs[rows])
    assert td["action"].tolist() == (rows % 6).tolist()
    assert td["next", "reward"].flatten().tolist() == rewards
    last_rows = np.cumsum(lengths) - 1
    assert np.flatnonzero(td["next", "terminated"].numpy().ravel()).tolist() == [
        last_rows[0],
        last_rows[3],
    ]
    assert np.flatnonzero(td["next", "truncated"].numpy().ravel()).tolist() == [
        last_rows[1],
        last_rows[2],
    ]
    # next.observation is the following frame everywhere, the final frame at episode ends
    assert np.array_equal(td["next", "observation"].numpy(), obs[rows + 1])
    assert zarr.open_group(path, mode="r")[FINAL_OBSERVATION].shape == (4, 84, 84)
    assert verify_store(path).ok


def test_misuse_is_an_error_that_says_what_to_do(tmp_path):
    path = str(tmp_path / "w.zarr")
    w = StoreWriter(path)
    f = frames(2, seed=1)
    with pytest.raises(InvalidArgumentError, match="no open episode; append"):
        w.end_episode(f[0])
    with pytest.raises(InvalidArgumentError, match=r"shape \(84, 83\).*84x84 grayscale"):
        w.append(f[0][:, :83], action=0, reward=0.0)
    with pytest.raises(InvalidArgumentError, match="ends an episode needs next_observation"):
        w.append(f[0], action=0, reward=0.0, terminated=True)
    assert w.transitions == 0  # a refused step records nothing
    w.append(f[0], action=0, reward=0.0)
    with pytest.raises(InvalidArgumentError, match=r"start_episode\(\) while an episode is open"):
        w.start_episode(seed=1)
    with pytest.raises(InvalidArgumentError, match=r"close\(\) while an episode is open"):
        w.close()
    w.end_episode(f[1])
    w.close()
    with pytest.raises(InvalidArgumentError, match="recording is closed"):
        w.append(f[0], action=0, reward=0.0)
    with pytest.raises(StoreExistsError, match=r"w\.zarr already exists.*overwrite=True"):
        StoreWriter(path)
    with pytest.raises(InvalidArgumentError, match="max_buffer_steps must be at least 1"):
        StoreWriter(str(tmp_path / "other.zarr"), max_buffer_steps=0)
    assert not (tmp_path / "other.zarr").exists()  # refused before writing anything


def test_copies_frames_it_is_handed(tmp_path):
    """A recorder that reuses one buffer for every frame still records every frame."""
    path = str(tmp_path / "w.zarr")
    w = StoreWriter(path, max_buffer_steps=100)
    buffer = np.zeros((84, 84), np.uint8)
    for i in range(5):
        buffer[:] = i
        w.append(buffer, action=0, reward=0.0)
    buffer[:] = 9
    w.end_episode(buffer)
    w.close()
    ds = AtariZarrDataset(path)
    assert ds[:]["observation"].numpy()[:, 0, 0].tolist() == [0, 1, 2, 3, 4]
    assert int(ds[4]["next", "observation"][0, 0]) == 9


@pytest.mark.slow
def test_cut_after_a_whole_written_chunk(tmp_path):
    """The episode's last row ends a per-step chunk that a flush already wrote."""
    path = str(tmp_path / "w.zarr")
    n = ARRAYS[TRUNCATED].write_rows
    w = StoreWriter(path, max_buffer_steps=4096)
    frame = np.zeros((84, 84), np.uint8)
    for _ in range(n):
        w.append(frame, action=0, reward=0.0)
    # the whole chunk is on storage, so the cut has to rewrite it
    assert zarr.open_group(path, mode="r")[TRUNCATED].shape == (n,)
    w.end_episode(frame)
    w.close()
    truncated = zarr.open_group(path, mode="r")[TRUNCATED][:]
    assert truncated.sum() == 1 and bool(truncated[-1])
    assert verify_store(path).ok


def test_cut_right_after_a_flush_is_written(tmp_path):
    """The episode's last row was flushed by its own append; the cut must still reach storage."""
    path = str(tmp_path / "w.zarr")
    w = StoreWriter(path, max_buffer_steps=2)
    frame = np.zeros((84, 84), np.uint8)
    w.append(frame, action=0, reward=0.0)
    w.append(frame, action=0, reward=1.0)  # the second buffered step: flushed here
    w.end_episode(frame)
    w.close()
    assert zarr.open_group(path, mode="r")[TRUNCATED][:].tolist() == [False, True]
    assert verify_store(path).ok


_NO_GYMNASIUM = textwrap.dedent(
    """
    import sys
    sys.modules["gymnasium"] = None  # importing it fails, as when it is not installed
    sys.modules["ale_py"] = None
    import numpy as np
    from atari_zarr.record.writer import StoreWriter

    w = StoreWriter(sys.argv[1])
    w.append(np.ones((84, 84), np.uint8), action=1, reward=1.0, terminated=True,
             next_observation=np.zeros((84, 84), np.uint8))
    w.close()
    """
)


def test_writer_needs_no_gymnasium(tmp_path):
    path = str(tmp_path / "w.zarr")
    done = subprocess.run(
        [sys.executable, "-c", _NO_GYMNASIUM, path], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    meta = zarr.open_group(path, mode="r").attrs[ATTRS_KEY]
    assert meta["complete"] and meta["counts"]["transitions"] == 1
