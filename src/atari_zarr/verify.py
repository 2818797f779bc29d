"""Check a store: completeness, counts, checksums, and optionally the source.

:func:`verify_store` (``atari-zarr verify STORE [--source SOURCE]``) reads the
whole store once, in write units (a 4096-frame shard, a 65,536-row chunk), so
memory stays bounded whatever the store's size, and reports every problem it
finds instead of stopping at the first:

* **completion**: the completion marker and the format version;
* **layout**: every array of :data:`atari_zarr.layout.ARRAYS`, and the optional
  arrays every store of its kind has (RL Unplugged: ``final_observation``, one row
  per episode, and ``next/unclipped_reward``), with the shape, dtype, chunks and
  shards of the layout and the length in ``counts``;
* **presence**: every chunk or shard object exists (converters write all-zero
  chunks too, so a missing object means a deleted one, which zarr would
  silently read as zeros);
* **checksums**: every chunk is decoded, so its crc32c (and the crc32c of every
  shard index) is checked: any flipped byte is caught and located to a chunk;
* **one writer**: the crc32c of every object is compared with the one its writer
  recorded (:mod:`atari_zarr.fingerprints`), so an object copied in from another
  store or conversion is named, although every byte of it is valid, and the
  store's ``objects_digest`` (what its content id covers of them) is theirs; in a local
  store, a symbolic link anywhere inside (an object or a directory such as ``c/``)
  is a problem too;
* **consistency**: episode ids, ``terminated``/``truncated`` flags, increasing
  source rows, and the per-episode lengths, returns and counts in the attributes;
* with ``source``: the run is found and planned again through the source registry
  (:mod:`atari_zarr.sources.registry`: the kind's ``find_runs``, then ``plan_run``,
  the converter's own planning, with the scans made here) with the selection the store
  records, and every row of every part is compared with the rows the kind's
  ``rows`` gives, as the converter's write tasks ask for them: frames, final
  frames, and every per-step array. Kinds that scan (RL Unplugged) have each
  selected shard read twice, as in the conversion: the scan (records, no frame
  decoded; spooled to a temporary directory at 17 bytes per step), then the frames.

What a store's attributes say about its source without failing it (RL Unplugged
returns that differ from the sum of their step rewards, ``conversion.returns_check``)
is reported as warnings: the store copies the source faithfully.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import zarr

from atari_zarr.episodes import FIRST_STEP, EpisodeLedger, episode_table
from atari_zarr.errors import AtariZarrError, StoreFormatError
from atari_zarr.layout import (
    ACTION,
    ARRAYS,
    EPISODE,
    FINAL_OBSERVATION,
    OBJECTS_DIGEST,
    OBSERVATION,
    OPTIONAL_ARRAYS,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    ArraySpec,
    get_array,
    is_complete,
)
from atari_zarr.layout import spec as layout_spec
from atari_zarr.npy_format import HEADER_PARSE
from atari_zarr.opening import open_store
from atari_zarr.progress import progress_bar
from atari_zarr.resources import cpu_count
from atari_zarr.shard_format import index_problem, object_key
from atari_zarr.sources.registry import (
    DQN_REPLAY,
    KINDS,
    Part,
    Plan,
    Selection,
    SourceKind,
    SourceRun,
    kind_of,
    part_rows,
    plan_run,
)
from atari_zarr.storage.deadline import Timeout, resolve_timeout
from atari_zarr.storage.engine import ChunkEngine, decode_chunk
from atari_zarr.storage.filesystem import FileSystem, get_fs, not_regular_error
from atari_zarr.storage.paths import is_process_local
from atari_zarr.storage.ranges import ByteRange

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
    warnings : list of str
        Findings that do not fail the store: properties of the source it copies
        faithfully, such as RL Unplugged returns that differ from the sum of their
        step rewards.
    """

    url: str
    problems: list[str] = field(default_factory=list)
    omitted: dict[str, int] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)
    rows_to_check: int = 0
    warnings: list[str] = field(default_factory=list)
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
        """The report as text: one summary line, then one line per problem.

        Examples
        --------
        >>> report = VerifyReport("s.zarr")
        >>> report.add("layout", "action is missing")
        >>> report.format().splitlines()[0]
        's.zarr: 1 problem found'
        >>> report.checked["transitions"] = 1200; report.add("layout", "reward is missing")
        >>> report.format().splitlines()[0]
        's.zarr: 2 problems found (1,200 transitions)'
        """
        done = ", ".join(f"{v:,} {k}" for k, v in self.checked.items())
        checked = f" ({done})" if done else ""  # nothing checked: no empty parentheses
        warned = [f"  warning: {w}" for w in self.warnings]
        if self.ok:
            return "\n".join([f"{self.url}: OK{checked}", *warned])
        total = len(self.problems) + sum(self.omitted.values())
        problems = "problem" if total == 1 else "problems"
        lines = [f"{self.url}: {total:,} {problems} found{checked}"]
        lines += [f"  - {p}" for p in self.problems]
        lines += [f"  - ... and {n} more of kind {k!r}" for k, n in self.omitted.items()]
        return "\n".join([*lines, *warned])


