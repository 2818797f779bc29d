"""The Dask graph that writes one store from its plan.

* one task per checkpoint streams its observation file once and writes every
  output unit (a shard of frames, a chunk of per-step data) lying entirely
  within the checkpoint's output rows; the rows of units it shares with a
  neighbouring checkpoint are saved as *pieces* in the work area;
* one task per shared unit, depending on the checkpoints that feed it,
  assembles the pieces and writes the unit.

So every unit has exactly one writer (concurrent writes to one shard corrupt it:
zarr-python#3682), and the bytes written do not depend on the scheduler, the
number of workers or the order tasks run in. Pieces travel through the work
area, never through the client. Every task records a marker after its data
(:mod:`atari_zarr.conversion.workdir`), so a conversion run again skips the tasks
whose marker is there.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from atari_zarr.conversion.shards import shard_encoder, write_shard
from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.errors import StoreFormatError
from atari_zarr.layout import ARRAYS, OBSERVATION, for_writing, get_array
from atari_zarr.sources.dqn_replay.files import RunSource
from atari_zarr.sources.dqn_replay.planner import (
    Lap,
    RunPlan,
    lap_destinations,
    lap_step_arrays,
)
from atari_zarr.storage.remote import open_zarr_store

__all__ = ["Job", "build_graph", "expected_keys", "lap_key", "write_lap"]

#: Graph keys of checkpoint tasks start with this (after the conversion's tag).
LAP_PREFIX = "lap-"


@dataclass
class _Piece:
    """Rows of one write unit produced by one checkpoint."""

    array: str
    unit: int
    start: int
    data: np.ndarray


def _units(spec_rows: int, lo: int, hi: int) -> range:
    return range(lo // spec_rows, (hi - 1) // spec_rows + 1) if hi > lo else range(0)


def _unit_bounds(unit: int, rows: int, n_rows: int) -> tuple[int, int]:
    return unit * rows, min((unit + 1) * rows, n_rows)


def write_lap(
    source: RunSource, arrays: Mapping[str, zarr.Array], lap: Lap, n_rows: int
) -> list[_Piece]:
    """Write one checkpoint's transitions; return pieces of units it shares.

    Parameters
    ----------
    source : RunSource
        Where the checkpoint's files are.
    arrays : mapping of str to zarr.Array
        The store's arrays, opened for writing.
    lap : Lap
        The planned part of this checkpoint.
    n_rows : int
        Length of the store.
    """
    if lap.n_out == 0:
        return []
    lo, hi = lap.out_start, lap.out_start + lap.n_out
    pieces: list[_Piece] = []

    fast = shard_encoder(arrays[OBSERVATION])

    def emit(name: str, unit: int, start: int, data: np.ndarray) -> None:
        rows = ARRAYS[name].write_rows
        u_lo, u_hi = _unit_bounds(unit, rows, n_rows)
        if start == u_lo and start + len(data) == u_hi:
            if name == OBSERVATION and fast is not None and len(data) == rows:
                write_shard(arrays[name], unit, fast(data))  # same bytes, twice as fast
            else:
                arrays[name][u_lo:u_hi] = data
        else:
            pieces.append(_Piece(name, unit, start, data.copy()))

    steps = lap_step_arrays(lap, source.read_small(lap.suffix))
    for name, values in steps.items():
        rows = ARRAYS[name].write_rows
        for unit in _units(rows, lo, hi):
            u_lo, u_hi = _unit_bounds(unit, rows, n_rows)
            a, b = max(u_lo, lo), min(u_hi, hi)
            emit(name, unit, a, values[a - lo : b - lo])

    # Frames: stream the file once, in buffer order. The chronological order is a
    # rotation of it, so a few units are open at a time (the first one waits for
    # the buffer's last rows).
    rows = ARRAYS[OBSERVATION].write_rows
    dest = lap_destinations(lap)
    open_units: dict[int, list[Any]] = {}
    for start, block in source.iter_observations(lap.suffix, lap.capacity):
        d = dest[start : start + len(block)]
        sel = np.flatnonzero(d >= 0)
        if not sel.size:
            continue
        out_rows = d[sel]
        units = out_rows // rows
        for unit in np.unique(units):
            unit = int(unit)
            mask = units == unit
            if unit not in open_units:
                u_lo, u_hi = _unit_bounds(unit, rows, n_rows)
                a, b = max(u_lo, lo), min(u_hi, hi)
                open_units[unit] = [
                    a,
                    np.zeros((b - a, *ARRAYS[OBSERVATION].row_shape), dtype=np.uint8),
                    0,
                ]
            entry = open_units[unit]
            entry[1][out_rows[mask] - entry[0]] = block[sel[mask]]
            entry[2] += int(mask.sum())
            if entry[2] == len(entry[1]):
                emit(OBSERVATION, unit, entry[0], entry[1])
                del open_units[unit]
    if open_units:  # pragma: no cover - the plan and the file disagree
        raise RuntimeError(f"checkpoint {lap.suffix}: units {sorted(open_units)} left unfilled")
    return pieces


_SOURCES: dict[tuple[str, ...], RunSource] = {}


@dataclass(frozen=True)
class Job:
    """Everything a task needs, by value: picklable, reopened inside the task."""

    source_url: str
    game: str
    run: str
    source_options: dict[str, Any]
    store_url: str
    store_options: dict[str, Any]
    n_rows: int

    def source(self) -> RunSource:
        options = json.dumps(self.source_options, sort_keys=True, default=str)
        key = (self.source_url, self.game, self.run, options)
        if key not in _SOURCES:  # one directory listing per worker process, not per task
            _SOURCES[key] = RunSource(self.source_url, self.game, self.run, self.source_options)
        return _SOURCES[key]

    def arrays(self) -> dict[str, zarr.Array]:
        store = open_zarr_store(self.store_url, self.store_options, read_only=False)
        group = zarr.open_group(store, mode="r+")
        return {name: for_writing(get_array(group, name, self.store_url)) for name in ARRAYS}

    def work(self) -> WorkDir:
        return WorkDir(self.store_url, self.store_options)


def lap_key(lap: Lap) -> str:
    """Graph key and done marker of a checkpoint's task."""
    return f"{LAP_PREFIX}{lap.suffix}"


