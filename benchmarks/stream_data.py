"""A large benchmark run of real ALE play: frames, actions, rewards and episode ends.

``record_play(game, steps, seed)`` plays ``ALE/{game}-v5`` with a uniformly random
policy and DQN Replay's preprocessing (sticky actions 0.25, frame skip 4 with the
max of the last two frames, 84x84 grayscale by ``cv2.INTER_AREA``, up to 30 no-op
starts), as ``benchmarks/ale_frames.py`` does, and keeps the actions, rewards and
episode lengths too. Episode starts (seeding, no-op starts) go through gymnasium's
``AtariPreprocessing``; the steps inside an episode drive the emulator directly with
the same operations, which is about three times faster than through the wrappers
(gymnasium renders an RGB screen on every emulator frame that the wrapper discards).

``build_run(...)`` records several seeds in parallel processes, concatenates them and
writes everything the stream benchmark reads, cached under ``benchmarks/.cache/``:

* DQN Replay checkpoint files (``atari_zarr_testkit.write_fixture_run``, real frames,
  actions and episode lengths),
* our store (``atari_zarr.convert`` of those files),
* TorchRL's AtariDQN storage (TorchRL's own ``_preproc_run`` per checkpoint, as
  ``benchmarks/read_benchmark.py`` builds it).

Usage::

    python benchmarks/stream_data.py --steps 1000000 --procs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CACHE_DIR = HERE / ".cache"


def _play(game: str, steps: int, seed: int) -> dict[str, np.ndarray]:
    import cv2
    from ale_frames import _make_env

    cv2.setNumThreads(1)
    env = _make_env(game)
    pre = env  # AtariPreprocessing
    ale = env.unwrapped.ale
    action_set = env.unwrapped._action_set
    rng = np.random.default_rng(seed)
    n_actions = len(action_set)
    frames = np.empty((steps, 84, 84), np.uint8)
    actions = np.empty(steps, np.int64)
    rewards = np.empty(steps, np.float32)
    lengths: list[int] = []
    raw = np.empty((2, 210, 160), np.uint8)
    obs, _ = pre.reset(seed=seed)
    step_in_episode = 0
    t0 = time.perf_counter()
    for t in range(steps):
        frames[t] = obs
        a = int(rng.integers(n_actions))
        actions[t] = a
        reward = 0.0
        over = False
        for k in range(4):
            reward += ale.act(action_set[a])
            over = ale.game_over()
            if over:
                break
            if k == 2:
                ale.getScreenGrayscale(raw[1])
            elif k == 3:
                ale.getScreenGrayscale(raw[0])
        rewards[t] = reward
        step_in_episode += 1
        if over or step_in_episode >= 27_000:
            lengths.append(step_in_episode)
            step_in_episode = 0
            obs, _ = pre.reset()
        else:
            np.maximum(raw[0], raw[1], out=raw[0])
            obs = cv2.resize(raw[0], (84, 84), interpolation=cv2.INTER_AREA)
        if t and t % 100_000 == 0:
            rate = t / (time.perf_counter() - t0)
            print(f"  {game} seed {seed}: {t:,} steps, {rate:,.0f} steps/s", file=sys.stderr)
    if step_in_episode:
        lengths.append(step_in_episode)
    env.close()
    return {
        "frames": frames,
        "actions": actions,
        "rewards": rewards,
        "lengths": np.asarray(lengths, np.int64),
    }


def record_play(game: str, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random play of ``game``: ``frames`` (steps, 84, 84) uint8, ``actions``, ``rewards``,
    ``lengths`` (episode lengths; the last episode may be unfinished). Cached on disk."""
    d = CACHE_DIR / f"play_{game}_{steps}_{seed}"
    names = ("frames", "actions", "rewards", "lengths")
    if all((d / f"{k}.npy").exists() for k in names):
        return {k: np.load(d / f"{k}.npy", mmap_mode="r" if k == "frames" else None) for k in names}
    out = _play(game, steps, seed)
    tmp = d.with_name(f".{d.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for k in names:
        np.save(tmp / f"{k}.npy", out[k])
    if d.exists():
        shutil.rmtree(d)
    os.replace(tmp, d)
    return record_play(game, steps, seed)


def _record_one(args: tuple[str, int, int]) -> str:
    game, steps, seed = args
    t = time.perf_counter()
    record_play(game, steps, seed)
    return f"{game} seed {seed}: {steps:,} steps in {time.perf_counter() - t:.0f} s"


def build_run(
    game: str = "Pong", steps: int = 1_000_000, procs: int = 2, capacity: int = 250_000
) -> dict:
    """Record, write DQN Replay files, convert, build TorchRL's storage; cached.

    Returns a dict with ``store`` (our store's path), ``logs`` (the replay_logs dir),
    ``trl_path`` (TorchRL's storage), ``n`` (transitions) and build times.
    """
    root = CACHE_DIR / f"stream_{game}_{steps}"
    meta_path = root / "built.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        meta["logs"] = Path(meta["logs"])
        meta["trl_path"] = Path(meta["trl_path"])
        return meta
    per = -(-steps // procs)
    seeds = list(range(1, procs + 1))
    t = time.perf_counter()
    with ProcessPoolExecutor(procs) as pool:
        for line in pool.map(_record_one, [(game, per, s) for s in seeds]):
            print(line, file=sys.stderr)
    t_record = time.perf_counter() - t
    plays = [record_play(game, per, s) for s in seeds]
    frames = np.concatenate([p["frames"] for p in plays])[:steps]
    actions = np.concatenate([p["actions"] for p in plays])[:steps]
    lengths = np.concatenate([p["lengths"] for p in plays]).tolist()
    del plays

    import torch  # noqa: F401  (torchrl needs it first)
    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert

    if root.exists():
        shutil.rmtree(root)
    src = root / "dqn"
    t = time.perf_counter()
    write_fixture_run(
        str(src),
        game,
        "1",
        capacity=capacity,
        steps=steps,
        episode_lengths=lengths,
        frames=frames.__getitem__,
        actions=lambda k: int(actions[k]),
        compresslevel=1,
    )
    t_src = time.perf_counter() - t
    print(f"DQN Replay files in {t_src:.0f} s", file=sys.stderr)
    del frames
    logs = src / game / "1" / "replay_logs"
    t = time.perf_counter()
    [store] = convert(
        str(src), str(root / "zarr"), progress=False, scheduler="processes", workers=procs
    )
    t_convert = time.perf_counter() - t
    print(f"converted in {t_convert:.0f} s: {store.url}", file=sys.stderr)

    from read_benchmark import torchrl_storage

    trl_path = root / "torchrl" / game / "1"
    t_trl = torchrl_storage(logs, trl_path)
    print(f"TorchRL storage in {t_trl:.0f} s", file=sys.stderr)
    meta = {
        "game": game,
        "store": store.url,
        "logs": str(logs),
        "trl_path": str(trl_path),
        "n": store.transitions,
        "episodes": len(lengths),
        "recorded_steps": steps,
        "seeds": seeds,
        "t_record": t_record,
        "t_src": t_src,
        "t_convert": t_convert,
        "t_torchrl": t_trl,
    }
    meta_path.write_text(json.dumps(meta, indent=2))
    return build_run(game, steps, procs, capacity)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="Pong")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--capacity", type=int, default=250_000)
    args = p.parse_args(argv)
    print(
        json.dumps(
            build_run(args.game, args.steps, args.procs, args.capacity), default=str, indent=2
        )
    )


if __name__ == "__main__":
    main()