def _units(n_rows: int, rows: int) -> Iterator[tuple[int, int, int]]:
    for unit in range(math.ceil(n_rows / rows)):
        yield unit, unit * rows, min((unit + 1) * rows, n_rows)


def _check_layout(
    group: zarr.Group, url: str, specs: dict[str, tuple[ArraySpec, int]], report: VerifyReport
) -> bool:
    """Shapes, dtypes, chunks and shards of ``specs``: arrays with their expected rows."""
    ok = True
    for name, (spec, rows) in specs.items():
        if name not in group:
            report.add("layout", f"{name} is missing; stores of this kind have it")
            ok = False
            continue
        try:
            arr = get_array(group, name, url)
        except StoreFormatError as exc:  # sizes no store of this layout declares
            report.add("layout", str(exc))
            ok = False
            continue
        expected: dict[str, Any] = {
            "shape": (rows, *spec.row_shape),
            "dtype": spec.dtype,
            "chunks": (
                spec.chunk_rows if spec.shard_rows else spec.unit_rows(rows),
                *spec.row_shape,
            ),
            "shards": (spec.unit_rows(rows), *spec.row_shape) if spec.shard_rows else None,
        }
        for what, want in expected.items():
            got = getattr(arr, what)
            if got != want:
                report.add(
                    "layout",
                    f"{name}: {what} is {got}, expected {want} (layout and "
                    f"{'counts.episodes' if name == FINAL_OBSERVATION else 'counts.transitions'})",
                )
                ok = False
    return ok


def _check_presence(
    fs: FileSystem, root: str, specs: dict[str, tuple[ArraySpec, int]], report: VerifyReport
) -> None:
    for name, (spec, rows) in specs.items():
        dims = len(spec.row_shape)
        units = list(_units(rows, spec.unit_rows(rows)))
        if fs.read_only:
            # http(s) cannot list: ask for each object (a HEAD request each)
            found = {
                object_key(name, u, dims)
                for u, _, _ in units
                if fs.exists(f"{root}/{object_key(name, u, dims)}")
            }
        else:
            try:
                found = {p[len(root) + 1 :] for p in fs.find(f"{root}/{name}/c")}
            except FileNotFoundError:
                found = set()
        for u, a, b in units:
            if object_key(name, u, dims) not in found:
                report.add(
                    "missing",
                    f"{name}: {'shard' if spec.shard_rows else 'chunk'} {u} (rows {a}..{b - 1}) "
                    f"is missing from the store ({object_key(name, u, dims)}); readers refuse "
                    f"its rows as damage",
                )


