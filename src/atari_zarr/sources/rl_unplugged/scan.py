"""Pass 1 over a shard: its small per-step arrays and per-episode rows, frames left out.

Conversion reads each shard twice (``docs/format.md``, "The passes, and what they
cost"): this scan keeps what planning and the per-step arrays need, streaming the shard
one record at a time and dropping each record's PNG bytes once it is parsed.

A :class:`ShardScan` is plain numpy arrays (:meth:`ShardScan.to_arrays`), so the
conversion can keep it in its work area and a resumed conversion does not scan
again.

Two options make a shard fetched once, and only as far as needed, over a network:

* ``limit``: stop after the record in which the shard's real steps reach
  ``limit`` (a subset that takes a prefix of every checkpoint,
  :meth:`~atari_zarr.subsets.Subset.prefix_rows`); the rest of the GZIP stream is
  never read, so never fetched;
* ``keep``: decode the frames in this pass and hand them to a
  :class:`~atari_zarr.sources.kind.FrameSink`, so that the write pass reads them
  from there instead of streaming the shard again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from atari_zarr.errors import SourceFormatError
from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.sources.kind import FrameSink
from atari_zarr.sources.rl_unplugged.example import parse_episode
from atari_zarr.sources.rl_unplugged.png import decode_frames
from atari_zarr.sources.rl_unplugged.tfrecord import iter_records

__all__ = ["RECORD_FIELDS", "STEP_FIELDS", "ShardScan", "clip_reward", "scan_shard"]

#: Per-record columns of a scan (what planning reads: a few bytes per episode).
RECORD_FIELDS = (
    "steps",
    "real",
    "terminal",
    "checkpoint_idx",
    "episode_idx",
    "episode_return",
    "clipped_episode_return",
    "has_clipped",
    "unclipped_sum",
    "clipped_sum",
)
#: Per-step columns of a scan (what the write pass reads: 16 bytes per step).
STEP_FIELDS = ("action", "reward", "unclipped_reward")


def clip_reward(unclipped: np.ndarray) -> np.ndarray:
    """DQN's reward clipping, where an Example has no ``clipped_rewards``: to [-1, 1].

    Dopamine clips with ``np.clip(reward, -1, 1)`` before storing a transition, and
    TFDS documents ``clipped_reward`` as "[-1, 1] clipping".

    Examples
    --------
    >>> clip_reward(np.array([-3.0, 0.5, 20.0], dtype=np.float32)).tolist()
    [-1.0, 0.5, 1.0]
    """
    return np.clip(np.asarray(unclipped, dtype=np.float32), -1.0, 1.0).astype(np.float32)


@dataclass
class ShardScan:
    """What pass 1 keeps of one shard.

    Per record (episode), in file order: ``steps`` (Example steps, the terminal one
    included), ``real`` (rows it gives: ``steps - 1`` when terminal), ``terminal``,
    ``checkpoint_idx``, ``episode_idx``, the source's ``episode_return`` and
    ``clipped_episode_return`` (NaN where absent), ``has_clipped`` (the Example
    has ``clipped_rewards``) and the float64 sums of its real steps' rewards
    (``unclipped_sum``, ``clipped_sum``). Per real step, records concatenated:
    ``action``, ``reward`` (clipped) and ``unclipped_reward``.
    """

    index: int
    steps: np.ndarray
    real: np.ndarray
    terminal: np.ndarray
    checkpoint_idx: np.ndarray
    episode_idx: np.ndarray
    episode_return: np.ndarray
    clipped_episode_return: np.ndarray
    has_clipped: np.ndarray
    unclipped_sum: np.ndarray
    clipped_sum: np.ndarray
    #: Per-step columns; None in a scan loaded for planning (records only).
    action: np.ndarray | None = None
    reward: np.ndarray | None = None
    unclipped_reward: np.ndarray | None = None

    @property
    def records(self) -> int:
        return int(self.steps.shape[0])

    def record_offsets(self) -> np.ndarray:
        """First real step of every record in the per-step arrays (and the total at the end)."""
        return np.concatenate([[0], np.cumsum(self.real, dtype=np.int64)])

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The scan as named arrays (none is an object array), for the work area."""
        out = {name: getattr(self, name) for name in (*RECORD_FIELDS, *STEP_FIELDS)}
        out["index"] = np.array(self.index, dtype=np.int64)
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> ShardScan:
        """The scan :meth:`to_arrays` gave; the per-step columns may be left out."""
        kwargs = {name: np.asarray(arrays[name]) for name in RECORD_FIELDS}
        steps = {name: np.asarray(arrays[name]) for name in STEP_FIELDS if name in arrays}
        index = int(np.asarray(arrays["index"]).reshape(-1)[0])
        return cls(index=index, **kwargs, **steps)


#: Frames decoded at a time when a scan keeps them (about 7 MB).
_KEEP_BLOCK = 1024


