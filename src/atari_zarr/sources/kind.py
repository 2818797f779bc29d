"""What a source kind is: the hooks conversion calls, a run, a part, a plan.

:class:`SourceKind` is the contract between a kind of source (``sources/<kind>/``,
each with its ``kind.py`` adapter) and the machinery that converts and verifies
(:mod:`atari_zarr.conversion`, :mod:`atari_zarr.verify`); :mod:`atari_zarr.sources.registry`
lists the kinds. A run (:class:`SourceRun`) is what a kind finds under a root; a
:class:`Part` is what one write task converts; a :class:`Plan` is one store's parts,
length and episodes, whatever the kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from atari_zarr.layout import spec
from atari_zarr.sources.selection import Selection

__all__ = [
    "FrameSink",
    "KeptFrames",
    "Part",
    "Plan",
    "ScanArrays",
    "ScanStore",
    "SourceKind",
    "SourceRun",
    "Stream",
]


class SourceRun(Protocol):
    """One game/run of a source, as a kind's ``find_runs`` gives it."""

    #: Where the run lies (a run directory, a game directory), credentials included.
    url: str
    game: str
    run: str
    storage_options: dict[str, Any]
    #: The deadline of every call to its file system (seconds; None: no limit).
    timeout: float | None

    @property
    def suffixes(self) -> list[int]:
        """The parts present: checkpoint suffixes or shard indices, sorted."""


class ScanStore(Protocol):
    """Where the scans of a run's parts (pass 1) are made and kept, for :func:`plan_run`.

    Conversion keeps them in the store's work area and scans in its Dask workers;
    ``verify --source`` keeps them in a temporary directory and scans in-process.
    """

    def done(self) -> set[int]:
        """The units scanned so far."""

    def load(self, unit: int, names: list[str] | None = None) -> ScanArrays:
        """The scan of ``unit`` (only the arrays ``names``, when given)."""

    def run(self, units: list[int]) -> None:
        """Scan ``units`` and keep their scans."""


#: Rows of a part: ``(array name, output rows, values)`` blocks, frames and final frames.
Stream = Iterator[tuple[str, np.ndarray, np.ndarray]]


class FrameSink(Protocol):
    """Where a scan that reads a part's frames once (pass 1) keeps them for the write pass.

    A source that can only be read from its start, over a network, is then fetched
    once: the scan decodes the frames and hands them here; the write pass reads
    them back (:class:`KeptFrames`) instead of the source. Conversion keeps them,
    compressed, in the store's work area.
    """

    def steps(self, frames: np.ndarray) -> None:
        """The next real steps' frames ``(n, 84, 84)``, in the order of the part (the
        array is used again after the call: copy what is kept)."""

    def final(self, frame: np.ndarray | None) -> None:
        """The frame after one record's last real step (None: not known), record by record."""

    def close(self) -> None:
        """Every frame is handed over: write what is left."""


