"""Fixture data: DQN Replay runs written the way dopamine and batch_rl wrote them.

:class:`DopamineLoggedBuffer` re-implements, at a small capacity, the two pieces of
code that produced the dataset:

* dopamine's ``OutOfGraphReplayBuffer.add``: before the first row of an episode
  (buffer empty, or previous row terminal) it adds ``stack_size - 1`` all-zero
  padding rows; every row goes to ``cursor = add_count % C``; the buffer starts as
  uninitialised memory (``np.empty``: here, random bytes).
* batch_rl's ``OutOfGraphLoggedReplayBuffer``: after each ``add`` call, if
  ``add_count % C == C - 1`` the whole buffer is logged under the next suffix
  (so a call whose padding steps over that point logs nothing: a missed log);
  ``log_final_buffer`` logs once more with ``add_count`` reset to the cursor.

It also keeps the ground truth that the files alone do not tell: which source row
sits in which slot, which rows are real, and which episode and step each real row
belongs to. :meth:`FixtureRun.truth` derives from it the transitions a perfect
converter must return, without using the converter's own logic.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.sources.dqn_replay.files import LOGS_DIR, filename
from atari_zarr.storage.remote import get_fs

__all__ = [
    "DopamineLoggedBuffer",
    "FixtureRun",
    "Truth",
    "fixture_frame",
    "store_files",
    "write_fixture_run",
]

STACK_SIZE = 4


def fixture_frame(row: int) -> np.ndarray:
    """A frame that encodes ``row`` and is never all zero.

    Examples
    --------
    >>> int(fixture_frame(7)[0, 0]), bool(fixture_frame(0).any())
    (8, True)
    """
    frame = np.full(FRAME_SHAPE, (row % 251) + 1, dtype=np.uint8)
    frame[1, :8] = np.frombuffer(np.int64(row).tobytes(), dtype=np.uint8)
    frame[2:, 3] = np.arange(FRAME_SHAPE[0] - 2, dtype=np.uint8) ^ np.uint8(row % 256)
    return frame


@dataclass
class _Real:
    frame: np.ndarray
    action: int
    reward: float
    terminal: bool
    episode: int
    step: int


@dataclass
class Truth:
    """The transitions a converter must produce, in order (arrays of equal length)."""

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode: np.ndarray
    source_row: np.ndarray

    def __len__(self) -> int:
        return len(self.action)

    @property
    def next_observation(self) -> np.ndarray:
        """The frame after each row, zeros after a terminated or truncated row."""
        nxt = np.zeros_like(self.observation)
        if len(self):
            nxt[:-1] = self.observation[1:]
            nxt[self.terminated | self.truncated] = 0
        return nxt


class DopamineLoggedBuffer:
    """dopamine's circular buffer with batch_rl's logging, writing real ``.gz`` files.

    Parameters
    ----------
    log_dir : str
        Directory (local or fsspec URL) that receives the checkpoint files.
    capacity : int
        Buffer capacity ``C`` (1,000,000 in the real dataset).
    rng : numpy.random.Generator
        Source of the uninitialised-memory garbage.
    storage_options : dict, optional
        For fsspec URLs.
    compresslevel : int
        gzip level of the files (the dataset used 9; tests use 1 for speed).
    """

    def __init__(
        self,
        log_dir: str,
        capacity: int,
        rng: np.random.Generator,
        *,
        storage_options: dict[str, Any] | None = None,
        compresslevel: int = 1,
    ) -> None:
        self.capacity = capacity
        self.fs, self.path = get_fs(log_dir, storage_options)
        self.fs.makedirs(self.path, exist_ok=True)
        self.compresslevel = compresslevel
        # np.empty: never-written slots hold whatever was in memory.
        self.observation = rng.integers(0, 256, (capacity, *FRAME_SHAPE), dtype=np.uint8)
        self.action = rng.integers(0, 18, capacity, dtype=np.int32)
        self.reward = rng.standard_normal(capacity).astype(np.float32)
        self.terminal = rng.integers(0, 2, capacity, dtype=np.uint8)
        self.add_count = 0
        self.log_count = 0
        self.regular_logs = 0
        self.slot_row = np.full(capacity, -1, dtype=np.int64)  # truth: source row per slot
        self.real: dict[int, _Real] = {}  # truth: real rows by source row
        self.contents: dict[int, np.ndarray] = {}  # truth: source rows per logged suffix

    def cursor(self) -> int:
        return self.add_count % self.capacity

    def _add(self, frame: np.ndarray, action: int, reward: float, terminal: int) -> int:
        c = self.cursor()
        self.observation[c] = frame
        self.action[c] = action
        self.reward[c] = reward
        self.terminal[c] = terminal
        self.slot_row[c] = self.add_count
        self.add_count += 1
        return self.add_count - 1

    def add(
        self, frame: np.ndarray, action: int, reward: float, terminal: bool, episode: int, step: int
    ) -> None:
        """One ``add`` call: padding if an episode starts, the row, then maybe a log."""
        if self.add_count == 0 or self.terminal[self.cursor() - 1] == 1:
            zero = np.zeros(FRAME_SHAPE, dtype=np.uint8)
            for _ in range(STACK_SIZE - 1):
                self._add(zero, 0, 0.0, 0)
        row = self._add(frame, action, reward, int(terminal))
        self.real[row] = _Real(
            frame.copy(), int(action), float(reward), bool(terminal), episode, step
        )
        if self.add_count % self.capacity == self.capacity - 1:
            self._log(self.add_count)
            self.regular_logs += 1

    def log_final(self) -> None:
        """batch_rl's ``log_final_buffer``: log once more with add_count = cursor."""
        self._log(self.cursor())

    def _save(self, name: str, array: np.ndarray) -> None:
        target = f"{self.path}/{filename(name, self.log_count)}"
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=self.compresslevel, mtime=0) as gz:
            np.save(gz, array, allow_pickle=False)
        with self.fs.open(target, "wb") as f:
            f.write(raw.getvalue())

    def _log(self, add_count: int) -> None:
        c = self.cursor()
        self._save("observation", self.observation)
        self._save("action", self.action)
        self._save("reward", self.reward)
        self._save("terminal", self.terminal)
        self._save("add_count", np.array(add_count, dtype=np.int64))
        invalid = np.array([(c - 1 + i) % self.capacity for i in range(STACK_SIZE + 1)])
        self._save("invalid_range", invalid.astype(np.int64))
        self.contents[self.log_count] = self.slot_row.copy()
        self.log_count += 1