def _lap_task(job: Job, lap: Lap) -> None:
    """Write one checkpoint's own units, store its shared pieces, mark it done."""
    pieces = write_lap(job.source(), job.arrays(), lap, job.n_rows)
    work = job.work()
    for piece in pieces:
        work.save_piece(piece.array, piece.unit, piece.start, piece.data)
    work.mark(lap_key(lap))


def _unit_task(job: Job, name: str, unit: int, parts: list[tuple[int, int]], *_deps: Any) -> None:
    """Assemble a unit shared by several checkpoints from their pieces, write it once."""
    spec = ARRAYS[name]
    u_lo, u_hi = _unit_bounds(unit, spec.write_rows, job.n_rows)
    data = np.zeros((u_hi - u_lo, *spec.row_shape), dtype=spec.dtype)
    work = job.work()
    for start, length in parts:
        piece = work.load_piece(name, unit, start)
        if piece.shape != (length, *spec.row_shape) or piece.dtype != spec.dtype:
            raise StoreFormatError(  # pragma: no cover - the work area was tampered with
                f"{work.url}: piece {name}[{start}:{start + length}] has shape {piece.shape} "
                f"{piece.dtype}; expected {(length, *spec.row_shape)} {spec.dtype}. Start over "
                f"with --overwrite."
            )
        data[start - u_lo : start - u_lo + length] = piece
    job.arrays()[name][u_lo:u_hi] = data
    work.mark(work.unit_key(name, unit))
    work.drop_pieces(name, unit)


def _shared_units(plan: RunPlan) -> dict[tuple[str, int], list[tuple[Lap, int, int]]]:
    """Units written by more than one checkpoint: ``(array, unit) -> [(lap, start, length)]``."""
    feeds: dict[tuple[str, int], list[tuple[Lap, int, int]]] = defaultdict(list)
    for lap in plan.laps:
        lo, hi = lap.out_start, lap.out_start + lap.n_out
        for name, spec in ARRAYS.items():
            for unit in _units(spec.write_rows, lo, hi):
                u_lo, u_hi = _unit_bounds(unit, spec.write_rows, plan.n_rows)
                a, b = max(u_lo, lo), min(u_hi, hi)
                if (a, b) != (u_lo, u_hi):
                    feeds[(name, unit)].append((lap, a, b - a))
    return dict(feeds)


def expected_keys(plan: RunPlan, work: WorkDir) -> set[str]:
    """The done markers of every task of ``plan``: all are in once the store is written."""
    laps = {lap_key(lap) for lap in plan.laps if lap.n_out}
    return laps | {work.unit_key(name, unit) for name, unit in _shared_units(plan)}


def build_graph(job: Job, plan: RunPlan, work: WorkDir, done: set[str], tag: str) -> dict[str, Any]:
    """The tasks of ``plan`` whose marker is not in ``done``, keys prefixed by ``tag``.

    ``tag`` makes the keys of one conversion unique (``dask.distributed`` keeps
    results by key); checkpoint tasks have keys ``{tag}lap-{suffix}``.
    """
    graph: dict[str, Any] = {}
    for lap in plan.laps:
        if lap.n_out and lap_key(lap) not in done:
            graph[lap_key(lap)] = (_lap_task, job, lap)
    for (name, unit), parts in _shared_units(plan).items():
        key = work.unit_key(name, unit)
        if key in done:
            continue
        deps = [lap_key(lap) for lap, _, _ in parts if lap_key(lap) in graph]
        graph[key] = (_unit_task, job, name, unit, [(a, n) for _, a, n in parts], *deps)
    return {tag + k: _retag(v, tag, graph) for k, v in graph.items()}


def _retag(task: tuple[Any, ...], tag: str, graph: dict[str, Any]) -> tuple[Any, ...]:
    """Prefix the dependency keys among a task's arguments."""
    return tuple(tag + a if isinstance(a, str) and a in graph else a for a in task)
