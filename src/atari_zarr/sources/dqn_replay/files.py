"""Find and read DQN Replay checkpoints: ``{root}/{Game}/{run}/replay_logs/``.

Each checkpoint ``N`` is six gzip'd ``.npy`` files written by dopamine's
circular replay buffer (see ``docs/format.md``):

.. code-block:: text

    $store$_observation_ckpt.N.gz   (C, 84, 84) uint8
    $store$_action_ckpt.N.gz        (C,) int32
    $store$_reward_ckpt.N.gz        (C,) float32
    $store$_terminal_ckpt.N.gz      (C,) uint8
    add_count_ckpt.N.gz             () int64
    invalid_range_ckpt.N.gz         (5,) int64   (derived from add_count; not needed)

Files are parsed as plain ``.npy`` only, never unpickled, and observations are
decompressed as a stream in blocks of rows (:mod:`atari_zarr.sources.dqn_replay.npy`).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.layout import FRAME_SHAPE, validate_name
from atari_zarr.sources.dqn_replay.npy import NpyStream
from atari_zarr.sources.roots import list_dirs, open_root, select_games
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.paths import is_url, join

__all__ = ["LOGS_DIR", "Checkpoint", "RunSource", "SmallArrays", "filename", "find_runs"]

log = logging.getLogger("atari_zarr")

LOGS_DIR = "replay_logs"
STORE_PREFIX = "$store$_"
_STORE_KINDS = ("observation", "action", "reward", "terminal")
_REQUIRED = (*_STORE_KINDS, "add_count")
_FILE_RE = re.compile(r"^(?P<name>.+)_ckpt\.(?P<suffix>\d+)\.gz$")


def filename(kind: str, suffix: int) -> str:
    """File name of one array of checkpoint ``suffix``.

    Examples
    --------
    >>> filename("observation", 3)
    '$store$_observation_ckpt.3.gz'
    >>> filename("add_count", 3)
    'add_count_ckpt.3.gz'
    """
    prefix = STORE_PREFIX if kind in _STORE_KINDS else ""
    return f"{prefix}{kind}_ckpt.{suffix}.gz"


@dataclass
class SmallArrays:
    """The per-step arrays and add_count of one checkpoint, in buffer (index) order."""

    suffix: int
    add_count: int
    action: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray

    @property
    def capacity(self) -> int:
        return len(self.action)


@dataclass
class Checkpoint:
    """Paths of the files of one checkpoint suffix."""

    suffix: int
    files: dict[str, str] = field(default_factory=dict)


class RunSource:
    """One game/run of the DQN Replay dataset: the checkpoints under ``replay_logs/``.

    Parameters
    ----------
    url : str
        The run directory (the one that contains ``replay_logs``), local or fsspec URL.
    game, run : str
        Names used for the destination store.
    storage_options : dict, optional
        Passed to fsspec.
    timeout : float, None or "default"
        Seconds each file-system call may take, retries included (default 60).

    Examples
    --------
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> src = RunSource(f"{source_root}/Pong/1", "Pong", "1")
    >>> src.suffixes[:3]
    [0, 1, 2]
    """

    def __init__(
        self,
        url: str,
        game: str,
        run: str,
        storage_options: dict[str, Any] | None = None,
        *,
        timeout: Timeout = "default",
    ) -> None:
        self.url = str(url).rstrip("/")
        self.game = validate_name(game, "game")
        self.run = validate_name(run, "run")
        self.storage_options = dict(storage_options or {})
        self.fs, self._path = get_fs(self.url, self.storage_options, timeout=timeout)
        #: The deadline of every call to the source's file system.
        self.timeout = self.fs.timeout
        self.logs_path = f"{self._path.rstrip('/')}/{LOGS_DIR}"
        self.checkpoints = self._scan()
        self.suffixes = sorted(self.checkpoints)

    def where(self, kind: str, suffix: int) -> str:
        """Human-readable location of one file, for messages."""
        return join(self.url, LOGS_DIR, filename(kind, suffix))

    def _scan(self) -> dict[int, Checkpoint]:
        logs_url = join(self.url, LOGS_DIR)
        try:
            entries = self.fs.ls(self.logs_path, detail=False)
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                f"{logs_url} does not exist: expected a DQN Replay run directory holding "
                f"{LOGS_DIR}/ with $store$_*_ckpt.N.gz files. Point SOURCE at the dataset root "
                f"(which holds {{Game}}/{{run}}/{LOGS_DIR}) or at one run directory."
            ) from exc
        checkpoints: dict[int, Checkpoint] = {}
        for entry in entries:
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            match = _FILE_RE.match(name)
            if not match:
                continue
            kind = match["name"].removeprefix(STORE_PREFIX)
            suffix = int(match["suffix"])
            ckpt = checkpoints.setdefault(suffix, Checkpoint(suffix))
            ckpt.files[kind] = f"{self.logs_path}/{name}"
        if not checkpoints:
            raise SourceNotFoundError(
                f"no checkpoints found in {logs_url}: expected files named like "
                f"'$store$_observation_ckpt.0.gz'. Check that the copy of the run is complete."
            )
        for suffix, ckpt in sorted(checkpoints.items()):
            missing = [k for k in _REQUIRED if k not in ckpt.files]
            if missing:
                names = ", ".join(filename(k, suffix) for k in missing)
                raise SourceNotFoundError(
                    f"checkpoint {suffix} in {logs_url} is missing {names}: every checkpoint "
                    f"needs {', '.join(filename(k, suffix) for k in _REQUIRED)}. Copy the missing "
                    f"files, or leave checkpoint {suffix} out with --checkpoints."
                )
        return checkpoints

    def _open(self, kind: str, suffix: int) -> NpyStream:
        ckpt = self.checkpoints.get(suffix)
        if ckpt is None or kind not in ckpt.files:
            raise SourceNotFoundError(
                f"{self.where(kind, suffix)} does not exist; available checkpoints are "
                f"{self.suffixes}."
            )
        return NpyStream(self.fs, ckpt.files[kind], self.where(kind, suffix))

    def _read_whole(self, kind: str, suffix: int, kinds: str, ndim: int) -> np.ndarray:
        with self._open(kind, suffix) as stream:
            if stream.dtype.kind not in kinds or len(stream.shape) != ndim:
                raise SourceFormatError(
                    f"{stream.where} holds an array of dtype {stream.dtype} and shape "
                    f"{stream.shape}; expected {ndim} dimension(s) of kind {kinds!r} "
                    f"(as dopamine writes). Replace the file with a good copy."
                )
            out = np.empty(stream.shape, dtype=stream.dtype.newbyteorder("="))
            if out.size:
                raw = np.empty(stream.shape, dtype=stream.dtype)
                stream.readinto(raw)
                out[...] = raw
            stream.finish()
            return out

    def read_add_count(self, suffix: int) -> int:
        """The stored ``add_count`` of checkpoint ``suffix``."""
        return int(self._read_whole("add_count", suffix, "iu", 0))

    def read_small(self, suffix: int) -> SmallArrays:
        """Read and check the per-step arrays and add_count of one checkpoint."""
        add_count = self.read_add_count(suffix)
        action = self._read_whole("action", suffix, "iu", 1).astype(np.int32, copy=False)
        reward = self._read_whole("reward", suffix, "f", 1).astype(np.float32, copy=False)
        terminal = self._read_whole("terminal", suffix, "iub", 1).astype(np.uint8, copy=False)
        self._check_lengths(suffix, {"action": action, "reward": reward, "terminal": terminal})
        if add_count < 0:
            raise SourceFormatError(
                f"{self.where('add_count', suffix)} holds {add_count}; expected a count >= 0."
            )
        return SmallArrays(suffix, add_count, action, reward, terminal)

    def _check_lengths(self, suffix: int, arrays: dict[str, np.ndarray]) -> None:
        """One length for the per-step arrays of a checkpoint: the odd file out is named."""
        lengths = {kind: len(array) for kind, array in arrays.items()}
        counts = Counter(lengths.values())
        if len(counts) == 1:
            return
        # The length most files agree on is the capacity; ties go to the first file.
        expected = max(counts, key=lambda n: (counts[n], -list(lengths.values()).index(n)))
        agree = [filename(k, suffix) for k, n in lengths.items() if n == expected]
        kind, found = next((k, n) for k, n in lengths.items() if n != expected)
        raise SourceFormatError(
            f"{self.where(kind, suffix)} holds {found} rows; expected {expected}, the length of "
            f"{' and '.join(agree)} (the buffer capacity of checkpoint {suffix}). The files come "
            f"from different runs or are damaged; copy checkpoint {suffix} again."
        )

    def _check_observation(self, stream: NpyStream, capacity: int) -> None:
        expected = (capacity, *FRAME_SHAPE)
        if (
            stream.dtype != np.uint8
            or stream.shape != expected
            or (stream.fortran and capacity > 1)
        ):
            order = "Fortran" if stream.fortran else "C"
            raise SourceFormatError(
                f"{stream.where} holds {stream.dtype} of shape {stream.shape} in {order} order; "
                f"expected uint8 of shape {expected} in C order (the capacity of the other "
                f"arrays of this checkpoint). Replace the file with a good copy."
            )

    def iter_observations(
        self, suffix: int, capacity: int, block_rows: int = 1024
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(first_index, frames)`` blocks of the observation file in buffer order.

        The yielded array is reused for the next block: copy what you keep.
        """
        with self._open("observation", suffix) as stream:
            self._check_observation(stream, capacity)
            buf = np.empty((min(block_rows, max(capacity, 1)), *FRAME_SHAPE), dtype=np.uint8)
            start = 0
            while start < capacity:
                n = min(block_rows, capacity - start)
                block = buf[:n]
                stream.readinto(block)
                yield start, block
                start += n
            stream.finish()

    def read_observation_rows(self, suffix: int, capacity: int, indices: list[int]) -> np.ndarray:
        """Return the frames at buffer ``indices`` (streams up to the largest one)."""
        wanted = sorted(set(indices))
        found: dict[int, np.ndarray] = {}
        if wanted:
            for start, block in self.iter_observations(suffix, capacity):
                for i in wanted:
                    if start <= i < start + len(block):
                        found[i] = block[i - start].copy()
                if len(found) == len(wanted):
                    break
        return (
            np.stack([found[i] for i in indices])
            if indices
            else np.empty((0, *FRAME_SHAPE), np.uint8)
        )