def _check_metadata(
    group: zarr.Group,
    url: str,
    fs: FileSystem,
    root: str,
    specs: dict[str, tuple[ArraySpec, int]],
    report: VerifyReport,
) -> None:
    """Each array's own ``zarr.json`` says what the root's consolidated metadata says:
    readers that open an array by itself (tensorstore, zarr without consolidation) read
    that file, which the rest of verify never needs."""
    from zarr.core.metadata.v3 import ArrayV3Metadata

    for name in specs:
        key = f"{name}/zarr.json"
        try:
            raw = fs.cat_metadata(f"{root}/{key}")
            own = ArrayV3Metadata.from_dict(json.loads(raw)).to_dict()
        except FileNotFoundError:
            report.add("metadata", f"{key} is missing: readers that open {name} by itself fail")
            continue
        except AtariZarrError as exc:
            report.add("metadata", str(exc))
            continue
        except Exception as exc:  # whatever zarr or json make of garbage
            report.add(
                "metadata",
                f"{key} is not array metadata zarr can read ({type(exc).__name__}: "
                f"{str(exc)[:120]}); expected the array's Zarr v3 zarr.json, as the root's "
                f"consolidated metadata has it. {report.remedy}",
            )
            continue
        try:
            expected = get_array(group, name, url).metadata.to_dict()
        except AtariZarrError:
            continue  # the layout check reported it
        own.pop("attributes", None)
        expected.pop("attributes", None)
        if own != expected:
            differ = sorted(k for k in {*own, *expected} if own.get(k) != expected.get(k))
            report.add(
                "metadata",
                f"{key} differs from the root's consolidated metadata in {differ}: readers "
                f"that open {name} by itself read other data. {report.remedy}",
            )


def _check_writers(
    group: zarr.Group,
    url: str,
    meta: dict[str, Any],
    specs: dict[str, tuple[ArraySpec, int]],
    report: VerifyReport,
) -> None:
    """Every object is the one its writer recorded, and the store's ``objects_digest``
    (its content id) is theirs; no link inside a local store."""
    from atari_zarr.fingerprints import foreign_object_message, mismatches, recorded_digest

    if "://" not in url or url.startswith("file://"):
        root = Path(url.removeprefix("file://"))
        for top, dirs, files in os.walk(root):  # never follows a link
            for entry in [*dirs, *files]:
                path = Path(top) / entry
                if path.is_symlink():
                    report.add("link", str(not_regular_error(path, "a symbolic link")))
    for name in specs:
        try:
            array = get_array(group, name, url)
        except AtariZarrError:
            continue  # the layout check reported it
        for _, key, want, found in mismatches(array):
            report.add("foreign", foreign_object_message(url, name, key, want, found))
    saved = meta.get(OBJECTS_DIGEST)
    if saved is not None:  # stores completed before it have none
        theirs = recorded_digest(group)
        if saved != theirs:
            report.add(
                "digest",
                f"attribute {OBJECTS_DIGEST} {str(saved)[:80]!r} is not the digest of the "
                f"crc32c its arrays record ({theirs}): the content id of this store does not "
                f"say what it holds. {report.remedy}",
            )


def _reader(arr: zarr.Array, url: str, report: VerifyReport) -> ChunkEngine:
    """The engine that reads ``arr`` for the checks (no caches, nothing ahead)."""
    return ChunkEngine(arr, where=url, remedy=report.remedy, kept_bytes=0)


