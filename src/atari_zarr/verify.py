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
* with ``source``: the run is planned again from its files and every transition
  (frame, action, reward, flags, episode, source row) is compared, streaming the
  observation files as the converter does.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

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
    read_metadata,
)
from atari_zarr.storage.remote import get_fs, open_zarr_store

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
    """

    url: str
    problems: list[str] = field(default_factory=list)
    omitted: dict[str, int] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)
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


def _check_layout(group: zarr.Group, n_rows: int, report: VerifyReport) -> bool:
    ok = True
    for name, spec in ARRAYS.items():
        arr = group[name]
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
        return arr[a:b]
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
            f"{name}: {where} (rows {a}..{b - 1}) cannot be decoded: {exc}. The store is "
            f"damaged; convert it again with --overwrite.",
        )
        return None


class _Consistency:
    """Streaming checks of the per-step arrays against each other and the attributes."""

    def __init__(self, meta: dict[str, Any], report: VerifyReport) -> None:
        self.report = report
        eps = meta.get("episodes", {})
        self.lengths = list(eps.get("length", []))
        self.returns = list(eps.get("return", []))
        self.terminated = list(eps.get("terminated", []))
        self.counts = meta.get("counts", {})
        self.episode = 0  # id expected at the next row
        self.cur_len = 0
        self.cur_ret = 0.0
        self.n_term = 0
        self.last_source_row: int | None = None
        self.last_ended = True
        self.broken = False
        self.episode_count = 0

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
        rew = cols[REWARD].astype(np.float64)
        start = 0
        for end in np.flatnonzero(ends):
            self.cur_len += int(end - start + 1)
            self.cur_ret += float(rew[start : end + 1].sum())
            self._end(a + int(end), bool(term[end]))
            start = int(end) + 1
        self.cur_len += len(src) - start
        self.cur_ret += float(rew[start:].sum())
        if not self.broken:
            self.episode = int(expected[-1] + ends[-1])
        self.last_source_row = int(src[-1])
        self.last_ended = bool(ends[-1])

    def _end(self, row: int, terminated: bool) -> None:
        k = self.episode_count
        self.episode_count += 1
        self.n_term += terminated
        if k < len(self.lengths):
            same_return = math.isclose(self.returns[k], self.cur_ret, rel_tol=1e-6, abs_tol=1e-3)
            if (
                self.lengths[k] != self.cur_len
                or self.terminated[k] != terminated
                or not same_return
            ):
                self.report.add(
                    "episodes",
                    f"episode {k} (ending at row {row}): length {self.cur_len}, return "
                    f"{self.cur_ret:g}, terminated {terminated} in the arrays; the attributes say "
                    f"{self.lengths[k]}, {self.returns[k]:g}, {self.terminated[k]}",
                )
        self.cur_len = 0
        self.cur_ret = 0.0

    def finish(self) -> None:
        n = self.episode_count
        if not self.last_ended:
            self.report.add("flags", "the last row neither terminates nor truncates its episode")
        if n != len(self.lengths) or n != self.counts.get("episodes"):
            self.report.add(
                "counts",
                f"the arrays hold {n} episodes; attributes: counts.episodes = "
                f"{self.counts.get('episodes')}, episodes.length has {len(self.lengths)}",
            )
        if self.n_term != self.counts.get("terminated_episodes"):
            self.report.add(
                "counts",
                f"the arrays hold {self.n_term} terminated episodes; counts.terminated_episodes "
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
    >>> import tempfile
    >>> from atari_zarr import convert
    >>> from atari_zarr.testing import write_fixture_run
    >>> root, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = write_fixture_run(root, "Pong", "1", capacity=64, steps=300)
    >>> [store] = convert(root, dest, progress=False)
    >>> report = verify_store(store.url, source=f"{root}/Pong/1")
    >>> report.ok, report.checked["compared"] == store.transitions
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
        report.add(
            "complete",
            f"the store is incomplete (no completion marker): finish it by running "
            f"{meta.get('command') or 'the command that created it'} again",
        )
    n_rows = meta.get("counts", {}).get("transitions")
    if not isinstance(n_rows, int):
        n_rows = group[ACTION].shape[0]
        if meta.get("complete"):
            report.add("counts", "attribute counts.transitions is missing")
    report.checked["transitions"] = n_rows
    if not _check_layout(group, n_rows, report):
        return report
    _check_presence(url, storage_options, n_rows, report)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        total = n_rows * (2 if source else 1)
        name = "/".join(url.rstrip("/").rsplit("/", 2)[-2:])
        bar = tqdm(total=total, desc=f"verify {name}", unit="row")
    try:
        chunks = _check_steps(group, meta, n_rows, report)
        chunks += _check_frames(group, n_rows, report, bar)
        report.checked["chunks"] = chunks
        if source is not None:
            opts = storage_options if source_storage_options is None else source_storage_options
            report.checked["compared"] = _compare_with_source(
                group, meta, source, opts, report, bar
            )
    finally:
        if bar is not None:
            bar.close()
    return report


def _check_steps(group: zarr.Group, meta: dict[str, Any], n_rows: int, report: VerifyReport) -> int:
    names = [n for n in ARRAYS if n != OBSERVATION]
    arrays = {n: group[n] for n in names}
    rows = ARRAYS[ACTION].write_rows
    assert all(ARRAYS[n].write_rows == rows for n in names)
    cons = _Consistency(meta, report)
    count = 0
    for unit, a, b in _units(n_rows, rows):
        cols = {n: _read_unit(arrays[n], n, unit, a, b, report) for n in names}
        count += len(names)
        if any(c is None for c in cols.values()):
            cons.broken = True
            continue
        if not cons.broken:
            cons.feed(a, cols)  # type: ignore[arg-type]
    if n_rows and not cons.broken:
        cons.finish()
    return count


def _check_frames(group: zarr.Group, n_rows: int, report: VerifyReport, bar: Any) -> int:
    spec = ARRAYS[OBSERVATION]
    arr = group[OBSERVATION]
    count = 0
    for unit, a, b in _units(n_rows, spec.write_rows):
        _read_unit(arr, OBSERVATION, unit, a, b, report)
        count += math.ceil((b - a) / spec.chunk_rows)
        if bar is not None:
            bar.update(b - a)
    return count


def _read(arr: zarr.Array, a: int, b: int) -> np.ndarray | None:
    try:
        return arr[a:b]
    except (ValueError, RuntimeError, OSError):
        return None  # already reported by the checksum pass


def _compare_with_source(
    group: zarr.Group,
    meta: dict[str, Any],
    source: str,
    options: dict[str, Any] | None,
    report: VerifyReport,
    bar: Any,
) -> int:
    """Plan the run again from ``source`` and compare every transition; return how many."""
    import json

    from atari_zarr.conversion.converter import _STEP_ARRAYS  # lap_step_arrays key -> array
    from atari_zarr.sources.dqn_replay.files import RunSource
    from atari_zarr.sources.dqn_replay.planner import lap_destinations, lap_step_arrays, plan_run

    try:
        src = RunSource(source, meta.get("game", ""), meta.get("run", ""), options)
        selected = list(meta.get("source", {}).get("checkpoints_selected") or src.suffixes)
        absent = sorted(set(selected) - set(src.suffixes))
        if absent:
            report.add(
                "source",
                f"{source} lacks checkpoints {absent} that the store was converted from "
                f"(checkpoints_selected); pass the run directory it came from",
            )
            return 0
        plan = plan_run(src, None if set(selected) == set(src.suffixes) else selected)
    except AtariZarrError as exc:
        report.add("source", f"cannot plan {source}: {exc}")
        return 0
    n_rows = group[ACTION].shape[0]
    if plan.n_rows != n_rows:
        report.add(
            "source",
            f"{source} gives {plan.n_rows} transitions, the store holds {n_rows}: not the same "
            f"conversion (other source, or other checkpoints)",
        )
        return 0
    planned = json.loads(json.dumps(plan.attributes()))
    stored = meta.get("conversion", {})
    for key in sorted(set(planned) | set(stored)):
        if planned.get(key) != stored.get(key):
            report.add("source", f"attribute conversion.{key} differs from the plan of {source}")
    arrays = {name: group[name] for name in ARRAYS}
    compared = 0
    for lap in plan.laps:
        if not lap.n_out:
            continue
        lo, hi = lap.out_start, lap.out_start + lap.n_out
        steps = lap_step_arrays(lap, src.read_small(lap.suffix))
        for key, name in _STEP_ARRAYS.items():
            got = _read(arrays[name], lo, hi)
            if got is None:
                continue
            bad = np.flatnonzero(got != steps[key])
            if bad.size:
                i = int(bad[0])
                report.add(
                    "data",
                    f"{name}: {bad.size} of rows {lo}..{hi - 1} (checkpoint {lap.suffix}) differ "
                    f"from the source; first at row {lo + i}: {got[i]!r} stored, "
                    f"{steps[key][i]!r} in the source",
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
            if bar is not None:
                bar.update(len(sel))
    return compared
