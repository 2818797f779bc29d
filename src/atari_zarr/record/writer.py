"""Append recorded play to a new store, episode by episode: :class:`StoreWriter`.

The writer knows nothing of environments: any recorder hands it steps and episode
ends (:class:`~atari_zarr.record.collector.ZarrCollector` does, from a gymnasium
env). It writes the layout the converter writes (``layout.py``), growing the arrays
as it goes, plus :data:`~atari_zarr.layout.FINAL_OBSERVATION`: the frame that ends
each episode, which DQN Replay never kept. So ``next.observation`` is exact at every
terminated and truncated row of a recorded store.

Steps are buffered and flushed every ``max_buffer_steps`` steps or
``max_buffer_episodes`` episodes, in whole write units, each flush ending with the
``flushed`` attribute (:data:`~atari_zarr.layout.FLUSHED_KEY`): a process killed at any
point leaves that prefix readable (``AtariZarrDataset(path, partial=True)``), as
``docs/format.md``'s "What complete means while recording" defines.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from atari_zarr._version import __version__
from atari_zarr.episodes import EpisodeLedger
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
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    create_array,
    create_store,
    for_writing,
    get_array,
    mark_complete,
    spec,
)
from atari_zarr.storage.deadline import Timeout, resolve_timeout
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.remote import open_zarr_store

__all__ = ["StoreWriter"]

log = logging.getLogger("atari_zarr")


class StoreWriter:
    """Append steps and episodes to a new store; ``close()`` marks it complete.

    A step is the row ``(observation acted on, action, reward, terminated,
    truncated)``. The step that ends an episode (``terminated`` or ``truncated``)
    brings the frame it led to, kept as the episode's final observation.
    :meth:`end_episode` ends an open episode at its last step instead, which
    becomes truncated (a recorder that resets or stops mid-episode).

    Parameters
    ----------
    path : str
        Store to create (local path or fsspec URL), e.g. ``pong.zarr``.
    max_buffer_steps : int
        Flush after this many buffered steps. A multiple of 4096 (a frame shard)
        keeps rewrites of partial shards to a minimum.
    max_buffer_episodes : int or None
        Also flush after this many finished episodes.
    overwrite : bool
        Replace whatever is at ``path``.
    game : str, optional
        Recorded as the store's game.
    run : str
        Recorded as the store's run.
    command : str, optional
        How to make the store again, shown when it is found unfinished.
    env : dict, optional
        JSON description of how the frames were made (``env_settings``).
    storage_options : dict, optional
        fsspec options for ``path``.
    timeout : float, None or "default"
        Seconds each call to the store's storage may take (default 60).

    Raises
    ------
    StoreExistsError
        Something is at ``path`` and ``overwrite`` is False.
    InvalidArgumentError
        A buffer size below 1.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from atari_zarr import AtariZarrDataset
    >>> path = tempfile.mkdtemp() + "/made.zarr"
    >>> w = StoreWriter(path, game="Pong")
    >>> frames = np.arange(4 * 84 * 84, dtype=np.uint8).reshape(4, 84, 84)
    >>> w.start_episode(seed=5)
    >>> w.append(frames[0], action=1, reward=0.0)
    >>> w.append(frames[1], action=2, reward=1.0, terminated=True, next_observation=frames[2])
    >>> w.append(frames[2], action=0, reward=0.0)
    >>> w.end_episode(frames[3])  # a reset mid-episode: its last step becomes truncated
    >>> w.close()
    >>> ds = AtariZarrDataset(path)
    >>> td = ds[:]
    >>> td["next", "terminated"].flatten().tolist(), td["next", "truncated"].flatten().tolist()
    ([False, True, False], [False, False, True])
    >>> bool((ds[2]["next", "observation"].numpy() == frames[3]).all())
    True
    >>> ds.metadata["episodes"]["seed"], ds.metadata["episodes"]["return"]
    ([5, None], [1.0, 0.0])
    """

    def __init__(
        self,
        path: str,
        *,
        max_buffer_steps: int = 4096,
        max_buffer_episodes: int | None = None,
        overwrite: bool = False,
        game: str | None = None,
        run: str = "collected",
        command: str | None = None,
        env: Mapping[str, Any] | None = None,
        storage_options: dict[str, Any] | None = None,
        timeout: Timeout = "default",
    ) -> None:
        if int(max_buffer_steps) < 1:
            raise InvalidArgumentError(
                f"max_buffer_steps must be at least 1, got {max_buffer_steps}"
            )
        if max_buffer_episodes is not None and int(max_buffer_episodes) < 1:
            raise InvalidArgumentError(
                f"max_buffer_episodes must be at least 1 or None, got {max_buffer_episodes}"
            )
        self.path = str(path)
        self.max_buffer_steps = int(max_buffer_steps)
        self.max_buffer_episodes = None if max_buffer_episodes is None else int(max_buffer_episodes)
        self.storage_options = dict(storage_options or {})
        self.timeout = resolve_timeout(timeout)
        fs, fs_path = get_fs(self.path, self.storage_options, timeout=self.timeout)
        if fs.exists(fs_path) and (not fs.isdir(fs_path) or fs.ls(fs_path)) and not overwrite:
            raise StoreExistsError(
                f"{self.path} already exists; expected a new location for the recording. "
                f"Pass overwrite=True (--overwrite) to replace it, or choose another path."
            )
        attrs: dict[str, Any] = {
            "kind": "collected",
            "game": game,
            "run": run,
            "command": command,
            "env": dict(env) if env is not None else None,
            "seeds": [],
            FLUSHED_KEY: {"transitions": 0, "episodes": 0},
            "atari_zarr_version": __version__,
        }
        # a destination that cannot be written fails here, with a one-line error
        fs.makedirs(fs_path, exist_ok=True)
        store = open_zarr_store(
            self.path, self.storage_options, read_only=False, timeout=self.timeout
        )
        self._group = create_store(store, 0, attrs)
        create_array(self._group, FINAL_OBSERVATION, 0)
        # The attributes as created (with the layout's own keys), updated at each flush.
        self._meta: dict[str, Any] = dict(cast(Mapping[str, Any], self._group.attrs[ATTRS_KEY]))
        self._arrays = {
            name: for_writing(get_array(self._group, name, self.path))
            for name in (*ARRAYS, FINAL_OBSERVATION)
        }
        # Per array: rows buffered since the start of its last partial write unit
        # (already written ones first), and the first row of that unit.
        self._pending: dict[str, list[np.ndarray]] = {name: [] for name in self._arrays}
        self._unit_start = dict.fromkeys(self._arrays, 0)
        self._written = dict.fromkeys(self._arrays, 0)  # rows on storage
        self._buffered_steps = 0
        self._buffered_episodes = 0
        self._rows = 0  # rows recorded (written or buffered)
        self._episodes = EpisodeLedger()
        self._ep_seed: int | None = None
        self._seeds: list[int | None] = []  # per episode, next to the ledger's columns
        self._closed = False

    @property
    def transitions(self) -> int:
        """Rows recorded so far (flushed or buffered)."""
        return self._rows

    @property
    def episodes(self) -> int:
        """Episodes finished so far."""
        return len(self._episodes)

    @property
    def episode_open(self) -> bool:
        """Whether the current episode has steps and no end yet."""
        return self._episodes.current_length > 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def frame(self, observation: Any) -> np.ndarray:
        """``observation`` as a frame of the store, or an error saying what is wrong with it.

        Raises
        ------
        InvalidArgumentError
            Not an 84x84 uint8 frame.
        """
        frame = np.asarray(observation)
        if frame.shape != FRAME_SHAPE or frame.dtype != np.uint8:
            raise InvalidArgumentError(
                f"{self.path}: observations of shape {frame.shape} and dtype {frame.dtype}; "
                f"the store holds {FRAME_SHAPE} uint8 frames. Make them like "
                f"atari_zarr.ale.make_dqn_env does (84x84 grayscale, no frame stack)."
            )
        return frame

    def start_episode(self, seed: int | None = None) -> None:
        """Record ``seed`` as the seed of the episode the next :meth:`append` opens.

        Raises
        ------
        InvalidArgumentError
            An episode is open: end it first.
        """
        self._check_open()
        if self.episode_open:
            raise InvalidArgumentError(
                f"{self.path}: start_episode() while an episode is open; "
                f"call end_episode(final_observation) first."
            )
        self._ep_seed = None if seed is None else int(seed)

    def append(
        self,
        observation: Any,
        action: int,
        reward: float,
        *,
        terminated: bool = False,
        truncated: bool = False,
        next_observation: Any = None,
    ) -> None:
        """Add one step to the open episode (opening one if none is).

        Parameters
        ----------
        observation : array
            The 84x84 uint8 frame the action acted on.
        action : int
            The action taken.
        reward : float
            The reward it brought.
        terminated, truncated : bool
            The step ends the episode (``terminated`` wins when both are set).
        next_observation : array, optional
            The frame the step led to; needed when the step ends the episode.

        Raises
        ------
        InvalidArgumentError
            A bad frame, or an episode end without ``next_observation``.
        """
        self._check_open()
        obs = self.frame(observation)
        ends = bool(terminated) or bool(truncated)
        final = None
        if ends:
            if next_observation is None:
                raise InvalidArgumentError(
                    f"{self.path}: a step that ends an episode needs next_observation, "
                    f"the frame it led to; pass it to append()."
                )
            final = self.frame(next_observation)
        # Copies: a recorder may hand over a buffer it reuses for the next frame.
        self._add(OBSERVATION, np.array(obs[None]))
        self._add(ACTION, np.array([int(action)], dtype=ARRAYS[ACTION].dtype))
        self._add(REWARD, np.array([reward], dtype=ARRAYS[REWARD].dtype))
        self._add(TERMINATED, np.array([bool(terminated)]))
        self._add(TRUNCATED, np.array([bool(truncated) and not terminated]))
        self._add(EPISODE, np.array([len(self._episodes)], dtype=np.int64))
        self._add(SOURCE_ROW, np.array([self._rows], dtype=np.int64))
        self._rows += 1
        self._buffered_steps += 1
        # the reward as given (not its float32 row) adds up to the episode's return
        self._episodes.feed([float(reward)], [bool(terminated)], [bool(truncated)])
        if final is not None:
            self._finish_episode(final)
        elif self._buffered_steps >= self.max_buffer_steps:
            self.flush()

    def end_episode(self, final_observation: Any) -> None:
        """End the open episode at its last step, which becomes truncated.

        Parameters
        ----------
        final_observation : array
            The frame that followed the last step.

        Raises
        ------
        InvalidArgumentError
            No episode is open.
        """
        self._check_open()
        if not self.episode_open:
            raise InvalidArgumentError(
                f"{self.path}: end_episode() with no open episode; append() steps first."
            )
        final = self.frame(final_observation)
        pending = self._pending[TRUNCATED]
        if pending:
            last = pending[-1].copy()
            last[-1] = True
            pending[-1] = last
            # The step may be written already (a flush right after it): write it again.
            self._written[TRUNCATED] = min(self._written[TRUNCATED], self._rows - 1)
        else:
            # It ended a whole unit that is already written (not yet committed):
            # rewrite that unit; the object is replaced atomically.
            self._arrays[TRUNCATED][self._rows - 1] = True
        self._episodes.cut()
        self._finish_episode(final)

    def flush(self) -> None:
        """Write the buffered steps and record how much is now safely stored."""
        self._check_open()
        for name, arr in self._arrays.items():
            pending = self._pending[name]
            if not pending:
                continue
            data = np.concatenate(pending)
            start = self._unit_start[name]
            end = start + len(data)
            if end == self._written[name]:
                continue
            if end > arr.shape[0]:
                arr.resize((end, *arr.shape[1:]))
            # Whole units from `start` (a unit boundary): earlier rows of the partial
            # unit come from memory, so nothing is read back.
            arr[start:end] = data
            self._written[name] = end
            unit = spec(name).write_rows
            keep_from = (end // unit) * unit
            self._unit_start[name] = keep_from
            self._pending[name] = [data[keep_from - start :]] if keep_from < end else []
        # Whole episodes on storage: rows up to the end of the last finished one.
        flushed = {"transitions": self._episodes.transitions, "episodes": len(self._episodes)}
        self._meta[FLUSHED_KEY] = flushed
        self._meta["episodes"] = self._episode_attrs()
        self._meta["seeds"] = sorted({s for s in self._seeds if s is not None})
        # One attribute write, after the data: it is the commit point.
        self._group.attrs[ATTRS_KEY] = dict(self._meta)
        self._buffered_steps = 0
        self._buffered_episodes = 0
        log.debug(
            "%s: flushed %d transitions, %d episodes",
            self.path,
            flushed["transitions"],
            flushed["episodes"],
        )

    def close(self) -> None:
        """Write everything and mark the store complete; a second call does nothing.

        Raises
        ------
        InvalidArgumentError
            An episode is still open: :meth:`end_episode` it first.
        """
        if self._closed:
            return
        if self.episode_open:
            raise InvalidArgumentError(
                f"{self.path}: close() while an episode is open; "
                f"call end_episode(final_observation) first."
            )
        self.flush()
        # `flushed` stays (now equal to the totals): a store is never without it.
        mark_complete(
            self._group,
            {
                "counts": {"transitions": self._rows, **self._episodes.counts()},
                "episodes": self._episode_attrs(),
            },
        )
        self._closed = True
        log.info(
            "recorded %s: %d transitions, %d episodes", self.path, self._rows, len(self._episodes)
        )

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError(
                f"{self.path}: the recording is closed (complete); record into a new store"
            )

    def _add(self, name: str, rows: np.ndarray) -> None:
        self._pending[name].append(rows)

    def _finish_episode(self, final: np.ndarray) -> None:
        """Record what goes with the episode the ledger just closed."""
        self._add(FINAL_OBSERVATION, np.array(final[None]))
        self._seeds.append(self._ep_seed)
        self._ep_seed = None
        self._buffered_episodes += 1
        if self._buffered_steps >= self.max_buffer_steps or (
            self.max_buffer_episodes is not None
            and self._buffered_episodes >= self.max_buffer_episodes
        ):
            self.flush()

    def _episode_attrs(self) -> dict[str, list]:
        return {**self._episodes.as_attributes(), "seed": list(self._seeds)}