def _inspect(engine: ChunkEngine, lo: int, hi: int) -> tuple[np.ndarray | None, list[Any]]:
    """Rows ``[lo, hi)`` decoded through the engine, with every check, and what is wrong:
    ``(chunk, what)`` per problem, the chunk None for a shard index (whose chunks then
    cannot be located: no rows). An absent object gives the fill value; the recorded
    fingerprints are a check of their own (``_check_writers``)."""
    g = engine.grid
    assert g is not None
    cr, cps = g.chunk_rows, g.chunks_per_shard
    cids = list(range(lo // cr, (hi - 1) // cr + 1))
    problems: list[tuple[int | None, str]] = []
    sizes: list[int | None] = [None] * len(cids)  # each chunk's length in its shard's index
    if g.sharded:
        shards = sorted({c // cps for c in cids})
        raws = engine.get([engine.index_range(s) for s in shards], merge=False)
        indexes: dict[int, np.ndarray | None] = {}
        for shard, raw in zip(shards, raws, strict=True):
            what = None if raw is None else index_problem(raw, g.index_size)
            if what is not None:
                problems.append((None, what))
            indexes[shard] = (
                None if raw is None else np.frombuffer(bytes(raw[:-4]), "<u8").reshape(-1, 2)
            )
        if problems:
            return None, problems
        located = [engine.chunk_in(c, indexes[c // cps]) for c in cids]
        sizes = [n for _, _, n in located]
        wanted = [
            (i, ByteRange(k, o, o + n))
            for i, (k, o, n) in enumerate(located)
            if o is not None and n is not None
        ]
        data: list[Any] = [None] * len(cids)
        for (i, _), d in zip(wanted, engine.get([r for _, r in wanted], merge=False), strict=True):
            data[i] = d
    else:
        data = engine.get([ByteRange.whole(g.object_key(c)) for c in cids], merge=False)
    out = np.empty((len(cids) * cr, *g.row_shape), dtype=g.dtype)
    for i, (c, d, size) in enumerate(zip(cids, data, sizes, strict=True)):
        dest = out[i * cr : (i + 1) * cr]
        if d is None:
            dest[...] = g.fill_value
        elif size is not None and len(d) != size:  # an entry past the end of its object
            problems.append((c, "is cut short"))
        elif what := decode_chunk(d, dest, checksum=g.checksum, chunk_nbytes=g.chunk_nbytes):
            problems.append((c, what))
    return out[lo - cids[0] * cr : hi - cids[0] * cr], problems


def _read_unit(
    engine: ChunkEngine, name: str, unit: int, a: int, b: int, report: VerifyReport
) -> np.ndarray | None:
    """Decode one write unit through the engine; every bad chunk (or shard index) located."""
    spec = layout_spec(name)
    if engine.grid is None:  # a layout the engine does not read: zarr-python, whole unit
        try:
            return np.asarray(engine.array[a:b])
        except (ValueError, RuntimeError, OSError) as exc:
            problems: list[tuple[int | None, str]] = [(None, str(exc))]
            rows = None
    else:
        try:
            rows, problems = _inspect(engine, a, b)
        except StoreFormatError as exc:  # an object that is not a regular file (a link)
            report.add("unreadable", f"{name}: rows {a}..{b - 1} cannot be read: {exc}")
            return None
    if not problems:
        return rows
    cr = spec.chunk_rows
    bad = [c * cr for c, _ in problems if c is not None]
    where = (
        f"chunks at rows {bad[:8]}{' ...' if len(bad) > 8 else ''} of shard {unit}"
        if bad and spec.shard_rows
        else f"{'the index of shard' if spec.shard_rows else 'chunk'} {unit}"
    )
    report.add(
        "checksum",
        f"{name}: {where} (rows {a}..{b - 1}) cannot be decoded: it {problems[0][1]}. "
        f"{report.remedy}",
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
        episodes = meta.get("episodes")
        if (
            table is not None
            and isinstance(episodes, dict)
            and FIRST_STEP in episodes
            and not np.array_equal(np.asarray(episodes[FIRST_STEP]), np.asarray(table.first_step))
        ):
            report.add(
                "episodes",
                f"attribute episodes.{FIRST_STEP} is not one integer of -1 or more per episode "
                f"(the true step of each episode's first row); convert the store again",
            )
        # the episode after a terminal row the source continues at is whole (DQN Replay:
        # the 3 padding rows dopamine writes after a terminal lie between them)
        self.check_starts = str(meta.get("kind", DQN_REPLAY)) == DQN_REPLAY
        self.last_terminated = False
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
        if self.check_starts and self.table is not None and self.table.first_step is not None:
            self._check_starts(first, src, term, ends)
        closed = ledger.feed(cols[REWARD], term, trunc)
        for k, end in enumerate(closed.tolist(), start=first):
            self._compare(k, a + end)
        if not self.broken:
            self.episode = int(expected[-1] + ends[-1])
        self.last_source_row = int(src[-1])
        self.last_ended = bool(ends[-1])

    def _check_starts(
        self, first: int, src: np.ndarray, term: np.ndarray, ends: np.ndarray
    ) -> None:
        """An episode right after a terminal row, the source continuing, has first_step 0."""
        table = self.table
        assert table is not None and table.first_step is not None
        begins = np.r_[self.recomputed.current_length == 0 and self.last_ended, ends[:-1]]
        # the running episode is number `first`; the next one to begin, `first + 1`
        k = first if begins[0] else first + 1
        for i in np.flatnonzero(begins).tolist():
            prev_src = self.last_source_row if i == 0 else int(src[i - 1])
            prev_term = self.last_terminated if i == 0 else bool(term[i - 1])
            if (
                k < len(table)
                and prev_src is not None
                and prev_term
                and int(src[i]) - prev_src == 4
                and int(table.first_step[k]) != 0
            ):
                self.report.add(
                    "episodes",
                    f"episode {k} begins right after a terminal row of its source (source row "
                    f"{int(src[i])}), so it is whole, but episodes.{FIRST_STEP} says "
                    f"{int(table.first_step[k])}; convert the store again",
                )
            k += 1
        self.last_terminated = bool(term[-1])

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
    timeout: Timeout = "default",
    workers: int | None = None,
) -> VerifyReport:
    """Check the store at ``url``; see the module docstring for what is checked.

    Parameters
    ----------
    url : str
        Store path or URL (``.../Pong/1.zarr``).
    source : str, optional
        Where it was converted from, as ``convert`` takes it: the dataset root, or
        the run directory (DQN Replay) or game directory (RL Unplugged); every row
        is compared.
    storage_options, source_storage_options : dict, optional
        fsspec options for the store and the source (default: the store's).
    progress : bool
        Show a tqdm bar over rows.
    timeout : float, None or "default"
        Seconds each call to the store's or the source's storage may take, retries
        included (default 60; None: no limit).
    workers : int, optional
        Processes that decode the frames (default: the cores this process may run
        on; 1: all in this process).

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
    seconds = resolve_timeout(timeout)
    report = VerifyReport(url)
    try:
        group, meta = open_store(url, storage_options, timeout=seconds, require_complete=False)
    except AtariZarrError as exc:
        report.add("format", str(exc))
        return report
    except (FileNotFoundError, ValueError, KeyError) as exc:
        report.add("format", f"cannot open {url} as a Zarr group ({type(exc).__name__}: {exc})")
        return report
    if not is_complete(meta):
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
        if is_complete(meta):
            report.add("counts", "attribute counts.transitions is missing")
    report.checked["transitions"] = n_rows
    # stores written before kinds were recorded are DQN Replay stores
    kind = kind_of(meta)
    specs = {name: (spec, n_rows) for name, spec in ARRAYS.items()}
    if kind is not None:
        specs.update(_kind_arrays(kind, group, url, meta, n_rows))
    if not _check_layout(group, url, specs, report):
        return report
    fs, path = get_fs(url, storage_options, timeout=seconds)  # one for both listings
    _check_presence(fs, path.rstrip("/"), specs, report)
    _check_metadata(group, url, fs, path.rstrip("/"), specs, report)
    _check_writers(group, url, meta, specs, report)
    if kind is not None:  # properties of the source, which the store copies faithfully
        report.warnings.extend(kind.warnings(meta))

    with contextlib.ExitStack() as stack:
        planned: _Planned | None = None
        if source is not None:
            opts = storage_options if source_storage_options is None else source_storage_options
            spool = stack.enter_context(tempfile.TemporaryDirectory(prefix="atari-zarr-verify-"))
            planned = _plan_source(kind, meta, source, opts, n_rows, report, Path(spool), seconds)
        report.rows_to_check = n_rows + (planned.plan.n_rows if planned else 0)
        name = "/".join(url.rsplit("/", 2)[-2:])
        bar = stack.enter_context(
            contextlib.closing(
                progress_bar(report.rows_to_check, f"verify {name}", unit="row", enabled=progress)
            )
        )
        chunks = _check_steps(group, url, meta, n_rows, report)
        # the rest, in write units: frames, and the kind's optional arrays
        units = {n: v for n, v in specs.items() if n == OBSERVATION or n not in ARRAYS}
        chunks += _check_units(
            group, url, units, report, bar, (storage_options, seconds), workers or cpu_count()
        )
        report.checked["chunks"] = chunks
        if source is not None:  # nothing is compared when the plan does not fit
            compared = _compare(group, url, meta, planned, source, report, bar) if planned else 0
            report.checked["compared"] = compared
    return report


def _check_steps(
    group: zarr.Group, url: str, meta: dict[str, Any], n_rows: int, report: VerifyReport
) -> int:
    names = [n for n in ARRAYS if n != OBSERVATION]
    arrays = {n: _reader(get_array(group, n, url), url, report) for n in names}
    rows = ARRAYS[ACTION].unit_rows(n_rows)
    assert all(ARRAYS[n].unit_rows(n_rows) == rows for n in names)
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


def _kind_arrays(
    kind: SourceKind, group: zarr.Group, url: str, meta: dict[str, Any], n_rows: int
) -> dict[str, tuple[ArraySpec, int]]:
    """The optional arrays every store of ``kind`` has, with their expected rows."""
    episodes = meta.get("counts", {}).get("episodes")
    out: dict[str, tuple[ArraySpec, int]] = {}
    for name in kind.optional_arrays:
        spec = OPTIONAL_ARRAYS[name]
        rows = n_rows
        if name == FINAL_OBSERVATION:  # one row per episode
            if isinstance(episodes, int):
                rows = episodes
            elif name in group:  # counts.episodes missing: the consistency pass says so
                rows = int(get_array(group, name, url).shape[0])
        out[name] = (spec, rows)
    return out


def _check_units(
    group: zarr.Group,
    url: str,
    specs: dict[str, tuple[ArraySpec, int]],
    report: VerifyReport,
    bar: Any,
    opened: tuple[dict[str, Any] | None, float | None],
    workers: int,
) -> int:
    """Decode every write unit of ``specs`` (their checksums); return the chunks read.

    The frames, most of a store's bytes, are decoded on ``workers`` processes when
    there is more than one, the frames span :data:`PARALLEL_UNITS` units or more and
    the store is not in this process's memory (``memory://``):
    each process reads whole shards of its own (:func:`_frame_units`), and their
    findings are reported in the order of the units, as one process reports them.
    """
    count = 0
    for name, (spec, rows) in specs.items():
        units = list(_units(rows, spec.unit_rows(rows)))
        count += sum(math.ceil((b - a) / spec.chunk_rows) for _, a, b in units)
        # a store in this process's memory is not another process's (memory://)
        parallel = workers > 1 and not is_process_local(url)
        if name == OBSERVATION and parallel and len(units) >= PARALLEL_UNITS:
            _frames_on_processes(url, opened, units, report, bar, workers)
            continue
        engine = _reader(get_array(group, name, url), url, report)
        for unit, a, b in units:
            _read_unit(engine, name, unit, a, b, report)
            if name == OBSERVATION:  # the rows whose frames are read
                bar.update(b - a)
    return count


#: Write units of frames per task of a process (about 0.9 GB of frames decoded).
UNITS_PER_TASK = 32
#: Units of frames from which they are decoded on several processes (1M frames: below,
#: starting the processes costs about what they save).
PARALLEL_UNITS = 256


def _frames_on_processes(
    url: str,
    opened: tuple[dict[str, Any] | None, float | None],
    units: list[tuple[int, int, int]],
    report: VerifyReport,
    bar: Any,
    workers: int,
) -> None:
    from atari_zarr.conversion.scheduling import worker_processes

    per_task = max(1, min(UNITS_PER_TASK, math.ceil(len(units) / workers)))
    tasks = [units[i : i + per_task] for i in range(0, len(units), per_task)]
    with worker_processes(min(workers, len(tasks))) as pool:
        futures = [pool.submit(_frame_units, url, *opened, report.remedy, t) for t in tasks]
        for task, future in zip(tasks, futures, strict=True):  # in the units' order
            for kind, message in future.result():
                report.add(kind, message)
            bar.update(sum(b - a for _, a, b in task))


def _frame_units(
    url: str,
    storage_options: dict[str, Any] | None,
    timeout: float | None,
    remedy: str,
    units: list[tuple[int, int, int]],
) -> list[tuple[str, str]]:
    """In a worker process: decode the frames of ``units``; the problems found, as
    ``(kind, message)``."""
    findings = _Findings(url, remedy=remedy)
    engine = _ENGINES.get(url)
    if engine is None:  # once per worker process, for all its tasks
        group, _ = open_store(url, storage_options, timeout=timeout, require_complete=False)
        engine = _ENGINES[url] = _reader(get_array(group, OBSERVATION, url), url, findings)
    engine.remedy = remedy
    for unit, a, b in units:
        _read_unit(engine, OBSERVATION, unit, a, b, findings)
    return findings.found


#: A worker process's engine of the frames of each store it verifies.
_ENGINES: dict[str, ChunkEngine] = {}


@dataclass
class _Findings(VerifyReport):
    """A worker's findings, every one kept in order, for the parent's report to add."""

    found: list[tuple[str, str]] = field(default_factory=list)

    def add(self, kind: str, message: str) -> None:
        self.found.append((kind, message))


# -- against the source, through the registry -----------------------------------------
def _load_scan(spool: Path, unit: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
    # each member's .npy header is parsed as it is read: one parse at a time
    with HEADER_PARSE, np.load(spool / f"{unit}.npz") as arrays:  # allow_pickle stays False
        return {name: arrays[name] for name in (names or arrays.files)}


@dataclass
class _SpooledScans:
    """Scans made here, one part at a time, and kept in ``spool`` for the comparison."""

    kind: SourceKind
    source_run: SourceRun
    spool: Path
    selection: Selection

    def done(self) -> set[int]:
        return {int(p.stem) for p in self.spool.glob("*.npz")}

    def load(self, unit: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
        return _load_scan(self.spool, unit, names)

    def run(self, units: list[int]) -> None:
        assert self.kind.scan is not None
        for unit in units:
            arrays = self.kind.scan(self.source_run, unit, self.selection, None)
            np.savez(self.spool / f"{unit}.npz", **cast("dict[str, Any]", arrays))
            del arrays


@dataclass
class _Planned:
    """A run planned again as the converter planned it; scans wait in ``spool``."""

    kind: SourceKind
    run: Any
    plan: Plan
    spool: Path

    def rows(self, part: Part) -> tuple[dict[str, np.ndarray], Any]:
        """The part's per-step arrays and frames, as the converter's write task asks."""
        scan = _load_scan(self.spool, part.unit) if self.kind.scans else None
        return part_rows(self.kind, self.run, part, scan)


def _plan_source(
    kind: SourceKind | None,
    meta: dict[str, Any],
    source: str,
    options: dict[str, Any] | None,
    n_rows: int,
    report: VerifyReport,
    spool: Path,
    timeout: float | None,
) -> _Planned | None:
    """Find, scan and plan ``source`` as the converter did; None (reported) when that fails
    or gives other rows. Scans (no frame decoded) wait in ``spool`` for the comparison."""
    if kind is None:
        report.add(
            "source",
            f"cannot plan {source}: the store's kind {meta.get('kind')!r} is not a source "
            f"kind ({', '.join(KINDS)}); verify it without --source",
        )
        return None
    noun = kind.part_name
    recorded = (meta.get("source") or {}).get(f"{noun}s_selected") or []
    stored = meta.get("selection")
    # the selection the store records, as convert took it; stores that record none took
    # every part they name
    selection = (
        Selection.from_attributes(stored)
        if isinstance(stored, dict)
        else Selection(recorded or None)
    )
    try:
        game, run_name = str(meta.get("game", "")), str(meta.get("run", ""))
        [run] = kind.find_runs(source, [game], [run_name], options, timeout=timeout)
        absent = sorted(set(recorded) - set(run.suffixes))
        if absent:
            report.add(
                "source",
                f"{source} lacks {noun}s {absent} that the store was converted from "
                f"(source.{noun}s_selected); pass the directory of the run it came from",
            )
            return None
        plan = plan_run(kind, run, selection, _SpooledScans(kind, run, spool, selection))
    except AtariZarrError as exc:
        report.add("source", f"cannot plan {source}: {exc}")
        return None
    if plan.n_rows != n_rows:
        report.add(
            "source",
            f"{source} gives {plan.n_rows} transitions with the store's selection "
            f"{selection.attributes()}, the store holds {n_rows}: not the same conversion "
            f"(other source, or other {noun}s)",
        )
        return None
    return _Planned(kind, run, plan, spool)


def _read(arr: zarr.Array, a: int, b: int) -> np.ndarray | None:
    try:
        return np.asarray(arr[a:b])
    except (ValueError, RuntimeError, OSError):
        return None  # already reported by the checksum pass


def _compare_rows(
    arr: zarr.Array,
    name: str,
    rows: np.ndarray,
    values: np.ndarray,
    where: str,
    report: VerifyReport,
) -> None:
    """Compare frames ``values`` with rows ``rows`` of ``arr`` (runs of consecutive rows)."""
    for run in np.split(np.arange(len(rows)), np.flatnonzero(np.diff(rows) != 1) + 1):
        if not run.size:
            continue
        a, b = int(rows[run[0]]), int(rows[run[-1]]) + 1
        got = _read(arr, a, b)
        if got is None:
            continue
        diff = np.flatnonzero((got != values[run]).reshape(len(run), -1).any(axis=1))
        if diff.size:
            what = "frames at rows" if name == OBSERVATION else "final frames of episodes"
            report.add(
                "data",
                f"{name}: {what} {(a + diff[:8]).tolist()}{' ...' if diff.size > 8 else ''} "
                f"differ from {where}",
            )


def _compare(
    group: zarr.Group,
    url: str,
    meta: dict[str, Any],
    planned: _Planned,
    source: str,
    report: VerifyReport,
    bar: Any,
) -> int:
    """Compare every row of the store with the rows the converter takes from ``source``;
    return the transitions compared."""
    plan = planned.plan
    for attr, want, stored in (
        ("conversion", plan.conversion, meta.get("conversion", {})),
        ("episodes", plan.episode_columns, meta.get("episodes", {})),
    ):
        want = json.loads(json.dumps(want))
        for key in sorted(set(want) | set(stored)):
            if attr == "episodes" and key == FIRST_STEP and key not in stored:
                continue  # a store written before the column: its inferred one is not stored
            if want.get(key) != stored.get(key):
                report.add("source", f"attribute {attr}.{key} differs from the plan of {source}")
    names = [n for n in (*ARRAYS, *planned.kind.optional_arrays) if n in group]
    arrays = {name: get_array(group, name, url) for name in names}
    compared = 0
    for part in plan.parts:
        if not part.rows:  # the converter has no task for it
            continue
        where = f"{planned.kind.part_name} {part.unit} of {source}"
        try:
            steps, stream = planned.rows(part)
            for name, values in steps.items():
                lo, hi = part.span(name)
                got = _read(arrays[name], lo, hi) if name in arrays else None
                if got is None:
                    continue  # already reported: a missing array or a bad chunk
                bad = np.flatnonzero(got != values)
                if bad.size:
                    i = int(bad[0])
                    report.add(
                        "data",
                        f"{name}: {bad.size} of rows {lo}..{hi - 1} differ from {where}; first "
                        f"at row {lo + i}: {got[i]!r} stored, {values[i]!r} in the source",
                    )
            del steps
            for name, rows, values in stream:
                if name in arrays:
                    _compare_rows(arrays[name], name, rows, values, where, report)
                if name == OBSERVATION:
                    compared += len(rows)
                    bar.update(len(rows))
        except AtariZarrError as exc:
            report.add("source", f"cannot read {where}: {exc}")
    return compared