def find_runs(
    source: str,
    games: list[str] | None = None,
    runs: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: Timeout = "default",
) -> list[RunSource]:
    """Find the game/run directories under ``source``.

    ``source`` is either the dataset root (holding ``{Game}/{run}/replay_logs``) or a
    single run directory (holding ``replay_logs``; game and run are then its last two
    path components).

    Parameters
    ----------
    source : str
        Local path or fsspec URL.
    games, runs : list of str, optional
        Restrict to these games and runs; every one named must exist.
    storage_options : dict, optional
        Passed to fsspec.
    timeout : float, None or "default"
        Seconds each file-system call may take, retries included (default 60).

    Raises
    ------
    SourceNotFoundError
        If ``source`` or a named game or run does not exist, or nothing is found.
    InvalidNameError
        If a game or run name could escape the destination (``../x``).
    """
    fs, root, source = open_root(
        source,
        games,
        runs,
        storage_options,
        f"the DQN Replay root (holding {{Game}}/{{run}}/{LOGS_DIR}) or a run directory",
        timeout,
    )
    if fs.exists(f"{root}/{LOGS_DIR}"):
        parts = source.split("://", 1)[-1].split("/")
        if len(parts) < 2:
            raise SourceNotFoundError(
                f"{source} holds {LOGS_DIR}/ but its path does not end in {{Game}}/{{run}}; "
                f"place the run at .../{{Game}}/{{run}}/{LOGS_DIR}."
            )
        game, run = parts[-2], parts[-1]
        if (games and game not in games) or (runs and run not in runs):
            raise SourceNotFoundError(
                f"{source} is the run {game}/{run}, which --games {games} / --runs {runs} "
                f"exclude. Drop the filters or point SOURCE at the dataset root."
            )
        return [RunSource(source, game, run, storage_options, timeout=timeout)]

    out: list[RunSource] = []
    for game in select_games(fs, root, source, games):
        found_runs = [
            r for r in list_dirs(fs, f"{root}/{game}") if fs.exists(f"{root}/{game}/{r}/{LOGS_DIR}")
        ]
        if runs:
            absent = [r for r in runs if r not in found_runs]
            if absent:
                raise SourceNotFoundError(
                    f"runs {absent} of {game} not found in {join(source, game)}; found "
                    f"{found_runs or 'no run folders with ' + LOGS_DIR}. Check the run names."
                )
            chosen = list(runs)
        else:
            chosen = found_runs
        for run in chosen:
            out.append(
                RunSource(join(source, game, run), game, run, storage_options, timeout=timeout)
            )
    if not out:
        raise SourceNotFoundError(
            f"no runs found in {source}: expected {{Game}}/{{run}}/{LOGS_DIR}/ directories. "
            f"Point SOURCE at the dataset root or at one run directory."
        )
    log.debug("found %d runs under %s (%s)", len(out), source, "url" if is_url(source) else "path")
    return out
