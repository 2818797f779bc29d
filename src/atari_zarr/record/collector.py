"""Record play from a gymnasium Atari env into a store: :class:`ZarrCollector`, :func:`collect`.

The wrapper turns gymnasium's ``reset``/``step`` into the steps and episode ends of
a :class:`~atari_zarr.record.writer.StoreWriter`, which writes the store (its
layout, flushes and crash safety are described there), and records how the env
makes its frames (:func:`env_settings`).

Needs the ``collect`` extra (``pip install 'atari-zarr[collect]'``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from atari_zarr.ale import game_of_env_id, make_dqn_env
from atari_zarr.commands import command_line
from atari_zarr.errors import InvalidArgumentError, import_optional
from atari_zarr.progress import progress_bar
from atari_zarr.record.writer import StoreWriter
from atari_zarr.storage.deadline import Timeout

if TYPE_CHECKING:
    import gymnasium
else:  # the one install hint of the `collect` extra, not a bare ImportError
    gymnasium = import_optional("gymnasium", extra="collect", purpose="recording Atari play")

__all__ = ["ZarrCollector", "collect", "env_settings"]


def _game_of(env: Any) -> str | None:
    """The game of ``env``'s id, or None for an env that is not one of ale-py's."""
    spec = getattr(env, "spec", None)
    if spec is None or not spec.id:
        return None
    try:
        return game_of_env_id(spec.id)
    except InvalidArgumentError:
        return None  # any env with Atari frames can be recorded; it has no game to file under


def _is_plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(isinstance(v, bool | int | float | str) for v in value)
    return isinstance(value, bool | int | float | str)


def env_settings(env: Any) -> dict[str, Any]:
    """What is known about how ``env`` makes its frames: spec, ALE and wrapper settings.

    Parameters
    ----------
    env : gymnasium.Env
        Usually :func:`atari_zarr.ale.make_dqn_env`'s result.

    Returns
    -------
    dict
        ``env_id``, ``spec`` (gymnasium's JSON spec, when it can be serialised),
        ``ale`` (ALE's own settings and action set), ``wrappers`` (the settings of
        each wrapper, outermost first). JSON-serialisable.

    Examples
    --------
    >>> env = make_dqn_env("Pong")
    >>> s = env_settings(env)
    >>> s["env_id"], s["ale"]["repeat_action_probability"], s["ale"]["action_set"]
    ('ALE/Pong-v5', 0.25, [0, 1, 3, 4, 11, 12])
    >>> [w["name"] for w in s["wrappers"]][:2]
    ['TimeLimit', 'AtariPreprocessing']
    >>> env.close()
    """
    spec = getattr(env, "spec", None)
    out: dict[str, Any] = {"env_id": spec.id if spec is not None else None, "spec": None}
    if spec is not None:
        try:
            out["spec"] = json.loads(spec.to_json())
        except Exception:  # kwargs that JSON cannot hold (callables): keep what can be kept
            out["spec"] = {"id": spec.id, "max_episode_steps": spec.max_episode_steps}
    wrappers = []
    e = env
    while isinstance(e, gymnasium.Wrapper):
        settings = {
            k.lstrip("_"): list(v) if isinstance(v, tuple) else v
            for k, v in vars(e).items()
            if (not k.startswith("_") or k == "_max_episode_steps") and _is_plain(v)
        }
        wrappers.append({"name": type(e).__name__, **settings})
        e = e.env
    out["wrappers"] = wrappers
    ale = getattr(e, "ale", None)
    if ale is not None:
        action_set = getattr(e, "_action_set", None)
        if action_set is None:
            action_set = ale.getMinimalActionSet()
        out["ale"] = {
            "repeat_action_probability": float(ale.getFloat("repeat_action_probability")),
            "frame_skip": int(ale.getInt("frame_skip")),
            "env_frameskip": getattr(e, "_frameskip", None),
            "action_set": [int(getattr(a, "value", a)) for a in action_set],
        }
        try:
            import ale_py

            out["ale"]["ale_py_version"] = ale_py.__version__
        except ImportError:  # pragma: no cover - ale exists, so ale_py does
            pass
    return out


class ZarrCollector(gymnasium.Wrapper):
    """A gymnasium wrapper that records every step into an atari_zarr store.

    Each ``step`` adds the row ``(observation acted on, action, reward, terminated,
    truncated)``; the frame returned by the step that ends an episode is kept as
    that episode's final observation. A ``reset()`` while an episode is open
    truncates it (its last row gets ``truncated``). ``close()`` truncates the open
    episode too, flushes, and marks the store complete.

    Parameters
    ----------
    env : gymnasium.Env
        Env with 84x84 uint8 frames and discrete actions, e.g.
        :func:`atari_zarr.ale.make_dqn_env`.
    game, run : str, optional
        Recorded as attributes (default: from the env id, and ``"collected"``).
    path, max_buffer_steps, max_buffer_episodes, overwrite, command, storage_options, timeout
        As :class:`~atari_zarr.record.writer.StoreWriter` takes them.

    Attributes
    ----------
    writer : StoreWriter
        What writes the store.

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr import AtariZarrDataset
    >>> path = tempfile.mkdtemp() + "/pong.zarr"
    >>> env = ZarrCollector(make_dqn_env("Pong", max_episode_steps=20), path)
    >>> obs, info = env.reset(seed=0)
    >>> for _ in range(30):
    ...     obs, reward, terminated, truncated, info = env.step(0)
    ...     if terminated or truncated:
    ...         obs, info = env.reset()
    >>> env.close()
    >>> ds = AtariZarrDataset(path)
    >>> len(ds), ds.metadata["counts"]["episodes"]
    (30, 2)
    >>> ds[19]["next", "truncated"].item(), bool(ds[19]["next", "observation"].any())
    (True, True)
    """

    def __init__(
        self,
        env: Any,
        path: str,
        *,
        max_buffer_steps: int = 4096,
        max_buffer_episodes: int | None = None,
        overwrite: bool = False,
        game: str | None = None,
        run: str | None = None,
        command: str | None = None,
        storage_options: dict[str, Any] | None = None,
        timeout: Timeout = "default",
    ) -> None:
        super().__init__(env)
        if getattr(env.action_space, "n", None) is None:
            raise InvalidArgumentError(
                f"{path}: the env's action space is {env.action_space}; expected a Discrete "
                f"space (Atari actions). Record Atari envs, e.g. from "
                f"atari_zarr.ale.make_dqn_env."
            )
        self.writer = StoreWriter(
            path,
            max_buffer_steps=max_buffer_steps,
            max_buffer_episodes=max_buffer_episodes,
            overwrite=overwrite,
            game=game or _game_of(env),
            run=run or "collected",
            command=command,
            env=env_settings(env),
            storage_options=storage_options,
            timeout=timeout,
        )
        self._obs: np.ndarray | None = None  # the frame the next action acts on

    @property
    def path(self) -> str:
        """The store being written."""
        return self.writer.path

    @property
    def transitions(self) -> int:
        """Rows recorded so far (flushed or buffered)."""
        return self.writer.transitions

    @property
    def episodes(self) -> int:
        """Episodes finished so far."""
        return self.writer.episodes

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env; an open episode is truncated first (its last row)."""
        self._check_open()
        if self.writer.episode_open:
            assert self._obs is not None  # an open episode always has a current frame
            self.writer.end_episode(self._obs)
        self.writer.start_episode(seed)
        obs, info = self.env.reset(seed=seed, options=options)
        self._obs = self.writer.frame(obs)
        return obs, info

    def step(self, action: Any):
        """Step the env and record the transition."""
        self._check_open()
        if self._obs is None:
            raise InvalidArgumentError(
                f"{self.path}: step() called before reset() or after the episode ended; "
                f"call reset() to start an episode (gymnasium's rule too)."
            )
        obs, reward, terminated, truncated, info = self.env.step(action)
        nxt = self.writer.frame(obs)
        self.writer.append(
            self._obs,
            int(action),
            float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            next_observation=nxt,
        )
        self._obs = None if terminated or truncated else nxt
        return obs, reward, terminated, truncated, info

    def flush(self) -> None:
        """Write the buffered steps now (see :meth:`StoreWriter.flush`)."""
        self._check_open()
        self.writer.flush()

    def close(self) -> None:
        """Truncate the open episode, write everything, mark the store complete, close the env."""
        if self.writer.closed:
            return
        if self.writer.episode_open:
            assert self._obs is not None
            self.writer.end_episode(self._obs)
        self.writer.close()
        super().close()

    def _check_open(self) -> None:
        if self.writer.closed:
            raise InvalidArgumentError(f"{self.path}: the collector is closed; create a new one")


def collect(
    env: Any,
    path: str,
    *,
    steps: int,
    policy: Callable[[np.ndarray], int] | None = None,
    seed: int | None = None,
    progress: bool = False,
    **collector_kwargs: Any,
) -> ZarrCollector:
    """Play ``steps`` agent steps in ``env`` and record them into ``path``.

    Parameters
    ----------
    env : gymnasium.Env or str
        An env, or a game (``"Pong"``) or env id (``"ALE/Pong-v5"``,
        ``"PongNoFrameskip-v4"``) for :func:`atari_zarr.ale.make_dqn_env`
        (DQN Replay's preprocessing, whatever the id's own settings).
    path : str
        Store to create.
    steps : int
        Transitions to record; the last episode is truncated there.
    policy : callable, optional
        ``policy(observation) -> action``; default uniformly random actions.
    seed : int, optional
        Seeds the first reset (later resets continue the env's generator) and
        the random policy.
    progress : bool
        Show a progress bar.
    **collector_kwargs
        Passed to :class:`ZarrCollector`.

    Returns
    -------
    ZarrCollector
        Closed; its ``transitions`` and ``episodes`` say what was recorded.

    Raises
    ------
    InvalidArgumentError
        ``steps`` is negative, or ``env`` is a string that names no Atari game.

    Examples
    --------
    >>> import tempfile
    >>> c = collect("PongNoFrameskip-v4", tempfile.mkdtemp() + "/p.zarr", steps=10, seed=1)
    >>> c.transitions, c.episodes
    (10, 1)
    """
    if int(steps) < 0:
        raise InvalidArgumentError(f"steps must be non-negative, got {steps}")
    if isinstance(env, str):
        env = make_dqn_env(env)
    collector_kwargs.setdefault(
        "command",
        command_line(
            "collect",
            path,
            env=env.spec.id if env.spec else None,
            steps=int(steps),
            seed=seed,
            overwrite=True,
        ),
    )
    collector = ZarrCollector(env, path, **collector_kwargs)
    rng = np.random.default_rng(seed)
    n_actions = int(env.action_space.n)
    act = policy or (lambda obs: int(rng.integers(n_actions)))
    with progress_bar(int(steps), f"collect {path}", unit="step", enabled=progress) as bar:
        obs, _ = collector.reset(seed=seed)
        for _ in range(int(steps)):
            obs, _, terminated, truncated, _ = collector.step(act(obs))
            bar.update(1)
            if terminated or truncated:
                obs, _ = collector.reset()
        collector.close()
    return collector
