"""Convert DQN Replay runs into atari_zarr stores, as a Dask graph.

The conversion of one run happens in two passes:

1. **Plan** (:func:`atari_zarr.sources.dqn_replay.planner.plan_run`), in the calling process: read the
   small per-step arrays of every checkpoint and decide, for each buffer row,
   whether it is a real new transition and which output row it becomes. This
   fixes the store's length, so row ``i`` of every array is transition ``i``.
2. **Write**, as a Dask graph that runs on any scheduler (:mod:`atari_zarr.conversion.scheduling`):

   * one task per checkpoint streams its observation file once and writes every
     output unit (a shard of frames, a chunk of per-step data) lying entirely
     within the checkpoint's output rows; the rows of units it shares with a
     neighbouring checkpoint are saved as *pieces* in the work area;
   * one task per shared unit, depending on the checkpoints that feed it,
     assembles the pieces and writes the unit.

   So every unit has exactly one writer (concurrent writes to one shard corrupt it:
   zarr-python#3682), and the bytes written do not depend on the scheduler, the
   number of workers or the order tasks run in. Pieces travel through the work
   area, never through the client.

Every task records a marker after its data (:mod:`atari_zarr.conversion.workdir`); a conversion
killed at any point and run again redoes only the work without a marker, after
checking that the plan is the same (``plan_digest`` attribute). The work area
also holds the lock that refuses a second, concurrent conversion of the same
store. The completion marker is written last (:func:`atari_zarr.layout.mark_complete`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from atari_zarr import __version__
from atari_zarr.conversion.derived import write_derived
from atari_zarr.conversion.scheduling import check_scheduler, describe_scheduler, run_graph
from atari_zarr.conversion.shards import shard_encoder, write_shard
from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.errors import (
    InvalidArgumentError,
    SourceNotFoundError,
    StoreExistsError,
    StoreFormatError,
    StoreIncompleteError,
)
from atari_zarr.layout import (
    ACTION,
    ARRAYS,
    ATTRS_KEY,
    EPISODE,
    FORMAT_VERSION,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    create_store,
    for_writing,
    mark_complete,
    store_path,
)
from atari_zarr.sources.dqn_replay.files import RunSource, find_runs
from atari_zarr.sources.dqn_replay.planner import (
    Lap,
    RunPlan,
    lap_destinations,
    lap_step_arrays,
    plan_run,
)
from atari_zarr.sources.dqn_replay.selection import (
    expand_presets,
    limit_plan,
    selection_attrs,
    selection_flags,
)
from atari_zarr.storage.remote import get_fs, open_zarr_store

__all__ = ["ConvertedStore", "convert", "convert_run", "parse_checkpoints"]

log = logging.getLogger("atari_zarr")

# Output of lap_step_arrays -> array of the layout.
_STEP_ARRAYS = {
    "action": ACTION,
    "reward": REWARD,
    "terminated": TERMINATED,
    "truncated": TRUNCATED,
    "episode": EPISODE,
    "source_row": SOURCE_ROW,
}


@dataclass(frozen=True)
class ConvertedStore:
    """What one conversion wrote."""

    game: str
    run: str
    url: str
    transitions: int
    episodes: int
    gaps: int


@dataclass
class _Piece:
    """Rows of one write unit produced by one checkpoint."""

    array: str
    unit: int
    start: int
    data: np.ndarray


def parse_checkpoints(
    spec: str | Iterable[int] | None, available: Sequence[int]
) -> list[int] | None:
    """Turn a checkpoint selection into suffixes.

    Parameters
    ----------
    spec : str, iterable of int or None
        ``None`` or ``"all"`` for everything; otherwise a comma-separated list of
        suffixes and inclusive ranges (``"0-9,50"``), or an iterable of ints.
    available : sequence of int
        Suffixes present in the source.

    Examples
    --------
    >>> parse_checkpoints("0-2,5", range(10))
    [0, 1, 2, 5]
    >>> parse_checkpoints(None, range(3)) is None
    True
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return None
    chosen: set[int] = set()
    if isinstance(spec, str):
        for part in spec.split(","):
            part = part.strip()
            lo, sep, hi = part.partition("-")
            try:
                if sep:
                    chosen.update(range(int(lo), int(hi) + 1))
                else:
                    chosen.add(int(part))
            except ValueError:
                raise InvalidArgumentError(
                    f"--checkpoints {spec!r}: {part!r} is not a suffix or a range; expected "
                    f"e.g. '0-9,50' or 'all'."
                ) from None
    else:
        chosen.update(int(s) for s in spec)
    missing = sorted(chosen - set(available))
    if missing:
        raise SourceNotFoundError(
            f"checkpoints {missing} were asked for but the source has {list(available)}; "
            f"choose among those."
        )
    return sorted(chosen)


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

    small = source.read_small(lap.suffix)
    steps = lap_step_arrays(lap, small)
    for key, name in _STEP_ARRAYS.items():
        rows = ARRAYS[name].write_rows
        for unit in _units(rows, lo, hi):
            u_lo, u_hi = _unit_bounds(unit, rows, n_rows)
            a, b = max(u_lo, lo), min(u_hi, hi)
            emit(name, unit, a, steps[key][a - lo : b - lo])

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