class KeptFrames(Protocol):
    """The frames a :class:`FrameSink` kept, read back by the write pass."""

    def steps(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Real steps ``lo .. hi - 1`` of the part (counted over its records) into ``out``."""

    def final(self, record: int) -> np.ndarray | None:
        """Record ``record``'s frame after its last real step, None when not known."""


@dataclass(frozen=True)
class Part:
    """One part of a run, written by one task: a DQN checkpoint or an RL Unplugged shard.

    It gives rows ``out_start .. out_start + rows - 1`` and the ``final_observation``
    rows of episodes ``first_episode .. first_episode + episodes - 1`` (none for
    kinds without final frames). ``unit`` is the checkpoint suffix or shard index;
    ``spec`` the kind's own plan of it.
    """

    key: str
    unit: int
    out_start: int
    rows: int
    first_episode: int
    episodes: int
    spec: Any

    def span(self, name: str) -> tuple[int, int]:
        """The rows of array ``name`` the part gives: of transitions, or of episodes."""
        if spec(name).dims[0] == "episode":
            return self.first_episode, self.first_episode + self.episodes
        return self.out_start, self.out_start + self.rows


@dataclass
class Plan:
    """The plan of one store, whatever the kind: parts, length, episodes, attributes."""

    parts: list[Part]
    n_rows: int
    #: Rows of ``final_observation`` (None: the kind writes none).
    n_final: int | None
    #: The episodes planned (an :class:`~atari_zarr.episodes.EpisodeLedger`).
    episodes: Any
    gaps: list[Any]
    #: The ``conversion`` attribute.
    conversion: dict[str, Any]
    #: The ``episodes`` attribute.
    episode_columns: dict[str, list[Any]]
    #: The kind's own plan (RunPlan, RluPlan).
    source_plan: Any


#: Scans are plain arrays by name (what a kind's ``scan`` gives and its ``plan`` reads).
ScanArrays = Mapping[str, np.ndarray]


def _no_warnings(attributes: Mapping[str, Any]) -> list[str]:
    return []


def _no_summary(attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    return None


@dataclass(frozen=True)
class SourceKind:
    """What conversion asks of one kind of source: a new kind is one more of these.

    Every hook takes the kind's run (a :class:`SourceRun`, what ``find_runs`` and
    ``open_run`` give).
    """

    #: The kind's name (``--source-kind``, the store's ``kind`` attribute).
    name: str
    #: Its layout, for messages.
    layout: str
    #: ``(fs, path, games) -> bool``: the location holds this kind (root, game or run
    #: directory); ``games`` narrows which game directories of a root are looked into.
    detect: Callable[[Any, str, list[str] | None], bool]
    #: ``(source, games, runs, storage_options, *, timeout) -> runs``.
    find_runs: Callable[..., list[Any]]
    #: ``(url, game, run, storage_options, timeout) -> run``: a run again, inside a task.
    open_run: Callable[[str, str, str, dict[str, Any], float | None], Any]
    #: ``(run, selection) -> units``: checkpoint suffixes or shard indices chosen.
    select: Callable[[Any, Selection], list[int]]
    #: ``(run, selection, scans, load_scan, progress) -> Plan``: ``scans`` maps units to
    #: their scans' record fields (empty for kinds without scans); ``load_scan(unit)``
    #: gives a whole scan; ``progress(1)`` after each unit planned.
    plan: Callable[..., Plan]
    #: ``(run, part, scan, kept) -> (per-step arrays, stream of frames)``, inside a task;
    #: ``kept`` is what the part's scan kept of its frames (None: read the source).
    rows: Callable[
        [Any, Part, ScanArrays | None, KeptFrames | None], tuple[dict[str, np.ndarray], Stream]
    ]
    #: ``(run, selected) -> dict``: the store's ``source`` attribute.
    source_attributes: Callable[[Any, list[int]], dict[str, Any]]
    #: What a part is called in messages (``checkpoint``, ``shard``); the ``source``
    #: attribute lists the parts a store was converted from as ``{part_name}s_selected``.
    part_name: str = "part"
    #: Optional arrays of the layout that stores of this kind have.
    optional_arrays: tuple[str, ...] = ()
    #: ``(attributes) -> lines``: what a store's attributes say about its source that
    #: does not fail the store (``verify`` prints them as warnings).
    warnings: Callable[[Mapping[str, Any]], list[str]] = _no_warnings
    #: ``(attributes) -> units``: the parts a store was converted from, from its
    #: ``conversion`` attribute (``info``'s ``checkpoints``).
    parts_converted: Callable[[Mapping[str, Any]], list[int]] = lambda attributes: []
    #: ``(attributes) -> dict or None``: what ``info`` says of the source beyond its
    #: parts (RL Unplugged: the run's shards, present and missing).
    source_summary: Callable[[Mapping[str, Any]], dict[str, Any] | None] = _no_summary
    #: ``(run, unit, selection, keep) -> arrays``: pass 1 over one unit (as far as the
    #: selection needs), handing its frames to ``keep`` when given; None: planned
    #: without scans.
    scan: Callable[[Any, int, Selection, FrameSink | None], dict[str, np.ndarray]] | None = None
    #: The fields of a scan that planning reads (the rest is for the write tasks).
    scan_fields: tuple[str, ...] = ()
    #: ``(run, selection, scans, batch) -> units``: what to scan next; empty: plan now.
    scans_needed: Callable[[Any, Selection, Mapping[int, ScanArrays], int], list[int]] | None = None
    #: Record ``--source-kind`` in the store's command (DQN Replay stores, which
    #: predate kinds, do not).
    command_names_kind: bool = True
    #: ``(run, index, total) -> name``: the file of part ``index`` of ``total`` of a run,
    #: for kinds whose parts are files named so (RL Unplugged's shards); the one
    #: spelling of the name, which the pull uses to name a part a source lacks.
    part_file: Callable[[str | int, int, int], str] | None = None
    #: ``(name) -> run or None``: the run a file of the kind belongs to, by its name.
    run_of_file: Callable[[str], str | None] | None = None

    @property
    def scans(self) -> bool:
        """Whether parts are scanned (pass 1) before planning."""
        return self.scan is not None
