"""The Dask graphs that write one store from its plan, for every source kind.

Write graph (:func:`build_graph`):

* one task per *part* (a DQN Replay checkpoint, an RL Unplugged shard) streams the
  part's source once and writes every output unit (a shard of frames, a chunk of
  per-step data, a chunk of final frames) lying entirely within the part's rows;
  the rows of units it shares with a neighbouring part are saved as *pieces* in the
  work area;
* one task per shared unit, depending on the parts that feed it, assembles the
  pieces and writes the unit.

So every unit has exactly one writer (concurrent writes to one shard corrupt it:
zarr-python#3682), and the bytes written do not depend on the scheduler, the
number of workers or the order tasks run in. Pieces travel through the work
area, never through the client. Every task records a marker after its data
(:mod:`atari_zarr.conversion.workdir`), so a conversion run again skips the tasks
whose marker is there.

Scan graph (:func:`build_scan_graph`, for kinds that scan: RL Unplugged): one task per
part reads it once, as far as the selection needs, without its frames (pass 1) and
saves the scan in the work area, with a marker, before planning. With
``Job.keep_frames`` the scan also decodes the frames and keeps them in the work area
(:mod:`atari_zarr.conversion.kept_frames`), and the part's write task reads them
there: a source over a network is then fetched once.

Arrays live in two row spaces: transitions (``N`` rows: ``observation``, the
per-step arrays) and episodes (``final_observation``, one row per episode). A part
covers a range of each; units are cut the same way in both.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from atari_zarr.conversion.kept_frames import FrameBlocks, KeptFrameBlocks, drop_kept, has_kept
from atari_zarr.conversion.shards import shard_encoder, write_shard
from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.errors import SourceFormatError, StoreFormatError
from atari_zarr.layout import (
    OBSERVATION,
    for_writing,
    get_array,
    spec,
)
from atari_zarr.sources.registry import Part, Selection, get_kind, part_rows
from atari_zarr.storage.deadline import DEFAULT_TIMEOUT
from atari_zarr.storage.paths import is_url
from atari_zarr.storage.remote import open_zarr_store

log = logging.getLogger("atari_zarr")

__all__ = [
    "LAP_PREFIX",
    "SCAN_PREFIX",
    "Job",
    "build_graph",
    "build_scan_graph",
    "expected_keys",
    "write_part",
]

#: Graph keys of DQN Replay checkpoint tasks start with this (after the conversion's tag).
LAP_PREFIX = "lap-"
#: Graph keys of scan tasks start with this (after the conversion's tag).
SCAN_PREFIX = "scan-"


@dataclass
class _Piece:
    """Rows of one write unit produced by one part."""

    array: str
    unit: int
    start: int
    data: np.ndarray


def _units(spec_rows: int, lo: int, hi: int) -> range:
    return range(lo // spec_rows, (hi - 1) // spec_rows + 1) if hi > lo else range(0)


def _unit_bounds(unit: int, rows: int, n_rows: int) -> tuple[int, int]:
    return unit * rows, min((unit + 1) * rows, n_rows)


def write_part(
    arrays: Mapping[str, zarr.Array],
    sizes: Mapping[str, int],
    part: Part,
    steps: Mapping[str, np.ndarray],
    stream: Iterable[tuple[str, np.ndarray, np.ndarray]],
    before_write: Callable[[], None] | None = None,
) -> list[_Piece]:
    """Write one part's rows; return pieces of the units it shares with other parts.

    Parameters
    ----------
    arrays : mapping of str to zarr.Array
        The store's arrays, opened for writing.
    sizes : mapping of str to int
        Rows of every array written (``N``, or the number of episodes).
    part : Part
        The part.
    steps : mapping of str to numpy.ndarray
        Per-step arrays of the part's rows, in order.
    stream : iterable of (str, numpy.ndarray, numpy.ndarray)
        ``(array, rows, values)`` blocks of the streamed arrays (frames), rows in
        any order; every row of the part's span must come once.
    before_write : callable, optional
        Called before each unit is written; raises to write nothing more (the
        conversion was started over).
    """
    pieces: list[_Piece] = []
    fast = shard_encoder(arrays[OBSERVATION])

    def emit(name: str, unit: int, start: int, data: np.ndarray) -> None:
        rows = spec(name).unit_rows(sizes[name])
        u_lo, u_hi = _unit_bounds(unit, rows, sizes[name])
        if start == u_lo and start + len(data) == u_hi:
            if before_write is not None:
                before_write()
            if name == OBSERVATION and fast is not None and len(data) == rows:
                write_shard(arrays[name], unit, fast(data))  # same bytes, twice as fast
            else:
                arrays[name][u_lo:u_hi] = data
        else:
            pieces.append(_Piece(name, unit, start, data.copy()))

    for name, values in steps.items():
        if name not in sizes:
            continue
        lo, hi = part.span(name)
        rows = spec(name).unit_rows(sizes[name])
        for unit in _units(rows, lo, hi):
            u_lo, u_hi = _unit_bounds(unit, rows, sizes[name])
            a, b = max(u_lo, lo), min(u_hi, hi)
            emit(name, unit, a, values[a - lo : b - lo])

    # Streamed arrays: a few units are open at a time (DQN Replay streams a rotation
    # of the output order, so its first unit waits for the buffer's last rows).
    open_units: dict[tuple[str, int], list[Any]] = {}
    for name, out_rows, block in stream:
        array_spec = spec(name)
        rows = array_spec.unit_rows(sizes[name])
        lo, hi = part.span(name)
        if not len(out_rows):
            continue
        first, last = int(out_rows[0]), int(out_rows[-1])
        # rows in order, without holes (RL Unplugged always, DQN Replay mostly): slices
        contiguous = last - first + 1 == len(out_rows) and bool(np.all(np.diff(out_rows) == 1))
        units = out_rows // rows
        chosen = range(first // rows, last // rows + 1) if contiguous else np.unique(units)
        for unit in chosen:
            unit = int(unit)
            key = (name, unit)
            if key not in open_units:
                u_lo, u_hi = _unit_bounds(unit, rows, sizes[name])
                if contiguous and first <= u_lo and u_hi <= last + 1:
                    # the block holds the whole unit (RL Unplugged decodes into blocks cut
                    # at the units): written from the block, without a copy
                    emit(name, unit, u_lo, block[u_lo - first : u_hi - first])
                    continue
                a, b = max(u_lo, lo), min(u_hi, hi)
                open_units[key] = [
                    a,
                    np.zeros((b - a, *array_spec.row_shape), dtype=array_spec.dtype),
                    0,
                ]
            entry = open_units[key]
            if contiguous:
                a, b = max(first, unit * rows), min(last + 1, (unit + 1) * rows)
                entry[1][a - entry[0] : b - entry[0]] = block[a - first : b - first]
                entry[2] += b - a
            else:
                mask = np.asarray(units == unit)
                entry[1][out_rows[mask] - entry[0]] = block[mask]
                entry[2] += int(np.count_nonzero(mask))
            if entry[2] == len(entry[1]):
                emit(name, unit, entry[0], entry[1])
                del open_units[key]
    if open_units:  # pragma: no cover - the plan and the file disagree
        raise RuntimeError(f"{part.key}: units {sorted(open_units)} left unfilled")
    return pieces


_SOURCES: dict[tuple[Any, ...], Any] = {}


@dataclass(frozen=True)
class Job:
    """Everything a task needs, by value: picklable, reopened inside the task."""

    kind: str
    source_url: str
    game: str
    run: str
    source_options: dict[str, Any]
    store_url: str
    store_options: dict[str, Any]
    #: Rows of every array written: ``(name, rows)``.
    sizes: tuple[tuple[str, int], ...]
    #: Seconds each storage call of a task may take (the conversion's ``timeout``).
    timeout: float | None = DEFAULT_TIMEOUT
    #: The conversion the tasks belong to (the work area's id); a task finding another
    #: one there writes nothing. Empty: not checked.
    conversion: str = ""
    #: Scans keep the frames they read for the write tasks (the source is read once).
    keep_frames: bool = False
    #: The source run as the conversion listed it: every task reads those objects (each
    #: read checks that its object is still the one listed), never a listing of its own.
    listed: Any = None

    def source(self) -> Any:
        if self.listed is not None:
            return self.listed
        options = json.dumps(self.source_options, sort_keys=True, default=str)
        key = (self.kind, self.source_url, self.game, self.run, options, self.timeout)
        if key not in _SOURCES:  # one directory listing per worker process, not per task
            _SOURCES[key] = get_kind(self.kind).open_run(
                self.source_url, self.game, self.run, self.source_options, self.timeout
            )
        return _SOURCES[key]

    def arrays(self) -> dict[str, zarr.Array]:
        store = open_zarr_store(
            self.store_url, self.store_options, read_only=False, timeout=self.timeout
        )
        group = zarr.open_group(store, mode="r+")
        return {name: for_writing(get_array(group, name, self.store_url)) for name, _ in self.sizes}

    def work(self) -> WorkDir:
        return WorkDir(self.store_url, self.store_options, timeout=self.timeout)

    def check_owner(self, work: WorkDir) -> None:
        """Raise :class:`~atari_zarr.errors.StoreLockedError` unless the tasks' conversion
        still owns the store (see :meth:`WorkDir.check_owner`)."""
        if self.conversion:
            work.check_owner(self.conversion)


def _scan_task(job: Job, unit: int, selection: Selection) -> None:
    """Pass 1 over one part (an RL Unplugged shard): save its scan (and its frames, with
    ``job.keep_frames``), mark it done."""
    scan = get_kind(job.kind).scan
    if scan is None:  # pragma: no cover - scan graphs are built for kinds that scan
        raise ValueError(f"source kind {job.kind} has no scan pass")
    work = job.work()
    source = job.source()
    for attempt in (1, 2):
        keep = FrameBlocks(work, unit) if job.keep_frames else None  # (drops a first try's)
        try:
            arrays = scan(source, unit, selection, keep)
            break
        except SourceFormatError as exc:
            # a byte flipped in transit, or an object republished between two ranged
            # reads, reads well the second time (the read checks the object listed):
            # only bytes that fail twice are damage where they are stored
            if attempt == 2 or not is_url(job.source_url):
                raise
            log.info("%s: reading it once more before calling it damaged", str(exc)[:200])
    work.save_scan(unit, arrays)
    work.mark_scan(unit)


def _part_task(job: Job, part: Part) -> None:
    """Write one part's own units, store its shared pieces, mark it done."""
    kind = get_kind(job.kind)
    work = job.work()
    scan = work.load_scan(part.unit) if kind.scans else None
    kept = KeptFrameBlocks(work, part.unit) if kind.scans and has_kept(work, part.unit) else None
    steps, stream = part_rows(kind, job.source(), part, scan, kept)
    pieces = write_part(
        job.arrays(), dict(job.sizes), part, steps, stream, lambda: job.check_owner(work)
    )
    job.check_owner(work)
    for piece in pieces:
        work.save_piece(piece.array, piece.unit, piece.start, piece.data)
    work.mark(part.key)
    if kept is not None:
        drop_kept(work, part.unit)