@dataclass
class FixtureRun:
    """A written fixture run and its ground truth."""

    url: str
    capacity: int
    buffer: DopamineLoggedBuffer
    suffixes: list[int] = field(default_factory=list)

    @property
    def wrapped_before_first_log(self) -> bool:
        """The buffer wrapped but no full-buffer log happened (only a final log).

        The files cannot tell this apart from a run that never wrapped; the real
        dataset logs every run many times, so it never arises there.
        """
        return self.buffer.regular_logs == 0 and self.buffer.add_count >= self.capacity

    def truth(
        self, suffixes: Iterable[int] | None = None, available: Iterable[int] | None = None
    ) -> Truth:
        """Transitions a perfect converter returns for the checkpoints ``suffixes``.

        A checkpoint contributes the real rows it holds, less those held by the
        previous *available* checkpoint (only the final checkpoint overlaps it).

        Parameters
        ----------
        suffixes : iterable of int, optional
            Checkpoints converted (default: all available).
        available : iterable of int, optional
            Checkpoints present in the source (default: all written).
        """
        avail = sorted(self.suffixes if available is None else available)
        chosen = set(avail if suffixes is None else suffixes)
        rows: set[int] = set()
        for i, s in enumerate(avail):
            if s not in chosen:
                continue
            held = set(int(r) for r in self.buffer.contents[s] if int(r) in self.buffer.real)
            if i > 0:
                held -= set(int(r) for r in self.buffer.contents[avail[i - 1]])
            rows |= held
        order = sorted(rows)
        reals = [self.buffer.real[r] for r in order]
        n = len(order)
        terminated = np.array([r.terminal for r in reals], dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        for i, r in enumerate(reals):
            if r.terminal:
                continue
            nxt = reals[i + 1] if i + 1 < n else None
            if nxt is None or (nxt.episode, nxt.step) != (r.episode, r.step + 1):
                truncated[i] = True
        episode = np.zeros(n, dtype=np.int64)
        if n:
            episode[1:] = np.cumsum((terminated | truncated)[:-1])
        return Truth(
            observation=(
                np.stack([r.frame for r in reals]) if n else np.zeros((0, *FRAME_SHAPE), np.uint8)
            ),
            action=np.array([r.action for r in reals], dtype=np.int32),
            reward=np.array([r.reward for r in reals], dtype=np.float32),
            terminated=terminated,
            truncated=truncated,
            episode=episode,
            source_row=np.array(order, dtype=np.int64),
        )


def write_fixture_run(
    root: str,
    game: str,
    run: str,
    *,
    capacity: int = 64,
    steps: int = 500,
    seed: int = 0,
    episode_lengths: Sequence[int] | None = None,
    max_episode_length: int = 40,
    final_log: bool = True,
    frames: Callable[[int], np.ndarray] | None = None,
    actions: Callable[[int], int] | None = None,
    storage_options: dict[str, Any] | None = None,
    compresslevel: int = 1,
) -> FixtureRun:
    """Play ``steps`` synthetic transitions into a logged buffer under ``root/game/run``.

    Parameters
    ----------
    root, game, run : str
        The run lands in ``{root}/{game}/{run}/replay_logs/``.
    capacity : int
        Buffer capacity; small values give many checkpoints, wraps and missed logs.
    steps : int
        Real transitions to add.
    seed : int
        Seeds episode lengths, actions, rewards and the buffer's initial garbage.
    episode_lengths : sequence of int, optional
        Lengths of successive episodes (cycled); default random in
        ``1 .. max_episode_length``. The last episode may be unfinished.
    final_log : bool
        Log the final partial buffer, as batch_rl does at the end of training.
    frames : callable, optional
        ``frames(k)`` gives the frame of the k-th real transition (default
        :func:`fixture_frame`, which is never all zero).
    actions : callable, optional
        ``actions(k)`` gives the action of the k-th transition (default random 0..5).
    storage_options : dict, optional
        For fsspec URLs.
    compresslevel : int
        gzip level of the files.

    Returns
    -------
    FixtureRun

    Examples
    --------
    >>> import tempfile
    >>> run = write_fixture_run(tempfile.mkdtemp(), "Pong", "1", capacity=32, steps=200)
    >>> truth = run.truth()
    >>> len(truth) <= 200, bool(truth.terminated.any())
    (True, True)
    """
    rng = np.random.default_rng(seed)
    url = f"{str(root).rstrip('/')}/{game}/{run}"
    buffer = DopamineLoggedBuffer(
        f"{url}/{LOGS_DIR}",
        capacity,
        rng,
        storage_options=storage_options,
        compresslevel=compresslevel,
    )
    frame_of = frames or fixture_frame
    lengths = list(episode_lengths) if episode_lengths else None
    episode, step, k = 0, 0, 0
    length = lengths[0] if lengths else int(rng.integers(1, max_episode_length + 1))
    while k < steps:
        terminal = step == length - 1
        action = actions(k) if actions else int(rng.integers(0, 6))
        reward = float(rng.choice([-1.0, 0.0, 0.0, 1.0]))
        buffer.add(frame_of(k), action, reward, terminal, episode, step)
        k += 1
        step += 1
        if terminal:
            episode += 1
            step = 0
            length = (
                lengths[episode % len(lengths)]
                if lengths
                else int(rng.integers(1, max_episode_length + 1))
            )
    if final_log:
        buffer.log_final()
    return FixtureRun(url=url, capacity=capacity, buffer=buffer, suffixes=sorted(buffer.contents))


def store_files(path: str | Path, dest: str | Path) -> dict[str, bytes]:
    """Every file of a local store, by path relative to it, for byte-for-byte comparisons.

    The destination root, which the ``command`` attribute names, is replaced by
    ``DEST`` so that stores written to different places compare equal.
    """
    root = Path(path)
    return {
        str(f.relative_to(root)): f.read_bytes().replace(str(dest).encode(), b"DEST")
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }
