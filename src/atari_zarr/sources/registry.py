"""The one registry of source kinds: a list, and what is done with a kind whatever it is.

A kind (``sources/<kind>/kind.py``: a :class:`~atari_zarr.sources.kind.SourceKind`)
says how to recognise its files, find its runs, choose and plan a run's parts, and
give each part's rows. Conversion (:mod:`atari_zarr.conversion`) and verification
(:mod:`atari_zarr.verify`) turn that into stores and checks the same way for every
kind; a source writes nothing.

=================  ===========================================  ==========================
kind               layout                                       a part (one write task)
=================  ===========================================  ==========================
``dqn-replay``     ``{Game}/{run}/replay_logs/*_ckpt.N.gz``      a checkpoint
``rl-unplugged``   ``{Game}/run_{r}-xxxxx-of-yyyyy``             a shard
=================  ===========================================  ==========================

Planning differs in one way: a DQN Replay run is planned from its small arrays in
the calling process, while an RL Unplugged shard must first be *scanned* (pass 1)
because the frames and the per-step data share one stream. :func:`plan_run` is the
one loop for both: it scans what the kind says it needs (through the caller's
:class:`~atari_zarr.sources.kind.ScanStore`), then plans. Adding a kind is a
subpackage with its ``kind.py`` and one line in :data:`KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.sources.dqn_replay.kind import DQN_REPLAY
from atari_zarr.sources.dqn_replay.kind import KIND as DQN_REPLAY_KIND
from atari_zarr.sources.kind import (
    FrameSink,
    KeptFrames,
    Part,
    Plan,
    ScanArrays,
    ScanStore,
    SourceKind,
    SourceRun,
    Stream,
)
from atari_zarr.sources.rl_unplugged.kind import KIND as RL_UNPLUGGED_KIND
from atari_zarr.sources.rl_unplugged.kind import RL_UNPLUGGED
from atari_zarr.sources.selection import Selection
from atari_zarr.sources.subset_plan import SubsetPart, apply_subset, subset_rows
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs

__all__ = [
    "DQN_REPLAY",
    "KINDS",
    "RL_UNPLUGGED",
    "FrameSink",
    "KeptFrames",
    "Part",
    "Plan",
    "ScanArrays",
    "ScanStore",
    "Selection",
    "SourceKind",
    "SourceRun",
    "detect_kind",
    "get_kind",
    "kind_of",
    "part_rows",
    "plan_run",
]

#: Every kind, by name: the one list.
KINDS: dict[str, SourceKind] = {kind.name: kind for kind in (DQN_REPLAY_KIND, RL_UNPLUGGED_KIND)}


def get_kind(name: str) -> SourceKind:
    """The kind called ``name``.

    Examples
    --------
    >>> get_kind("rl-unplugged").scans
    True
    >>> get_kind("tfds")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.SourceFormatError: source kind 'tfds' is not known: ...
    """
    if name not in KINDS:
        raise SourceFormatError(
            f"source kind {name!r} is not known: expected one of {', '.join(KINDS)}. Pass "
            f"--source-kind with one of them, or leave it out to recognise the layout."
        )
    return KINDS[name]


def kind_of(meta: dict[str, Any]) -> SourceKind | None:
    """The source kind that wrote a store with attributes ``meta`` (None: a recording).

    Stores written before kinds were recorded are DQN Replay stores.

    Examples
    --------
    >>> kind_of({}).name, kind_of({"kind": "rl-unplugged"}).name, kind_of({"kind": "collected"})
    ('dqn-replay', 'rl-unplugged', None)
    """
    return KINDS.get(str(meta.get("kind", DQN_REPLAY)))


def detect_kind(
    source: str,
    storage_options: dict[str, Any] | None = None,
    games: list[str] | None = None,
    *,
    timeout: Timeout = "default",
) -> SourceKind:
    """The kind of the files under ``source``, recognised by their layout.

    Under a dataset root, the game directories ``games`` are looked into (default:
    the first :data:`~atari_zarr.sources.roots.DETECT_GAMES`, sorted by name).

    Raises
    ------
    SourceNotFoundError
        ``source`` does not exist, or holds neither layout.
    SourceFormatError
        ``source`` holds both layouts.

    Examples
    --------
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> detect_kind(source_root).name
    'dqn-replay'
    """
    fs, path = get_fs(source, storage_options, timeout=timeout)
    path = path.rstrip("/")
    if not fs.exists(path):
        raise SourceNotFoundError(
            f"{source} does not exist: expected a DQN Replay or RL Unplugged dataset root. "
            f"Check the path or URL and the storage options."
        )
    found = [kind for kind in KINDS.values() if kind.detect(fs, path, games)]
    if len(found) == 1:
        return found[0]
    layouts = "; ".join(f"{k.name}: {k.layout}" for k in KINDS.values())
    if not found:
        raise SourceNotFoundError(
            f"{source} holds neither source layout ({layouts}). Point SOURCE at a dataset "
            f"root, a game or a run directory, or pass --source-kind."
        )
    raise SourceFormatError(
        f"{source} holds both source layouts ({layouts}); expected one. Pass --source-kind "
        f"{' or '.join(k.name for k in found)}, or point SOURCE at a narrower directory."
    )


def plan_run(
    kind: SourceKind,
    run: SourceRun,
    selection: Selection,
    scans: ScanStore | None = None,
    *,
    batch: int = 1,
    progress: Callable[[int], None] | None = None,
) -> Plan:
    """The plan of ``run`` for ``selection``: what ``convert`` writes and ``verify`` checks.

    For a kind that scans, the parts the kind asks for are scanned first, ``batch``
    at a time, through ``scans`` (the caller's, which says where scans run and are
    kept); scans already kept are used again. The kind then plans its checkpoints or
    shards and the limits; a ``selection.subset`` keeps the episodes it chooses
    (:mod:`atari_zarr.sources.subset_plan`).

    Parameters
    ----------
    kind : SourceKind
    run : SourceRun
        A run of that kind.
    selection : Selection
        Parts, limits and subset.
    scans : ScanStore, optional
        Required for kinds that scan.
    batch : int
        Parts scanned per round (the workers at hand).
    progress : callable, optional
        ``progress(n)`` as parts are planned (of ``len(run.suffixes)``).

    Examples
    --------
    >>> from atari_zarr.sources.dqn_replay.files import RunSource
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> run = RunSource(f"{source_root}/Pong/1", "Pong", "1")
    >>> plan = plan_run(get_kind("dqn-replay"), run, Selection(max_episodes=2))
    >>> len(plan.episodes)
    2
    """
    records: dict[int, ScanArrays] = {}
    load_scan = None
    if kind.scan is not None:
        if scans is None or kind.scans_needed is None:
            raise ValueError(f"source kind {kind.name} scans its parts: pass where scans go")
        fields = list(kind.scan_fields)
        while True:
            for unit in sorted(scans.done() - set(records)):
                records[unit] = scans.load(unit, fields)
            todo = kind.scans_needed(run, selection, records, batch)
            if not todo:
                break
            scans.run(todo)
        load_scan = scans.load
    plan = kind.plan(run, selection, records, load_scan, progress)
    if selection.subset is None:
        return plan

    def read(part: Part) -> tuple[dict[str, np.ndarray], Stream]:
        scan = load_scan(part.unit) if load_scan is not None else None
        return kind.rows(run, part, scan, None)  # per-step arrays only: nothing is read

    return apply_subset(plan, selection.subset, read, where=run.url)  # type: ignore[no-any-return]


def part_rows(
    kind: SourceKind,
    run: SourceRun,
    part: Part,
    scan: ScanArrays | None,
    kept: KeptFrames | None = None,
) -> tuple[dict[str, np.ndarray], Stream]:
    """A planned part's per-step arrays and frames (a subset's part filtered to its pieces);
    ``kept``: the frames its scan kept, read instead of the source."""
    if isinstance(part.spec, SubsetPart):
        return subset_rows(part, lambda original: kind.rows(run, original, scan, kept))
    return kind.rows(run, part, scan, kept)