def _unit_task(job: Job, name: str, unit: int, parts: list[tuple[int, int]], *_deps: Any) -> None:
    """Assemble a unit shared by several parts from their pieces, write it once."""
    array_spec = spec(name)
    n = dict(job.sizes)[name]
    u_lo, u_hi = _unit_bounds(unit, array_spec.unit_rows(n), n)
    data = np.zeros((u_hi - u_lo, *array_spec.row_shape), dtype=array_spec.dtype)
    work = job.work()
    for start, length in parts:
        piece = work.load_piece(name, unit, start)
        if piece.shape != (length, *array_spec.row_shape) or piece.dtype != array_spec.dtype:
            raise StoreFormatError(  # pragma: no cover - the work area was tampered with
                f"{work.url}: piece {name}[{start}:{start + length}] has shape {piece.shape} "
                f"{piece.dtype}; expected {(length, *array_spec.row_shape)} "
                f"{array_spec.dtype}. Start over with --overwrite."
            )
        data[start - u_lo : start - u_lo + length] = piece
    job.check_owner(work)
    job.arrays()[name][u_lo:u_hi] = data
    work.mark(work.unit_key(name, unit))
    work.drop_pieces(name, unit)


def _shared_units(
    parts: list[Part], sizes: Mapping[str, int]
) -> dict[tuple[str, int], list[tuple[Part, int, int]]]:
    """Units written by more than one part: ``(array, unit) -> [(part, start, length)]``."""
    feeds: dict[tuple[str, int], list[tuple[Part, int, int]]] = defaultdict(list)
    for part in parts:
        for name, n in sizes.items():
            array_spec = spec(name)
            lo, hi = part.span(name)
            rows = array_spec.unit_rows(n)
            for unit in _units(rows, lo, hi):
                u_lo, u_hi = _unit_bounds(unit, rows, n)
                a, b = max(u_lo, lo), min(u_hi, hi)
                if (a, b) != (u_lo, u_hi):
                    feeds[(name, unit)].append((part, a, b - a))
    return dict(feeds)


