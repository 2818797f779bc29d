"""Pass 2 over a shard: what its planned part gives, in output order.

:func:`shard_step_arrays` turns the shard's scan into the per-step arrays of its
rows (nothing is read); :func:`iter_shard_frames` streams the shard a second time
(or reads the frames its scan kept, :class:`~atari_zarr.sources.kind.KeptFrames`)
and yields its frames in blocks, plus the ``final_observation`` row of every episode
it holds: the terminal observation of a terminal episode, zeros (unknown) for a cut
one. A block is cut at the store's write units (:data:`BLOCK_ROWS`, a shard of
frames), records running across it, and the PNGs are decoded straight into it: a
block holding a whole unit is encoded from where it was decoded, never copied.
Memory: one record's PNG bytes (a few MB) and one block of decoded frames.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from atari_zarr.errors import SourceFormatError
from atari_zarr.layout import (
    ACTION,
    ARRAYS,
    EPISODE,
    FINAL_OBSERVATION,
    FRAME_SHAPE,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    UNCLIPPED_REWARD,
)
from atari_zarr.sources.kind import KeptFrames
from atari_zarr.sources.rl_unplugged.example import parse_episode
from atari_zarr.sources.rl_unplugged.planner import SHARD_STRIDE, ShardPart
from atari_zarr.sources.rl_unplugged.png import decode_frames
from atari_zarr.sources.rl_unplugged.scan import ShardScan
from atari_zarr.sources.rl_unplugged.tfrecord import iter_records

if TYPE_CHECKING:
    from atari_zarr.sources.rl_unplugged.files import RluRun

__all__ = ["BLOCK_ROWS", "iter_shard_frames", "shard_step_arrays"]

#: Frames decoded per block (29 MB), which ends where a unit of the store's frames ends.
BLOCK_ROWS = ARRAYS[OBSERVATION].write_rows


def shard_step_arrays(part: ShardPart, scan: ShardScan) -> dict[str, np.ndarray]:
    """The per-step arrays of ``part``'s rows, by array of the layout.

    Keys are ``ACTION``, ``REWARD`` (clipped), ``UNCLIPPED_REWARD``, ``TERMINATED``,
    ``TRUNCATED``, ``EPISODE`` and ``SOURCE_ROW``.
    """
    if scan.action is None or scan.reward is None or scan.unclipped_reward is None:
        raise ValueError(f"the scan of shard {part.index} was loaded without its steps")
    n = part.rows
    real = part.real(scan)
    has = real > 0
    ends = np.cumsum(real)[has] - 1  # last row of each kept episode, from the part's start
    terminal = scan.terminal[: part.records].copy()
    if part.cut_rows is not None and part.records:
        terminal[-1] = False
    terminated = np.zeros(n, dtype=bool)
    truncated = np.zeros(n, dtype=bool)
    terminated[ends[terminal[has]]] = True
    truncated[ends[~terminal[has]]] = True
    episode = np.repeat(
        np.arange(part.first_episode, part.first_episode + len(ends), dtype=np.int64), real[has]
    )
    # source_row: the Example step of each row, counted over the shard's records
    step_starts = np.concatenate([[0], np.cumsum(scan.steps[: part.records - 1])])
    first = np.repeat(step_starts - np.concatenate([[0], np.cumsum(real)[:-1]]), real)
    source_row = part.index * SHARD_STRIDE + first + np.arange(n, dtype=np.int64)
    return {
        ACTION: scan.action[:n].astype(np.int32),
        REWARD: scan.reward[:n].astype(np.float32),
        UNCLIPPED_REWARD: scan.unclipped_reward[:n].astype(np.float32),
        TERMINATED: terminated,
        TRUNCATED: truncated,
        EPISODE: episode,
        SOURCE_ROW: source_row.astype(np.int64),
    }


def iter_shard_frames(
    run: RluRun,
    part: ShardPart,
    scan: ShardScan,
    block_rows: int = BLOCK_ROWS,
    kept: KeptFrames | None = None,
) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Stream shard ``part.index`` again: yield ``(array, rows, frames)`` blocks.

    ``array`` is ``OBSERVATION`` (``rows`` are output rows, consecutive) or
    ``FINAL_OBSERVATION`` (``rows`` are episode ids). Frames of one block are a fresh
    array. ``OBSERVATION`` blocks end at the multiples of ``block_rows`` (output rows)
    and at the part's end, so a block lies within one unit of ``block_rows`` rows
    and holds all of it that the part gives. With ``kept``, the frames the scan
    kept are read instead of the shard.

    Raises
    ------
    SourceFormatError
        Naming the shard and the record: damaged data, a PNG that is not 84x84
        grayscale, or a record that differs from what the scan saw (the file changed
        between the passes).
    """
    where = run.where(part.index)
    row = part.out_start
    episode = part.first_episode
    if part.records == 0:
        return
    seen = 0
    end = part.out_start + part.rows
    block = np.empty(0)
    block_start = row  # output row of block[0]
    filled = 0

    def new_block() -> np.ndarray:
        stop = min(end, (block_start // block_rows + 1) * block_rows)
        return np.empty((stop - block_start, *FRAME_SHAPE), dtype=np.uint8)

    offsets = scan.record_offsets()
    for record, n, terminal, frames_of, final_of in _records(run, part, scan, kept, where):
        seen += 1
        if n == 0:
            continue
        a = 0
        while a < n:
            if filled == len(block):
                block = new_block()
                filled = 0
            b = min(n, a + len(block) - filled)
            frames_of(a, b, block[filled : filled + b - a], int(offsets[record]))
            filled += b - a
            a = b
            if filled == len(block):
                rows = np.arange(block_start, block_start + filled, dtype=np.int64)
                yield OBSERVATION, rows, block
                block_start += filled
        row += n
        cut = part.cut_rows is not None and record == part.records - 1
        final = final_of() if terminal and not cut else None
        if final is None:
            final = np.zeros((1, *FRAME_SHAPE), dtype=np.uint8)
        yield FINAL_OBSERVATION, np.array([episode], dtype=np.int64), final.reshape(1, *FRAME_SHAPE)
        episode += 1
    if seen < part.records:
        raise SourceFormatError(
            f"{where}: record {seen}: the shard ends after {seen} records, but the first pass "
            f"read {part.records}; expected the same file in both passes. The shard changed "
            f"during the conversion: convert again with --overwrite."
        )


def _records(
    run: RluRun, part: ShardPart, scan: ShardScan, kept: KeptFrames | None, where: str
) -> Iterator[tuple[int, int, bool, Any, Any]]:
    """``(record, real steps, terminal, frames_of, final_of)`` of the part's records.

    ``frames_of(a, b, out, offset)`` fills ``out`` with the record's real steps
    ``a .. b - 1`` (``offset``: its first step over the shard's records);
    ``final_of()`` gives its frame after the last real step. From the kept frames
    when given, else from the shard, read again and checked against the scan.
    """
    real = part.real(scan)
    if kept is not None:
        frames = kept

        def from_kept(a: int, b: int, out: np.ndarray, offset: int) -> None:
            frames.steps(offset + a, offset + b, out)

        for record in range(part.records):

            def final_from_kept(record: int = record) -> np.ndarray | None:
                return frames.final(record)

            yield record, int(real[record]), bool(scan.terminal[record]), from_kept, final_from_kept
        return
    with run.open(part.index) as stream:
        for record, data in iter_records(stream, where):
            if record >= part.records:
                break
            ep = parse_episode(data, where, record)
            if ep.steps != int(scan.steps[record]) or ep.terminal != bool(scan.terminal[record]):
                raise SourceFormatError(
                    f"{where}: record {record}: holds {ep.steps} steps (terminal {ep.terminal}), "
                    f"but the first pass read {int(scan.steps[record])} (terminal "
                    f"{bool(scan.terminal[record])}); expected the same file in both passes. The "
                    f"shard changed during the conversion: convert again with --overwrite."
                )

            def from_source(
                a: int, b: int, out: np.ndarray, offset: int, ep: Any = ep, record: int = record
            ) -> None:
                decode_frames(ep.observations[a:b], where, record, out=out, first_step=a)

            def final_from_source(ep: Any = ep, record: int = record) -> np.ndarray:
                last = ep.steps - 1
                return decode_frames(ep.observations[last:], where, record, first_step=last)

            yield record, int(real[record]), ep.terminal, from_source, final_from_source
