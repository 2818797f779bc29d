"""Record play from a gymnasium Atari env into a store: :class:`ZarrCollector`.

The collector writes the layout the converter writes (``layout.py``), growing the
arrays as it goes, plus :data:`~atari_zarr.layout.FINAL_OBSERVATION`: the frame that
ends each episode, which DQN Replay never kept. So ``next.observation`` is exact at
every terminated and truncated row of a recorded store.

Crash safety. Steps are buffered in memory and flushed every ``max_buffer_steps``
steps or ``max_buffer_episodes`` finished episodes. A flush (1) grows the arrays,
(2) writes the buffered rows, (3) records in the attributes how many rows and whole
episodes are now on storage (:data:`~atari_zarr.layout.FLUSHED_KEY`). Every object
is replaced atomically (local files are written to a temporary name and renamed;
object stores replace objects whole), so a process killed at any point leaves the
flushed prefix intact, readable with ``AtariZarrDataset(path, partial=True)``.
``close()`` writes the rest and the completion marker.

Write units (shards of frames, chunks of per-step values) are written whole: the
collector keeps the rows of the last, still partial unit of every array in memory
and writes that unit again, complete with the new rows, at the next flush.

Needs the ``collect`` extra (``pip install 'atari-zarr[collect]'``).
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Callable
from typing import Any

import numpy as np

from atari_zarr import __version__
from atari_zarr.errors import InvalidArgumentError, StoreExistsError
from atari_zarr.layout import (
    ACTION,
    ARRAYS,
    ATTRS_KEY,
    EPISODE,
    FINAL_OBSERVATION,
    FLUSHED_KEY,
    FRAME_SHAPE,
    OBSERVATION,
    OPTIONAL_ARRAYS,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    create_array,
    create_store,
    for_writing,
    mark_complete,
)
from atari_zarr.storage.remote import get_fs, open_zarr_store

try:
    import gymnasium
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "recording Atari play needs gymnasium, ale-py and opencv-python-headless; "
        "install them with: pip install 'atari-zarr[collect]'"
    ) from exc

__all__ = ["ZarrCollector", "collect", "env_settings"]

log = logging.getLogger("atari_zarr")

_ENV_ID = re.compile(r"^(?:ALE/)?([A-Za-z0-9]+?)(?:NoFrameskip)?-v\d+$")


def _game_of(env: Any) -> str | None:
    spec = getattr(env, "spec", None)
    match = _ENV_ID.match(spec.id) if spec is not None and spec.id else None
    return match.group(1) if match else None


def _is_plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(isinstance(v, bool | int | float | str) for v in value)
    return isinstance(value, bool | int | float | str)


def env_settings(env: Any) -> dict[str, Any]:
    """What is known about how ``env`` makes its frames: spec, ALE and wrapper settings.

    Parameters
    ----------
    env : gymnasium.Env
        Usually :func:`atari_zarr.record.envs.make_dqn_env`'s result.

    Returns
    -------
    dict
        ``env_id``, ``spec`` (gymnasium's JSON spec, when it can be serialised),
        ``ale`` (ALE's own settings and action set), ``wrappers`` (the settings of
        each wrapper, outermost first). JSON-serialisable.

    Examples
    --------
    >>> from atari_zarr.record.envs import make_dqn_env
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
        :func:`atari_zarr.record.envs.make_dqn_env`.
    path : str
        Store to create (local path or fsspec URL), e.g. ``pong.zarr``.
    max_buffer_steps : int
        Flush after this many buffered steps. A multiple of 4096 (a frame shard)
        keeps rewrites of partial shards to a minimum.
    max_buffer_episodes : int or None
        Also flush after this many finished episodes.
    overwrite : bool
        Replace whatever is at ``path``.
    game, run : str, optional
        Recorded as attributes (default: from the env id, and ``"collected"``).
    command : str, optional
        How to make the store again, shown when it is found unfinished.
    storage_options : dict, optional
        fsspec options for ``path``.

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr import AtariZarrDataset
    >>> from atari_zarr.record.envs import make_dqn_env
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
    ) -> None:
        super().__init__(env)
        if int(max_buffer_steps) < 1:
            raise InvalidArgumentError(
                f"max_buffer_steps must be at least 1, got {max_buffer_steps}"
            )
        if max_buffer_episodes is not None and int(max_buffer_episodes) < 1:
            raise InvalidArgumentError(
                f"max_buffer_episodes must be at least 1 or None, got {max_buffer_episodes}"
            )
        n_actions = getattr(env.action_space, "n", None)
        if n_actions is None:
            raise InvalidArgumentError(
                f"{path}: the env's action space is {env.action_space}; expected a Discrete "
                f"space (Atari actions). Record Atari envs, e.g. atari_zarr.record.envs.make_dqn_env."
            )
        self.path = str(path)
        self.max_buffer_steps = int(max_buffer_steps)
        self.max_buffer_episodes = None if max_buffer_episodes is None else int(max_buffer_episodes)
        self.storage_options = dict(storage_options or {})
        fs, fs_path = get_fs(self.path, self.storage_options)
        if fs.exists(fs_path) and (not fs.isdir(fs_path) or fs.ls(fs_path)) and not overwrite:
            raise StoreExistsError(
                f"{self.path} already exists; expected a new location for the recording. "
                f"Pass overwrite=True (--overwrite) to replace it, or choose another path."
            )
        settings = env_settings(env)
        attrs = {
            "kind": "collected",
            "game": game or _game_of(env),
            "run": run or "collected",
            "command": command,
            "env": settings,
            "seeds": [],
            FLUSHED_KEY: {"transitions": 0, "episodes": 0},
            "atari_zarr_version": __version__,
        }
        store = open_zarr_store(self.path, self.storage_options, read_only=False)
        self._group = create_store(store, 0, attrs)
        create_array(self._group, FINAL_OBSERVATION, 0)
        self._arrays = {
            name: for_writing(self._group[name]) for name in (*ARRAYS, FINAL_OBSERVATION)
        }
        # Per array: rows buffered since the start of its last partial write unit
        # (already written ones first), and the first row of that unit.
        self._pending: dict[str, list[np.ndarray]] = {name: [] for name in self._arrays}
        self._unit_start = dict.fromkeys(self._arrays, 0)
        self._written = dict.fromkeys(self._arrays, 0)  # rows on storage
        self._buffered_steps = 0
        self._buffered_episodes = 0
        self._rows = 0  # rows recorded (written or buffered)
        self._obs: np.ndarray | None = None  # the frame the next action acts on
        self._ep_len = 0
        self._ep_ret = 0.0
        self._lengths: list[int] = []
        self._returns: list[float] = []
        self._terminated: list[bool] = []
        self._seeds: list[int | None] = []
        self._cur_seed: int | None = None
        self._flushed = {"transitions": 0, "episodes": 0}
        self._closed = False

    # -- gymnasium API ------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env; an open episode is truncated first (its last row)."""
        self._check_open()
        if self._ep_len:
            self._end_episode(self._obs, terminated=False, cut=True)
        obs, info = self.env.reset(seed=seed, options=options)
        self._obs = self._frame(obs)
        self._cur_seed = None if seed is None else int(seed)
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
        nxt = self._frame(obs)
        row = self._rows
        self._add(OBSERVATION, self._obs[None])
        self._add(ACTION, np.array([int(action)], dtype=ARRAYS[ACTION].dtype))
        self._add(REWARD, np.array([reward], dtype=ARRAYS[REWARD].dtype))
        self._add(TERMINATED, np.array([bool(terminated)]))
        self._add(TRUNCATED, np.array([bool(truncated) and not terminated]))
        self._add(EPISODE, np.array([len(self._lengths)], dtype=np.int64))
        self._add(SOURCE_ROW, np.array([row], dtype=np.int64))
        self._rows += 1
        self._buffered_steps += 1
        self._ep_len += 1
        self._ep_ret += float(reward)
        self._obs = nxt
        if terminated or truncated:
            self._end_episode(nxt, terminated=bool(terminated), cut=False)
        elif self._buffered_steps >= self.max_buffer_steps:
            self.flush()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Truncate the open episode, write everything and mark the store complete."""
        if self._closed:
            return
        if self._ep_len:
            self._end_episode(self._obs, terminated=False, cut=True)
        self.flush(final=True)
        n_ep = len(self._lengths)
        terminated = int(sum(self._terminated))
        # `flushed` stays (now equal to the totals): a store is never without it.
        mark_complete(
            self._group,
            {
                "counts": {
                    "transitions": self._rows,
                    "episodes": n_ep,
                    "terminated_episodes": terminated,
                    "truncated_episodes": n_ep - terminated,
                },
                "episodes": self._episode_attrs(),
            },
        )
        self._closed = True
        log.info("recorded %s: %d transitions, %d episodes", self.path, self._rows, n_ep)
        super().close()

    # -- recording ------------------------------------------------------------------
    @property
    def transitions(self) -> int:
        """Rows recorded so far (flushed or buffered)."""
        return self._rows

    @property
    def episodes(self) -> int:
        """Episodes finished so far."""
        return len(self._lengths)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError(f"{self.path}: the collector is closed; create a new one")

    def _frame(self, obs: Any) -> np.ndarray:
        frame = np.asarray(obs)
        if frame.shape != FRAME_SHAPE or frame.dtype != np.uint8:
            raise InvalidArgumentError(
                f"{self.path}: the env returns observations of shape {frame.shape} and dtype "
                f"{frame.dtype}; the store holds {FRAME_SHAPE} uint8 frames. Wrap the env "
                f"like atari_zarr.record.envs.make_dqn_env does (84x84 grayscale, no frame stack)."
            )
        return frame

    def _add(self, name: str, rows: np.ndarray) -> None:
        self._pending[name].append(rows)

    def _end_episode(self, final_obs: np.ndarray | None, *, terminated: bool, cut: bool) -> None:
        if cut:  # the last recorded row of the open episode becomes truncated
            pending = self._pending[TRUNCATED]
            if pending:
                last = pending[-1].copy()
                last[-1] = True
                pending[-1] = last
            else:
                # It ended a whole unit that is already written (not yet committed):
                # rewrite that unit; the object is replaced atomically.
                self._arrays[TRUNCATED][self._rows - 1] = True
        assert final_obs is not None  # an open episode always has a current frame
        self._add(FINAL_OBSERVATION, final_obs[None])
        self._lengths.append(self._ep_len)
        self._returns.append(self._ep_ret)
        self._terminated.append(terminated)
        self._seeds.append(self._cur_seed)
        self._ep_len, self._ep_ret, self._obs = 0, 0.0, None
        self._buffered_episodes += 1
        if self._buffered_steps >= self.max_buffer_steps or (
            self.max_buffer_episodes is not None
            and self._buffered_episodes >= self.max_buffer_episodes
        ):
            self.flush()

    def _episode_attrs(self) -> dict[str, list]:
        return {
            "length": list(self._lengths),
            "return": [float(r) for r in self._returns],
            "terminated": list(self._terminated),
            "seed": list(self._seeds),
        }

    def flush(self, *, final: bool = False) -> None:
        """Write the buffered steps and record how much is now safely stored.

        Parameters
        ----------
        final : bool
            Also write the last, partial write unit as the end of the array
            (it is written on every flush anyway; this only matters for logging).
        """
        self._check_open()
        for name, arr in self._arrays.items():
            pending = self._pending[name]
            if not pending:
                continue
            data = np.concatenate(pending)
            start = self._unit_start[name]
            end = start + len(data)
            new_rows = end - self._written[name]
            if new_rows == 0:
                continue
            if end > arr.shape[0]:
                arr.resize((end, *arr.shape[1:]))
            # Whole units from `start` (a unit boundary): earlier rows of the partial
            # unit come from memory, so nothing is read back.
            arr[start:end] = data
            self._written[name] = end
            unit = (ARRAYS.get(name) or OPTIONAL_ARRAYS[name]).write_rows
            keep_from = (end // unit) * unit
            self._unit_start[name] = keep_from
            self._pending[name] = [data[keep_from - start :]] if keep_from < end else []
        # Whole episodes on storage: rows up to the end of the last finished one.
        n_ep = len(self._lengths)
        flushed = {"transitions": int(sum(self._lengths)), "episodes": n_ep}
        meta = dict(self._group.attrs[ATTRS_KEY])
        meta[FLUSHED_KEY] = flushed
        meta["episodes"] = self._episode_attrs()
        meta["seeds"] = sorted({s for s in self._seeds if s is not None})
        # One attribute write, after the data: it is the commit point.
        self._group.attrs[ATTRS_KEY] = meta
        self._flushed = flushed
        self._buffered_steps = 0
        self._buffered_episodes = 0
        log.debug(
            "%s: flushed %d transitions, %d episodes%s",
            self.path,
            flushed["transitions"],
            n_ep,
            " (final)" if final else "",
        )


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
        An env, or a game (``"Pong"``) or env id (``"ALE/Pong-v5"``) for
        :func:`atari_zarr.record.envs.make_dqn_env` (DQN Replay's preprocessing).
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
        Show a tqdm bar.
    **collector_kwargs
        Passed to :class:`ZarrCollector`.

    Returns
    -------
    ZarrCollector
        Closed; its ``transitions`` and ``episodes`` say what was recorded.

    Examples
    --------
    >>> import tempfile
    >>> c = collect("Pong", tempfile.mkdtemp() + "/p.zarr", steps=10, seed=1)
    >>> c.transitions, c.episodes
    (10, 1)
    """
    from atari_zarr.record.envs import make_dqn_env

    if int(steps) < 0:
        raise InvalidArgumentError(f"steps must be non-negative, got {steps}")
    if isinstance(env, str):
        match = _ENV_ID.match(env)
        env = make_dqn_env(match.group(1) if match else env)
    collector_kwargs.setdefault(
        "command",
        " ".join(
            shlex.quote(p)
            for p in [
                "atari-zarr",
                "collect",
                "--env",
                str(env.spec.id if env.spec else env),
                "--steps",
                str(steps),
                *(["--seed", str(seed)] if seed is not None else []),
                "--overwrite",
                str(path),
            ]
        ),
    )
    collector = ZarrCollector(env, path, **collector_kwargs)
    rng = np.random.default_rng(seed)
    n_actions = int(env.action_space.n)
    act = policy or (lambda obs: int(rng.integers(n_actions)))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=int(steps), desc=f"collect {path}", unit="step")
    try:
        obs, _ = collector.reset(seed=seed)
        for _ in range(int(steps)):
            obs, _, terminated, truncated, _ = collector.step(act(obs))
            if bar:
                bar.update(1)
            if terminated or truncated:
                obs, _ = collector.reset()
        collector.close()
    finally:
        if bar:
            bar.close()
    return collector
