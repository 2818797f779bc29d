"""dopamine's circular replay buffer with batch_rl's logging: DQN Replay files from any play.

:class:`DopamineLoggedBuffer` re-implements, at any capacity, the two pieces of code
that produced the dataset, and writes real checkpoint files:

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
belongs to. The demo records real ALE play through it; the tests play synthetic
transitions (the test kit's ``write_fixture_run``, in ``tests/kit``) and check the converter
against that truth.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.sources.dqn_replay.files import LOGS_DIR, filename
from atari_zarr.storage.filesystem import get_fs

__all__ = ["LOGS_DIR", "STACK_SIZE", "DopamineLoggedBuffer"]

#: dopamine's frame stack: ``STACK_SIZE - 1`` zero rows pad the start of every episode.
STACK_SIZE = 4


@dataclass
class _Real:
    frame: np.ndarray
    action: int
    reward: float
    terminal: bool
    episode: int
    step: int


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

    Examples
    --------
    >>> import tempfile
    >>> buffer = DopamineLoggedBuffer(tempfile.mkdtemp(), 8, np.random.default_rng(0))
    >>> for step in range(6):
    ...     frame = np.full((84, 84), step + 1, np.uint8)
    ...     buffer.add(frame, action=1, reward=0.0, terminal=step == 5, episode=0, step=step)
    >>> buffer.add_count, sorted(buffer.contents)  # 3 padding rows, then 6 real; logged at 7
    (9, [0])
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
