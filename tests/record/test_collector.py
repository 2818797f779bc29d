"""ZarrCollector with real ale-py envs: exact read-back, flushes, crash safety, CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zarr

from atari_zarr import AtariZarrDataset, StoreIncompleteError, ZarrCollector
from atari_zarr.errors import InvalidArgumentError, StoreExistsError
from atari_zarr.layout import ATTRS_KEY, FINAL_OBSERVATION, FLUSHED_KEY
from atari_zarr.ale import make_dqn_env
from atari_zarr.verify import verify_store


def play(env, steps: int, seed: int, reset_at: tuple[int, ...] = ()):
    """Random play; returns every step as the caller saw it."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows = []
    for i in range(steps):
        action = int(rng.integers(env.action_space.n))
        nxt, reward, term, trunc, _ = env.step(action)
        rows.append([obs, action, reward, term, trunc, nxt])
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
        elif i in reset_at:
            rows[-1][4] = "cut"  # reset without an episode end: truncated by the collector
            obs, _ = env.reset()
    return rows


def check_rows(ds: AtariZarrDataset, rows) -> None:
    assert len(ds) == len(rows)
    td = ds[np.arange(len(rows))]
    for i, (obs, action, reward, term, trunc, nxt) in enumerate(rows):
        assert np.array_equal(td["observation"][i].numpy(), obs), i
        assert int(td["action"][i]) == action
        assert float(td["next", "reward"][i]) == np.float32(reward)
        assert bool(td["next", "terminated"][i]) == bool(term)
        assert bool(td["next", "truncated"][i]) == (bool(trunc) and not term)
        assert np.array_equal(td["next", "observation"][i].numpy(), nxt), i


def test_every_step_reads_back_exactly(tmp_path):
    path = str(tmp_path / "breakout.zarr")
    # Breakout ends quickly under random play (terminated); the 150-step limit truncates
    env = ZarrCollector(
        make_dqn_env("Breakout", max_episode_steps=150),
        path,
        max_buffer_steps=37,
        max_buffer_episodes=2,
    )
    rows = play(env, 700, seed=0, reset_at=(430,))
    env.close()
    rows[-1][4] = rows[-1][4] or not rows[-1][3]  # close() truncates the open episode
    term = np.array([r[3] for r in rows], bool)
    trunc = np.array([bool(r[4]) for r in rows], bool)
    assert term.sum() >= 2 and trunc.sum() >= 3, "expected both kinds of episode end"
    assert any(r[4] == "cut" for r in rows)

    ds = AtariZarrDataset(path)
    check_rows(ds, rows)
    meta = ds.metadata
    assert meta["kind"] == "collected" and meta["game"] == "Breakout" and meta["complete"]
    ends = np.flatnonzero(term | trunc)
    assert meta["counts"]["episodes"] == len(ends)
    assert meta["episodes"]["length"] == np.diff(np.r_[-1, ends]).tolist()
    assert meta["episodes"]["terminated"] == term[ends].tolist()
    rewards = np.array([r[2] for r in rows], np.float64)
    np.testing.assert_allclose(
        meta["episodes"]["return"],
        [rewards[a + 1 : b + 1].sum() for a, b in zip(np.r_[-1, ends[:-1]], ends, strict=True)],
    )
    assert meta["episodes"]["seed"][0] == 0 and meta["seeds"] == [0]
    env_meta = meta["env"]
    assert env_meta["env_id"] == "ALE/Breakout-v5"
    assert env_meta["ale"]["repeat_action_probability"] == 0.25
    pre = next(w for w in env_meta["wrappers"] if w["name"] == "AtariPreprocessing")
    assert pre["frame_skip"] == 4 and pre["noop_max"] == 30 and pre["screen_size"] in (84, [84, 84])
    assert (
        next(w for w in env_meta["wrappers"] if w["name"] == "TimeLimit")["max_episode_steps"]
        == 150
    )
    g = zarr.open_group(path, mode="r")
    assert g[FINAL_OBSERVATION].shape == (len(ends), 84, 84)


def test_many_short_episodes_and_reset_twice(tmp_path):
    """More than one chunk of final frames; a reset with no step records nothing."""
    path = str(tmp_path / "pong.zarr")
    env = ZarrCollector(make_dqn_env("Pong", max_episode_steps=5), path, max_buffer_steps=13)
    env.reset(seed=1)
    rows = play(env, 110, seed=1)  # 22 episodes of 5 steps: final frames span two chunks
    env.reset()
    env.close()
    ds = AtariZarrDataset(path)
    check_rows(ds, rows)
    assert ds.metadata["counts"]["episodes"] == 22
    with pytest.raises(InvalidArgumentError, match="collector is closed"):
        env.step(0)
    # every chunk was written, all-zero ones too (random Pong for 110 steps scores
    # nothing and every episode is cut by the limit, so next/reward and
    # next/terminated are all zeros): verify finds no chunk missing

    report = verify_store(path)
    assert report.ok, report.problems


def test_bad_env_and_existing_path(tmp_path):
    import gymnasium

    path = tmp_path / "x.zarr"
    path.mkdir()
    (path / "keep.txt").write_text("data")
    with pytest.raises(StoreExistsError, match=r"x\.zarr already exists.*overwrite=True"):
        ZarrCollector(make_dqn_env("Pong"), str(path))
    raw = gymnasium.make("ALE/Pong-v5")  # 210x160 RGB frames
    env = ZarrCollector(raw, str(tmp_path / "rgb.zarr"))
    with pytest.raises(InvalidArgumentError, match=r"shape \(210, 160, 3\).*make_dqn_env"):
        env.reset(seed=0)
    raw.close()


_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from atari_zarr import ZarrCollector
    from atari_zarr.ale import make_dqn_env

    env = ZarrCollector(make_dqn_env("Pong", max_episode_steps=40), sys.argv[1],
                        max_buffer_steps=25, max_buffer_episodes=1)
    rng = np.random.default_rng(7)
    obs, _ = env.reset(seed=7)
    while True:  # until killed
        obs, r, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        if term or trunc:
            obs, _ = env.reset()
    """
)


@pytest.mark.slow
def test_killed_recorder_leaves_flushed_episodes_readable(tmp_path):
    path = str(tmp_path / "killed.zarr")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 120
        flushed = 0
        while flushed < 4:
            assert time.monotonic() < deadline, "the recorder flushed nothing in 120 s"
            assert child.poll() is None, "the recorder died on its own"
            time.sleep(0.2)
            try:
                meta = zarr.open_group(path, mode="r").attrs[ATTRS_KEY]
                flushed = meta[FLUSHED_KEY]["episodes"]
            except (FileNotFoundError, KeyError):
                continue
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with pytest.raises(StoreIncompleteError, match=r"unfinished recording.*partial=True"):
        AtariZarrDataset(path)
    ds = AtariZarrDataset(path, partial=True)
    meta = ds.metadata
    n = meta[FLUSHED_KEY]["transitions"]
    assert meta[FLUSHED_KEY]["episodes"] >= 4 and len(ds) == n == 40 * meta[FLUSHED_KEY]["episodes"]
    # the same play, replayed here, is what the store holds
    env = make_dqn_env("Pong", max_episode_steps=40)
    rows = play(env, n, seed=7)
    env.close()
    check_rows(ds, rows)
    from atari_zarr.info import format_info, store_info

    assert "INCOMPLETE recording" in format_info(store_info(path))


@pytest.mark.slow
def test_collect_cli(tmp_path):
    dest = tmp_path / "pong.zarr"
    cmd = [
        sys.executable,
        "-m",
        "atari_zarr",
        "collect",
        "--env",
        "ALE/Pong-v5",
        "--steps",
        "300",
        "--seed",
        "3",
        "--max-episode-steps",
        "120",
        "--quiet",
        str(dest),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""  # --quiet: not even ALE's banner
    ds = AtariZarrDataset(str(dest))
    assert len(ds) == 300 and ds.metadata["counts"]["episodes"] == 3
    assert "--seed 3" in ds.metadata["command"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "already exists" in again.stderr
    info = subprocess.run(
        [sys.executable, "-m", "atari_zarr", "info", "--episodes", str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert info.returncode == 0 and "ALE/Pong-v5" in info.stdout
    assert info.stdout.count("truncated") == 3
