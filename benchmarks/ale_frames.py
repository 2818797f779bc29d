"""Record real ALE observation frames with DQN-Replay style preprocessing.

Usage as a module::

    from ale_frames import record_frames
    frames = record_frames("Pong", 20000, seed=0)   # (20000, 84, 84) uint8

Usage as a script::

    python benchmarks/ale_frames.py Pong --steps 1000 --seed 0

Frames come from a uniformly random policy (actions drawn from
``numpy.random.Generator(PCG64(seed))``), or with ``policy="repeat"`` one that holds
each action for a while as a trained agent does (a new uniform action with
probability 1/4 per step, else the last one again: runs of 4 steps on average), playing
``ALE/{game}-v5`` with ``frameskip=1, repeat_action_probability=0.25``
wrapped in ``gymnasium.wrappers.AtariPreprocessing(frame_skip=4,
screen_size=84, grayscale_obs=True, noop_max=30)``.  ``frames[t]`` is the
observation the agent acted on at step ``t`` (as in DQN Replay's
``observation`` array); when an episode ends the env is reset and the next
frame stored is the first observation of the new episode (the terminal
observation itself is not stored).

Results are cached in ``benchmarks/.cache/{game}_{steps}_{seed}.npy`` (random policy)
or ``{game}_{steps}_{seed}_{policy}.npy``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

CACHE_DIR = Path(__file__).resolve().parent / ".cache"


def _make_env(game: str):
    import ale_py
    import gymnasium

    # gymnasium >= 1.0 no longer auto-discovers ALE envs via entry points:
    # importing ale_py registers the "ALE/" namespace; register_envs is a no-op
    # that just keeps the import from looking unused.
    gymnasium.register_envs(ale_py)
    env = gymnasium.make(
        f"ALE/{game}-v5",
        frameskip=1,  # AtariPreprocessing raises if the base env already frame-skips
        repeat_action_probability=0.25,
    )
    return gymnasium.wrappers.AtariPreprocessing(
        env,
        noop_max=30,
        frame_skip=4,
        screen_size=84,
        grayscale_obs=True,
    )


#: Probability of drawing a new action at each step under ``policy="repeat"``.
REPEAT_SWITCH = 0.25


def _record(game: str, steps: int, seed: int, policy: str = "random") -> np.ndarray:
    env = _make_env(game)
    rng = np.random.default_rng(seed)
    n_actions = int(env.action_space.n)
    frames = np.empty((steps, 84, 84), dtype=np.uint8)
    # Seed the env once; later resets continue its RNG stream (no re-seeding),
    # so consecutive episodes differ.
    obs, _ = env.reset(seed=seed)
    action = 0
    try:
        for t in range(steps):
            frames[t] = obs
            if policy == "random" or rng.random() < REPEAT_SWITCH:
                action = int(rng.integers(n_actions))
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        env.close()
    return frames


def record_frames(game: str, steps: int, seed: int = 0, policy: str = "random") -> np.ndarray:
    """Return ``(steps, 84, 84)`` uint8 grayscale frames of *policy*'s play in *game*.

    *game* is the ALE v5 name without prefix/suffix, e.g. ``"Pong"``,
    ``"Breakout"``, ``"SpaceInvaders"``.  Cached on disk per (game, steps, seed).
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    if policy not in ("random", "repeat"):
        raise ValueError(f"policy must be 'random' or 'repeat', got {policy!r}")
    tail = "" if policy == "random" else f"_{policy}"
    path = CACHE_DIR / f"{game}_{steps}_{seed}{tail}.npy"
    if path.exists():
        frames = np.load(path)
        if frames.shape == (steps, 84, 84) and frames.dtype == np.uint8:
            return frames
    frames = _record(game, steps, seed, policy)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, frames)
    os.replace(tmp, path)
    return frames


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("game", nargs="+", help="e.g. Pong Breakout SpaceInvaders")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", choices=("random", "repeat"), default="random")
    args = p.parse_args(argv)
    for game in args.game:
        frames = record_frames(game, args.steps, args.seed, args.policy)
        print(
            f"{game}: shape={frames.shape} dtype={frames.dtype} "
            f"mean={frames.mean():.2f} "
            f"unique_frames~{len(np.unique(frames[:, ::8, ::8].reshape(len(frames), -1), axis=0))}"
        )


if __name__ == "__main__":
    main()