def expected_keys(parts: list[Part], sizes: Mapping[str, int], work: WorkDir) -> set[str]:
    """The done markers of every write task: all are in once the store is written."""
    keys = {part.key for part in parts if part.rows}
    return keys | {work.unit_key(name, unit) for name, unit in _shared_units(parts, sizes)}


def build_graph(
    job: Job, parts: list[Part], work: WorkDir, done: set[str], tag: str
) -> dict[str, Any]:
    """The write tasks whose marker is not in ``done``, keys prefixed by ``tag``.

    ``tag`` makes the keys of one conversion unique (``dask.distributed`` keeps
    results by key); part tasks have keys ``{tag}{part.key}`` (``lap-3``, ``shard-3``).
    """
    sizes = dict(job.sizes)
    graph: dict[str, Any] = {}
    for part in parts:
        if part.rows and part.key not in done:
            graph[part.key] = (_part_task, job, part)
    for (name, unit), feeds in _shared_units(parts, sizes).items():
        key = work.unit_key(name, unit)
        if key in done:
            continue
        deps = [part.key for part, _, _ in feeds if part.key in graph]
        graph[key] = (_unit_task, job, name, unit, [(a, n) for _, a, n in feeds], *deps)
    return {tag + k: _retag(v, tag, graph) for k, v in graph.items()}


def build_scan_graph(
    job: Job, indices: Iterable[int], tag: str, selection: Selection
) -> dict[str, Any]:
    """One scan task per shard in ``indices`` (as far as ``selection`` needs), keys
    ``{tag}scan-{index}``."""
    return {f"{tag}{SCAN_PREFIX}{i}": (_scan_task, job, i, selection) for i in indices}


def _retag(task: tuple[Any, ...], tag: str, graph: dict[str, Any]) -> tuple[Any, ...]:
    """Prefix the dependency keys among a task's arguments."""
    return tuple(tag + a if isinstance(a, str) and a in graph else a for a in task)