def _existing_state(url: str, storage_options: dict[str, Any] | None) -> str:
    """``"absent"``, ``"complete"``, ``"incomplete"`` or ``"foreign"``."""
    fs, path = get_fs(url, storage_options)
    if not fs.exists(path):
        return "absent"
    if not fs.exists(f"{path.rstrip('/')}/zarr.json"):
        return "foreign" if fs.ls(path) else "absent"
    try:
        group = zarr.open_group(open_zarr_store(url, storage_options, read_only=True), mode="r")
        meta = group.attrs.get(ATTRS_KEY)
    except Exception:  # unreadable metadata: treat as someone else's data
        return "foreign"
    if not isinstance(meta, dict):
        return "foreign"
    return "complete" if meta.get("complete") else "incomplete"


def _command(source: RunSource, dest: str, checkpoints: list[int] | None) -> str:
    parts = [
        "atari-zarr",
        "convert",
        source.url,
        dest,
        "--games",
        source.game,
        "--runs",
        source.run,
    ]
    if source.url.rstrip("/").endswith(f"{source.game}/{source.run}"):
        parts = ["atari-zarr", "convert", source.url, dest]
    if checkpoints is not None:
        parts += ["--checkpoints", ",".join(map(str, checkpoints))]
    return " ".join(shlex.quote(p) for p in parts)


# -- the task graph -------------------------------------------------------------------

#: Test hook: when set to N, a checkpoint task that finds N checkpoints done pauses
#: (sleeps for an hour) right after recording its own, so that a test can kill the
#: conversion at a known point and resume it. Never set it otherwise.
PAUSE_ENV = "ATARI_ZARR_TEST_PAUSE_AFTER_LAPS"

_SOURCES: dict[tuple[str, ...], RunSource] = {}


@dataclass(frozen=True)
class _Job:
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
        return {name: for_writing(group[name]) for name in ARRAYS}

    def work(self) -> WorkDir:
        return WorkDir(self.store_url, self.store_options)


def _lap_key(lap: Lap) -> str:
    return f"lap-{lap.suffix}"


def _lap_task(job: _Job, lap: Lap) -> int:
    """Write one checkpoint's own units, store its shared pieces, mark it done."""
    pieces = write_lap(job.source(), job.arrays(), lap, job.n_rows)
    work = job.work()
    for piece in pieces:
        work.save_piece(piece.array, piece.unit, piece.start, piece.data)
    work.mark(_lap_key(lap))
    pause = os.environ.get(PAUSE_ENV)
    if pause and len([k for k in work.done() if k.startswith("lap-")]) >= int(pause):
        log.warning("%s set: pausing after checkpoint %d", PAUSE_ENV, lap.suffix)
        time.sleep(3600)
    return lap.capacity