def scan_shard(
    stream: Any,
    where: str,
    index: int,
    *,
    limit: int | None = None,
    keep: FrameSink | None = None,
) -> ShardScan:
    """Read a shard's decompressed stream once and keep everything but the frames.

    Parameters
    ----------
    stream : binary file object
        The decompressed shard (:meth:`atari_zarr.sources.rl_unplugged.files.RluRun.open`).
    where : str
        The shard's URL, for messages.
    index : int
        The shard's index in its file name: every Example's ``checkpoint_idx``.
    limit : int, optional
        Stop after the record in which the real steps read reach ``limit`` (None:
        read the whole shard).
    keep : FrameSink, optional
        Decode every record's real frames and its final frame, and hand them over.

    Raises
    ------
    SourceFormatError
        Naming the shard and the record: damaged framing or CRC, a malformed
        Example, a ``checkpoint_idx`` other than ``index``, or an ``episode_idx`` that
        an earlier record of the shard holds.

    Examples
    --------
    >>> import io
    >>> from atari_zarr.sources.rl_unplugged.example import Episode, encode_episode
    >>> from atari_zarr.record.rl_unplugged import frame_records
    >>> ep = Episode(2, 0, 3.0, 1.0, [b"a", b"b", b"c"], np.array([1, 0, 0]),
    ...              np.array([3.0, 0.0, 0.0]), None, np.array([1.0, 1.0, 0.0]))
    >>> scan = scan_shard(io.BytesIO(frame_records([encode_episode(ep)])), "s", 2)
    >>> scan.real.tolist(), scan.terminal.tolist(), scan.reward.tolist()
    ([2], [True], [1.0, 0.0])
    >>> scan_shard(io.BytesIO(frame_records([encode_episode(ep)])), "s", 5)
    Traceback (most recent call last):
        ...
    atari_zarr.errors.SourceFormatError: s: record 0: checkpoint_idx is 2; expected 5, ...
    """
    per_ep: dict[str, list[Any]] = {name: [] for name in RECORD_FIELDS}
    actions: list[np.ndarray] = []
    rewards: list[np.ndarray] = []
    unclipped: list[np.ndarray] = []
    real_read = 0
    buffer = np.empty((_KEEP_BLOCK, *FRAME_SHAPE), dtype=np.uint8) if keep is not None else None
    records = iter_records(stream, where)
    seen: dict[int, int] = {}  # episode_idx -> the record that holds it
    for record, data in records if limit is None or limit > 0 else ():
        ep = parse_episode(data, where, record, observations=keep is not None)
        if ep.checkpoint_idx != index:
            raise SourceFormatError(
                f"{where}: record {record}: checkpoint_idx is {ep.checkpoint_idx}; expected "
                f"{index}, the shard index in the file name (shard i holds checkpoint i). The "
                f"file was renamed or mixes shards: download it again under its own name."
            )
        if ep.episode_idx in seen:
            raise SourceFormatError(
                f"{where}: record {record}: episode_idx {ep.episode_idx} is record "
                f"{seen[ep.episode_idx]}'s too; expected each episode once in a shard. The "
                f"file holds a record twice (appended again, or two copies joined): download "
                f"it again."
            )
        seen[ep.episode_idx] = record
        n = ep.real_steps
        raw = ep.unclipped_rewards[:n].astype(np.float32)
        clipped = (
            ep.clipped_rewards[:n].astype(np.float32)
            if ep.clipped_rewards is not None
            else clip_reward(raw)
        )
        per_ep["steps"].append(ep.steps)
        per_ep["real"].append(n)
        per_ep["terminal"].append(ep.terminal)
        per_ep["checkpoint_idx"].append(ep.checkpoint_idx)
        per_ep["episode_idx"].append(ep.episode_idx)
        per_ep["episode_return"].append(np.nan if ep.episode_return is None else ep.episode_return)
        per_ep["clipped_episode_return"].append(
            np.nan if ep.clipped_episode_return is None else ep.clipped_episode_return
        )
        per_ep["has_clipped"].append(ep.clipped_rewards is not None)
        per_ep["unclipped_sum"].append(float(raw.astype(np.float64).sum()))
        per_ep["clipped_sum"].append(float(clipped.astype(np.float64).sum()))
        actions.append(ep.actions[:n].astype(np.int64))
        rewards.append(clipped)
        unclipped.append(raw)
        real_read += n
        if keep is not None and buffer is not None:
            for a in range(0, n, _KEEP_BLOCK):
                b = min(n, a + _KEEP_BLOCK)
                out = buffer[: b - a]
                decode_frames(ep.observations[a:b], where, record, out=out, first_step=a)
                keep.steps(out)
            last = ep.steps - 1
            keep.final(
                decode_frames(ep.observations[last:], where, record, first_step=last)[0]
                if ep.terminal
                else None
            )
        if limit is not None and real_read >= limit:
            break  # before the next record is read: the rest of the stream is never fetched
    if keep is not None:
        keep.close()
    dtypes = {
        "steps": np.int64,
        "real": np.int64,
        "terminal": bool,
        "checkpoint_idx": np.int64,
        "episode_idx": np.int64,
        "episode_return": np.float64,
        "clipped_episode_return": np.float64,
        "has_clipped": bool,
        "unclipped_sum": np.float64,
        "clipped_sum": np.float64,
    }
    columns = {name: np.asarray(values, dtype=dtypes[name]) for name, values in per_ep.items()}

    def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.empty(0, dtype)

    return ShardScan(
        index=index,
        action=cat(actions, np.int64),
        reward=cat(rewards, np.float32),
        unclipped_reward=cat(unclipped, np.float32),
        **columns,
    )
