"""Check a store: completeness, counts, checksums, and optionally the source.

:func:`verify_store` (``atari-zarr verify STORE [--source RUN_DIR]``) reads the
whole store once, in write units (a 4096-frame shard, a 65,536-row chunk), so
memory stays bounded whatever the store's size, and reports every problem it
finds instead of stopping at the first:

* **completion**: the completion marker and the format version;
* **layout**: every array of :data:`atari_zarr.layout.ARRAYS`, with the shape,
  dtype, chunks and shards of the layout and the length in ``counts``;
* **presence**: every chunk or shard object exists (converters write all-zero
  chunks too, so a missing object means a deleted one, which zarr would
  silently read as zeros);
* **checksums**: every chunk is decoded, so its crc32c (and the crc32c of every
  shard index) is checked: any flipped byte is caught and located to a chunk;
* **consistency**: episode ids, ``terminated``/``truncated`` flags, increasing
  source rows, and the per-episode lengths, returns and counts in the attributes;
* with ``source``: the run is planned again from its files, with the selection
  the store records (checkpoints, ``max_transitions``, ``max_episodes``), through
  the converter's own :func:`~atari_zarr.sources.dqn_replay.selection.build_plan`,
  and every transition (frame, action, reward, flags, episode, source row) is
  compared, streaming the observation files as the converter does.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from atari_zarr.episodes import EpisodeLedger, episode_table
from atari_zarr.errors import AtariZarrError
from atari_zarr.layout import (
    ACTION,
    ARRAYS,
    EPISODE,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    get_array,
    read_metadata,
)
from atari_zarr.progress import progress_bar
from atari_zarr.sources.dqn_replay.files import RunSource
from atari_zarr.sources.dqn_replay.planner import RunPlan, lap_destinations, lap_step_arrays
from atari_zarr.sources.dqn_replay.selection import Selection, build_plan
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.remote import open_zarr_store

__all__ = ["VerifyReport", "verify_store"]

log = logging.getLogger("atari_zarr")

_MAX_PER_KIND = 10  # problems listed per kind; the rest are counted


@dataclass
class VerifyReport:
    """What :func:`verify_store` found.

    Attributes
    ----------
    url : str
        The store.
    problems : list of str
        One line per problem (at most 10 per kind; ``omitted`` counts the rest).
    checked : dict
        What was checked: ``transitions``, ``chunks`` read, ``compared`` transitions.
    rows_to_check : int
        The total of the progress bar: the rows whose frames are read, plus the
        transitions compared with the source.
    """

    url: str
    problems: list[str] = field(default_factory=list)
    omitted: dict[str, int] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)
    rows_to_check: int = 0
    #: What to do about chunks that do not decode: depends on whether the store is finished.
    remedy: str = "The store is damaged; convert it again with --overwrite."
    _kinds: dict[str, int] = field(default_factory=lambda: defaultdict(int), repr=False)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def add(self, kind: str, message: str) -> None:
        self._kinds[kind] += 1
        if self._kinds[kind] <= _MAX_PER_KIND:
            self.problems.append(message)
        else:
            self.omitted[kind] = self._kinds[kind] - _MAX_PER_KIND

    def format(self) -> str:
        """The report as text: one summary line, then one line per problem."""
        done = ", ".join(f"{v:,} {k}" for k, v in self.checked.items())
        if self.ok:
            return f"{self.url}: OK ({done})"
        total = len(self.problems) + sum(self.omitted.values())
        lines = [f"{self.url}: {total} problem(s) found ({done})"]
        lines += [f"  - {p}" for p in self.problems]
        lines += [f"  - ... and {n} more of kind {k!r}" for k, n in self.omitted.items()]
        return "\n".join(lines)


def _units(n_rows: int, rows: int) -> Iterator[tuple[int, int, int]]:
    for unit in range(math.ceil(n_rows / rows)):
        yield unit, unit * rows, min((unit + 1) * rows, n_rows)


def _check_layout(group: zarr.Group, url: str, n_rows: int, report: VerifyReport) -> bool:
    ok = True
    for name, spec in ARRAYS.items():
        arr = get_array(group, name, url)
        expected: dict[str, Any] = {
            "shape": (n_rows, *spec.row_shape),
            "dtype": spec.dtype,
            "chunks": (spec.chunk_rows, *spec.row_shape),
            "shards": (spec.shard_rows, *spec.row_shape) if spec.shard_rows else None,
        }
        for what, want in expected.items():
            got = getattr(arr, what)
            if got != want:
                report.add(
                    "layout",
                    f"{name}: {what} is {got}, expected {want} (layout and counts.transitions)",
                )
                ok = False
    return ok


def _check_presence(
    url: str, options: dict[str, Any] | None, n_rows: int, report: VerifyReport
) -> None:
    fs, path = get_fs(url, options)
    root = path.rstrip("/")
    for name, spec in ARRAYS.items():
        prefix = f"{root}/{name}/c"
        try:
            found = {p[len(prefix) + 1 :] for p in fs.find(prefix)}
        except FileNotFoundError:
            found = set()
        tail = "/0" * len(spec.row_shape)
        missing = [
            (u, a, b) for u, a, b in _units(n_rows, spec.write_rows) if f"{u}{tail}" not in found
        ]
        for u, a, b in missing:
            report.add(
                "missing",
                f"{name}: {'shard' if spec.shard_rows else 'chunk'} {u} (rows {a}..{b - 1}) is "
                f"missing from the store ({name}/c/{u}{tail}); it would read as zeros",
            )


def _read_unit(
    arr: zarr.Array, name: str, unit: int, a: int, b: int, report: VerifyReport
) -> np.ndarray | None:
    """Decode one write unit; on failure, locate the bad chunk(s)."""
    try:
        return np.asarray(arr[a:b])
    except (ValueError, RuntimeError, OSError) as exc:
        spec = ARRAYS[name]
        bad = []
        if spec.shard_rows:
            for c in range(a, b, spec.chunk_rows):
                try:
                    arr[c : min(c + spec.chunk_rows, b)]
                except (ValueError, RuntimeError, OSError):
                    bad.append(c)
        where = (
            f"chunks at rows {bad[:8]}{' ...' if len(bad) > 8 else ''} of shard {unit}"
            if bad
            else f"{'the index of shard' if spec.shard_rows else 'chunk'} {unit}"
        )
        report.add(
            "checksum",
            f"{name}: {where} (rows {a}..{b - 1}) cannot be decoded: {exc}. {report.remedy}",
        )
        return None


class _Consistency:
    """Streaming checks of the per-step arrays against each other and the attributes."""

    def __init__(self, meta: dict[str, Any], report: VerifyReport) -> None:
        self.report = report
        table = episode_table(meta)
        if table is None and "episodes" in meta:
            report.add(
                "episodes",
                "attribute episodes is not a per-episode table (lists length, terminated and "
                "return of one entry per episode, lengths positive); convert the store again",
            )
        self.table = table
        self.counts = meta.get("counts", {})
        self.recomputed = EpisodeLedger()  # the per-episode table, from the arrays
        self.episode = 0  # id expected at the next row
        self.last_source_row: int | None = None
        self.last_ended = True
        self.broken = False

    def feed(self, a: int, cols: dict[str, np.ndarray]) -> None:
        rep = self.report
        term, trunc = cols[TERMINATED], cols[TRUNCATED]
        both = np.flatnonzero(term & trunc)
        if both.size:
            rep.add("flags", f"rows {(a + both[:5]).tolist()} are both terminated and truncated")
        ends = term | trunc
        expected = self.episode + np.concatenate([[0], np.cumsum(ends[:-1], dtype=np.int64)])
        bad = np.flatnonzero(cols[EPISODE] != expected)
        if bad.size:
            i = int(bad[0])
            rep.add(
                "episode-ids",
                f"{EPISODE}[{a + i}] is {int(cols[EPISODE][i])}, expected {int(expected[i])} "
                f"(ids start at 0 and grow by one after each terminated or truncated row)",
            )
            self.broken = True  # later ids would all be off: one report is enough
        src = cols[SOURCE_ROW]
        prev = [] if self.last_source_row is None else [self.last_source_row]
        steps = np.diff(np.concatenate([prev, src]).astype(np.int64))
        if (steps <= 0).any():
            i = int(np.flatnonzero(steps <= 0)[0]) + (0 if prev else 1)
            rep.add("order", f"{SOURCE_ROW} does not increase at row {a + i}")
        if (cols[ACTION] < 0).any():
            rep.add("actions", f"{ACTION} has negative values in rows {a}..{a + len(src) - 1}")
        ledger = self.recomputed
        first = len(ledger)
        closed = ledger.feed(cols[REWARD], term, trunc)
        for k, end in enumerate(closed.tolist(), start=first):
            self._compare(k, a + end)
        if not self.broken:
            self.episode = int(expected[-1] + ends[-1])
        self.last_source_row = int(src[-1])
        self.last_ended = bool(ends[-1])

    def _compare(self, k: int, row: int) -> None:
        """Episode ``k``, just closed at ``row``, against the attributes."""
        table = self.table
        if table is None or k >= len(table):
            return
        ledger = self.recomputed
        length, ret, terminated = ledger.length[k], ledger.returns[k], ledger.terminated[k]
        want_ret = float(table.returns[k]) if table.returns is not None else math.nan
        same_return = math.isclose(want_ret, ret, rel_tol=1e-6, abs_tol=1e-3)
        want_len, want_term = int(table.length[k]), bool(table.terminated[k])
        if want_len != length or want_term != terminated or not same_return:
            self.report.add(
                "episodes",
                f"episode {k} (ending at row {row}): length {length}, return "
                f"{ret:g}, terminated {terminated} in the arrays; the attributes say "
                f"{want_len}, {want_ret:g}, {want_term}",
            )

    def finish(self) -> None:
        counts = self.recomputed.counts()
        n = counts["episodes"]
        recorded = 0 if self.table is None else len(self.table)
        if not self.last_ended:
            self.report.add("flags", "the last row neither terminates nor truncates its episode")
        if n != recorded or n != self.counts.get("episodes"):
            self.report.add(
                "counts",
                f"the arrays hold {n} episodes; attributes: counts.episodes = "
                f"{self.counts.get('episodes')}, episodes.length has {recorded}",
            )
        n_term = counts["terminated_episodes"]
        if n_term != self.counts.get("terminated_episodes"):
            self.report.add(
                "counts",
                f"the arrays hold {n_term} terminated episodes; counts.terminated_episodes "
                f"= {self.counts.get('terminated_episodes')}",
            )


def verify_store(
    url: str,
    *,
    source: str | None = None,
    storage_options: dict[str, Any] | None = None,
    source_storage_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> VerifyReport:
    """Check the store at ``url``; see the module docstring for what is checked.

    Parameters
    ----------
    url : str
        Store path or URL (``.../Pong/1.zarr``).
    source : str, optional
        The run directory it was converted from; every transition is compared.
    storage_options, source_storage_options : dict, optional
        fsspec options for the store and the source (default: the store's).
    progress : bool
        Show a tqdm bar over rows.

    Returns
    -------
    VerifyReport
        ``report.ok`` is True when nothing is wrong; ``report.format()`` explains.

    Examples
    --------
    >>> # store_url: the fixture run Pong/1 of source_root, converted
    >>> report = verify_store(store_url, source=f"{source_root}/Pong/1")
    >>> report.ok, report.checked["compared"] == report.checked["transitions"]
    (True, True)
    """
    url = str(url).rstrip("/")
    report = VerifyReport(url)
    try:
        group = zarr.open_group(open_zarr_store(url, storage_options, read_only=True), mode="r")
        meta = read_metadata(group, url, require_complete=False)
    except AtariZarrError as exc:
        report.add("format", str(exc))
        return report
    except (FileNotFoundError, ValueError, KeyError) as exc:
        report.add("format", f"cannot open {url} as a Zarr group ({type(exc).__name__}: {exc})")
        return report
    if not meta.get("complete"):
        finish = f"{meta.get('command') or 'the command that created it'} again"
        report.add(
            "complete",
            f"the store is incomplete (no completion marker): finish it by running {finish}",
        )
        # an unfinished store is never called damaged: its writer has not finished yet
        report.remedy = f"The store is unfinished; finish it by running {finish}."
    n_rows = meta.get("counts", {}).get("transitions")
    if not isinstance(n_rows, int):
        n_rows = get_array(group, ACTION, url).shape[0]
        if meta.get("complete"):
            report.add("counts", "attribute counts.transitions is missing")
    report.checked["transitions"] = n_rows
    if not _check_layout(group, url, n_rows, report):
        return report
    _check_presence(url, storage_options, n_rows, report)

    planned: tuple[RunSource, RunPlan] | None = None
    if source is not None:
        opts = storage_options if source_storage_options is None else source_storage_options
        planned = _plan_source(meta, source, opts, n_rows, report)
    report.rows_to_check = n_rows + (planned[1].n_rows if planned else 0)
    name = "/".join(url.rsplit("/", 2)[-2:])
    bar = progress_bar(report.rows_to_check, f"verify {name}", unit="row", enabled=progress)
    try:
        chunks = _check_steps(group, url, meta, n_rows, report)
        chunks += _check_frames(group, url, n_rows, report, bar)
        report.checked["chunks"] = chunks
        if source is not None:  # nothing is compared when the plan does not fit
            report.checked["compared"] = (
                _compare_with_source(group, url, meta, planned, source, report, bar)
                if planned is not None
                else 0
            )
    finally:
        bar.close()
    return report


def _check_steps(
    group: zarr.Group, url: str, meta: dict[str, Any], n_rows: int, report: VerifyReport
) -> int:
    names = [n for n in ARRAYS if n != OBSERVATION]
    arrays = {n: get_array(group, n, url) for n in names}
    rows = ARRAYS[ACTION].write_rows
    assert all(ARRAYS[n].write_rows == rows for n in names)
    cons = _Consistency(meta, report)
    count = 0
    for unit, a, b in _units(n_rows, rows):
        read = {n: _read_unit(arrays[n], n, unit, a, b, report) for n in names}
        count += len(names)
        cols = {n: c for n, c in read.items() if c is not None}
        if len(cols) < len(names):
            cons.broken = True
            continue
        if not cons.broken:
            cons.feed(a, cols)
    if n_rows and not cons.broken:
        cons.finish()
    return count


def _check_frames(group: zarr.Group, url: str, n_rows: int, report: VerifyReport, bar: Any) -> int:
    spec = ARRAYS[OBSERVATION]
    arr = get_array(group, OBSERVATION, url)
    count = 0
    for unit, a, b in _units(n_rows, spec.write_rows):
        _read_unit(arr, OBSERVATION, unit, a, b, report)
        count += math.ceil((b - a) / spec.chunk_rows)
        bar.update(b - a)
    return count


def _read(arr: zarr.Array, a: int, b: int) -> np.ndarray | None:
    try:
        return np.asarray(arr[a:b])
    except (ValueError, RuntimeError, OSError):
        return None  # already reported by the checksum pass


def _plan_source(
    meta: dict[str, Any],
    source: str,
    options: dict[str, Any] | None,
    n_rows: int,
    report: VerifyReport,
) -> tuple[RunSource, RunPlan] | None:
    """Plan ``source`` as the store was planned; None (reported) when that fails or differs."""
    recorded = meta.get("source", {}).get("checkpoints_selected")
    try:
        src = RunSource(source, meta.get("game", ""), meta.get("run", ""), options)
        absent = sorted(set(recorded or []) - set(src.suffixes))
        if absent:
            report.add(
                "source",
                f"{source} lacks checkpoints {absent} that the store was converted from "
                f"(checkpoints_selected); pass the run directory it came from",
            )
            return None
        # The selection the store records, as convert took it; stores that record none
        # took every checkpoint they name.
        stored = meta.get("selection")
        selection = (
            Selection.from_attributes(stored) if isinstance(stored, dict) else Selection(recorded)
        )
        plan = build_plan(src, selection)
    except AtariZarrError as exc:
        report.add("source", f"cannot plan {source}: {exc}")
        return None
    if plan.n_rows != n_rows:
        report.add(
            "source",
            f"{source} gives {plan.n_rows} transitions with the store's selection "
            f"{selection.attributes()}, the store holds {n_rows}: not the same conversion "
            f"(other source, or other checkpoints)",
        )
        return None
    return src, plan


def _compare_with_source(
    group: zarr.Group,
    url: str,
    meta: dict[str, Any],
    planned: tuple[RunSource, RunPlan],
    source: str,
    report: VerifyReport,
    bar: Any,
) -> int:
    """Compare every transition of the store with the planned ``source``; return how many."""
    src, plan = planned
    planned_attrs = json.loads(json.dumps(plan.attributes()))
    stored = meta.get("conversion", {})
    for key in sorted(set(planned_attrs) | set(stored)):
        if planned_attrs.get(key) != stored.get(key):
            report.add("source", f"attribute conversion.{key} differs from the plan of {source}")
    arrays = {name: get_array(group, name, url) for name in ARRAYS}
    compared = 0
    for lap in plan.laps:
        if not lap.n_out:
            continue
        lo, hi = lap.out_start, lap.out_start + lap.n_out
        steps = lap_step_arrays(lap, src.read_small(lap.suffix))
        for name, values in steps.items():
            got = _read(arrays[name], lo, hi)
            if got is None:
                continue
            bad = np.flatnonzero(got != values)
            if bad.size:
                i = int(bad[0])
                report.add(
                    "data",
                    f"{name}: {bad.size} of rows {lo}..{hi - 1} (checkpoint {lap.suffix}) differ "
                    f"from the source; first at row {lo + i}: {got[i]!r} stored, "
                    f"{values[i]!r} in the source",
                )
        del steps
        dest = lap_destinations(lap)
        for start, block in src.iter_observations(lap.suffix, lap.capacity):
            d = dest[start : start + len(block)]
            sel = np.flatnonzero(d >= 0)
            if not sel.size:
                continue
            out = d[sel]
            # output rows are consecutive except where the buffer wraps
            for run in np.split(np.arange(len(out)), np.flatnonzero(np.diff(out) != 1) + 1):
                a, b = int(out[run[0]]), int(out[run[-1]]) + 1
                got = _read(arrays[OBSERVATION], a, b)
                if got is None:
                    continue
                diff = np.flatnonzero((got != block[sel[run]]).reshape(len(run), -1).any(axis=1))
                if diff.size:
                    report.add(
                        "data",
                        f"{OBSERVATION}: frames at rows {(a + diff[:8]).tolist()}"
                        f"{' ...' if diff.size > 8 else ''} differ from buffer rows of checkpoint "
                        f"{lap.suffix} in {source}",
                    )
            compared += len(sel)
            bar.update(len(sel))
    return compared