def _unit_task(job: _Job, name: str, unit: int, parts: list[tuple[int, int]], *_deps: Any) -> None:
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


def _plan_digest(
    source: RunSource, selected: list[int] | None, plan: RunPlan, derived: dict[str, Any]
) -> str:
    """Fingerprint of the work: resuming is allowed only into a store with the same one."""
    doc = {
        "derived": derived,
        "format_version": FORMAT_VERSION,
        "source": source.url,
        "game": source.game,
        "run": source.run,
        "selected": selected,
        "n_rows": plan.n_rows,
        "conversion": plan.attributes(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _progress_bar(total: int, desc: str, enabled: bool, initial: int = 0) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="ckpt", leave=True)


def convert_run(
    source: RunSource,
    dest: str,
    *,
    checkpoints: str | Iterable[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    max_transitions: int | None = None,
    max_episodes: int | None = None,
    full_action_space: bool = False,
    return_to_go: bool = False,
) -> ConvertedStore:
    """Convert one game/run into ``{dest}/{game}/{run}.zarr``.

    See :func:`convert` for the parameters.
    """
    url = store_path(dest, source.game, source.run)
    selected = parse_checkpoints(expand_presets(checkpoints), source.suffixes)
    command = _command(source, str(dest), selected) + selection_flags(
        max_transitions, max_episodes, full_action_space, return_to_go
    )
    work = WorkDir(url, storage_options)
    work.acquire(command)
    finished = False
    try:
        result = _convert_locked(
            source,
            url,
            work,
            selected,
            command,
            overwrite,
            progress,
            storage_options,
            scheduler,
            workers,
            {
                "max_transitions": max_transitions,
                "max_episodes": max_episodes,
                "full_action_space": full_action_space,
                "return_to_go": return_to_go,
                "checkpoints": checkpoints,
            },
        )
        finished = True
        return result
    except StoreExistsError:
        finished = True  # complete already: a work area a crash left behind is stale
        raise
    finally:
        work.release(remove_all=finished)


def _convert_locked(
    source: RunSource,
    url: str,
    work: WorkDir,
    selected: list[int] | None,
    command: str,
    overwrite: bool,
    progress: bool,
    storage_options: dict[str, Any] | None,
    scheduler: Any,
    workers: int | None,
    options: dict[str, Any],
) -> ConvertedStore:
    state = _existing_state(url, storage_options)
    if state == "complete" and not overwrite:
        raise StoreExistsError(
            f"{url} already holds a complete store of {source.game}/{source.run}; expected an "
            f"empty destination. Pass --overwrite (overwrite=True) to replace it, or choose "
            f"another DEST."
        )
    if state == "foreign" and not overwrite:
        raise StoreFormatError(
            f"{url} exists and is not an atari_zarr store; refusing to write over it. Remove "
            f"it, choose another DEST, or pass --overwrite."
        )

    bar = _progress_bar(len(source.suffixes), f"plan {source.game}/{source.run}", progress)
    try:
        plan: RunPlan = plan_run(source, selected, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    plan = limit_plan(
        plan,
        source,
        max_transitions=options["max_transitions"],
        max_episodes=options["max_episodes"],
    )
    derived_flags = {k: options[k] for k in ("full_action_space", "return_to_go")}
    digest = _plan_digest(source, selected, plan, derived_flags)

    done: set[str] = set()
    fresh = state != "incomplete" or overwrite
    if not fresh:
        group = zarr.open_group(open_zarr_store(url, storage_options, read_only=False), mode="r+")
        meta = group.attrs.get(ATTRS_KEY, {})
        if meta.get("plan_digest") != digest:
            raise StoreIncompleteError(
                f"{url} is an unfinished conversion of different input (other source, "
                f"checkpoints or converter version): expected the plan of `{command}`, found "
                f"the one of `{meta.get('command')}`. Run that command to finish it, or pass "
                f"--overwrite to start over."
            )
        shapes = {name: (plan.n_rows, *spec.row_shape) for name, spec in ARRAYS.items()}
        if any(name not in group or group[name].shape != shape for name, shape in shapes.items()):
            fresh = True  # killed while creating the arrays: nothing was written yet
        elif work.plan_digest() == digest:
            done = work.done()
        else:  # markers lost: redo everything into the existing arrays
            work.reset(digest)
        if not fresh:
            log.info(
                "%s: resuming, %d of %d checkpoints already written",
                url,
                len([k for k in done if k.startswith("lap-")]),
                len(plan.laps),
            )
    if fresh:
        work.reset(digest)
        attrs = {
            "kind": "dqn-replay",
            "game": source.game,
            "run": source.run,
            "source": {"url": source.url, "checkpoints_selected": selected or source.suffixes},
            "command": command,
            "selection": selection_attrs(
                options["checkpoints"], options["max_transitions"], options["max_episodes"]
            ),
            "plan_digest": digest,
            "atari_zarr_version": __version__,
        }
        store = open_zarr_store(url, storage_options, read_only=False)
        group = create_store(store, plan.n_rows, attrs)

    job = _Job(
        source.url,
        source.game,
        source.run,
        dict(source.storage_options),
        url,
        dict(storage_options or {}),
        plan.n_rows,
    )
    laps = [lap for lap in plan.laps if lap.n_out]
    graph: dict[str, Any] = {}
    for lap in laps:
        if _lap_key(lap) not in done:
            graph[_lap_key(lap)] = (_lap_task, job, lap)
    for (name, unit), parts in _shared_units(plan).items():
        key = work.unit_key(name, unit)
        if key in done:
            continue
        deps = [_lap_key(lap) for lap, _, _ in parts if _lap_key(lap) in graph]
        graph[key] = (_unit_task, job, name, unit, [(a, n) for _, a, n in parts], *deps)
    # distributed keeps results by key: make the keys of this conversion unique
    tag = f"atari-zarr-{digest[:12]}-{uuid.uuid4().hex[:8]}-"
    graph = {tag + k: _retag(v, tag, graph) for k, v in graph.items()}

    n_done = len(laps) - sum(1 for k in graph if k.startswith(tag + "lap-"))
    bar = _progress_bar(len(laps), f"write {source.game}/{source.run}", progress, n_done)
    how = describe_scheduler(scheduler, workers)
    log.info("writing %s with %s: %d tasks", url, how, len(graph))

    def on_done(key: Any) -> None:
        if bar is not None and str(key).startswith(tag + "lap-"):
            bar.update(1)

    try:
        run_graph(graph, list(graph), scheduler=scheduler, workers=workers, on_done=on_done)
    finally:
        if bar:
            bar.close()

    # Nothing is marked complete unless every marker is in.
    expected = {_lap_key(lap) for lap in laps} | {
        work.unit_key(name, unit) for name, unit in _shared_units(plan)
    }
    missing = expected - work.done()
    if missing:  # pragma: no cover - a task returned without writing its marker
        raise RuntimeError(f"{url}: work never recorded as done: {sorted(missing)[:10]}")

    group = zarr.open_group(open_zarr_store(url, storage_options, read_only=False), mode="r+")
    # optional arrays derived from the finished per-step arrays, before the marker
    derived = write_derived(
        group,
        game=source.game,
        where=url,
        action_full=options["full_action_space"],
        return_to_go=options["return_to_go"],
    )
    n_ep = len(plan.episode_length)
    terminated = sum(plan.episode_terminated)
    mark_complete(
        group,
        {
            "conversion": plan.attributes(),
            "counts": {
                "transitions": plan.n_rows,
                "episodes": n_ep,
                "terminated_episodes": terminated,
                "truncated_episodes": n_ep - terminated,
            },
            "episodes": {
                "length": plan.episode_length,
                "return": plan.episode_return,
                "terminated": plan.episode_terminated,
            },
            **({"derived": derived} if derived else {}),
        },
    )
    log.info("wrote %s: %d transitions, %d episodes", url, plan.n_rows, n_ep)
    return ConvertedStore(source.game, source.run, url, plan.n_rows, n_ep, len(plan.gaps))


def _retag(task: tuple[Any, ...], tag: str, graph: dict[str, Any]) -> tuple[Any, ...]:
    """Prefix the dependency keys among a task's arguments."""
    return tuple(tag + a if isinstance(a, str) and a in graph else a for a in task)


def convert(
    source: str,
    dest: str,
    *,
    games: Sequence[str] | None = None,
    runs: Sequence[str] | None = None,
    checkpoints: str | Iterable[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
    source_storage_options: dict[str, Any] | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    max_transitions: int | None = None,
    max_episodes: int | None = None,
    full_action_space: bool = False,
    return_to_go: bool = False,
) -> list[ConvertedStore]:
    """Convert DQN Replay runs under ``source`` into stores under ``dest``.

    Parameters
    ----------
    source : str
        Dataset root holding ``{Game}/{run}/replay_logs/``, or one run directory.
        Local path or fsspec URL.
    dest : str
        Destination root; each run goes to ``{dest}/{Game}/{run}.zarr``.
    games, runs : sequence of str, optional
        Convert only these (default: everything found).
    checkpoints : str or iterable of int, optional
        Checkpoint suffixes to convert, e.g. ``"0-9,50"`` (default: all), or
        d4rl-atari's presets ``"mixed"`` (1), ``"medium"`` (10), ``"expert"`` (50).
    overwrite : bool
        Start over: replace complete stores and discard unfinished ones. Without
        it, an unfinished store of the same plan is resumed (only the missing work
        is done) and a complete one is refused.
    progress : bool
        Show tqdm progress bars (planning, then checkpoints written).
    storage_options : dict, optional
        fsspec options for ``dest`` (and for ``source`` unless
        ``source_storage_options`` is given).
    source_storage_options : dict, optional
        fsspec options for ``source``.
    max_transitions, max_episodes : int, optional
        Keep at most this many transitions / whole episodes of each run; the
        episode a transition limit cuts ends there, truncated.
    full_action_space : bool
        Also write ``action_full``: actions as ALE's 18 actions (needs ale-py).
    return_to_go : bool
        Also write ``return_to_go``: undiscounted sum of rewards to the episode end.
    scheduler : None, str or distributed.Client
        Where the write tasks run: ``"synchronous"``, ``"threads"``,
        ``"processes"``, a ``dask.distributed`` scheduler address or ``Client``.
        ``None``: the active ``Client`` if any, else ``"threads"`` (the CLI
        defaults to ``"processes"``). The store is the same whatever the choice.
        Remote workers must reach ``source`` and ``dest`` under the same names.
    workers : int, optional
        Workers of a local scheduler (default: one per core).

    Raises
    ------
    StoreLockedError
        Another conversion is writing the same store.
    StoreIncompleteError
        The destination holds an unfinished conversion of different input.

    Returns
    -------
    list of ConvertedStore

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr.testing import write_fixture_run
    >>> root, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = write_fixture_run(root, "Pong", "1", capacity=64, steps=300)
    >>> [done] = convert(root, dest, progress=False)
    >>> done.game, done.url.endswith("Pong/1.zarr")
    ('Pong', True)
    """
    check_scheduler(scheduler, workers)
    src_options = storage_options if source_storage_options is None else source_storage_options
    sources = find_runs(source, list(games or []) or None, list(runs or []) or None, src_options)
    return [
        convert_run(
            src,
            dest,
            checkpoints=checkpoints,
            overwrite=overwrite,
            progress=progress,
            storage_options=storage_options,
            scheduler=scheduler,
            workers=workers,
            max_transitions=max_transitions,
            max_episodes=max_episodes,
            full_action_space=full_action_space,
            return_to_go=return_to_go,
        )
        for src in sources
    ]
