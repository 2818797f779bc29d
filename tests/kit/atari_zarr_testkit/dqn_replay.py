"""Fixture data: DQN Replay runs written the way dopamine and batch_rl wrote them.

The runs are played into :class:`~atari_zarr.sources.dqn_replay.emulator.DopamineLoggedBuffer`,
which writes the checkpoint files as the dataset has them and keeps the ground truth
that the files alone do not tell. :meth:`FixtureRun.truth` derives from that truth the
transitions a perfect converter must return, without using the converter's own logic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.sources.dqn_replay.emulator import DopamineLoggedBuffer
from atari_zarr.sources.dqn_replay.files import LOGS_DIR

__all__ = [
    "DopamineLoggedBuffer",
    "FixtureRun",
    "Truth",
    "craft_index_entry",
    "fixture_frame",
    "store_files",
    "write_episodes_store",
    "write_fixture_run",
    "write_two_runs",
]


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


def craft_index_entry(
    store: str | Path, array: str, shard: int, chunk: int, entry: Sequence[int]
) -> None:
    """Set entry ``chunk`` of shard ``shard``'s index (at the start of its object) of
    ``array`` of the local store at ``store`` to ``entry``, ``(offset, length)`` taken
    modulo ``2**64``, as a hostile writer would: the index's crc32c valid, the object's
    fingerprint recorded again and the metadata consolidated again, so that only the
    entry is wrong.
    """
    import warnings

    import zarr

    from atari_zarr.fingerprints import record
    from atari_zarr.shard_format import crc_bytes

    group = zarr.open_group(str(store), mode="r+")
    target = group[array]
    assert isinstance(target, zarr.Array) and target.shards is not None
    size = 16 * int(np.prod([s // c for s, c in zip(target.shards, target.chunks, strict=True)]))
    path = Path(store, array, "c", str(shard), *["0"] * (target.ndim - 1))
    raw = bytearray(path.read_bytes())
    index = np.frombuffer(bytes(raw[:size]), dtype="<u8").reshape(-1, 2).copy()
    index[chunk] = [int(x) % 2**64 for x in entry]
    body = index.tobytes()
    raw[: size + 4] = body + crc_bytes(body)
    path.write_bytes(bytes(raw))
    record(group)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        zarr.consolidate_metadata(group.store)


def write_episodes_store(root: str | Path, lengths: Sequence[int], *, game: str = "Pong") -> str:
    """A store of one episode after another of ``lengths`` steps, each whole: its URL.

    The run is played under ``root/source`` (one pass over ``lengths``, in a buffer that
    never wraps) and converted under ``root/stores``; row ``i`` of the store is step ``i``.
    """
    from atari_zarr import convert

    steps = int(sum(lengths))
    source, dest = Path(root) / "source", Path(root) / "stores"
    write_fixture_run(
        str(source), game, "1", capacity=2 * steps + 8, steps=steps, episode_lengths=lengths
    )
    [store] = convert(str(source), str(dest), progress=False)
    return str(store.url)


def write_two_runs(root: str | Path) -> str:
    """Pong/1 (2,000 rows in episodes of 1 to 60 steps, logged in wrapping checkpoints)
    and Breakout/2 (300 rows), played under ``root/source`` and converted under
    ``root/stores``: that root."""
    from atari_zarr import convert

    source, dest = Path(root) / "source", Path(root) / "stores"
    write_fixture_run(
        str(source), "Pong", "1", capacity=1000, steps=2000, seed=5, max_episode_length=60
    )
    write_fixture_run(str(source), "Breakout", "2", capacity=300, steps=300, seed=6)
    convert(str(source), str(dest), progress=False)
    return str(dest)
