"""The one registry of source kinds: what conversion asks of a source, for each kind.

A kind says how to recognise its files, find its runs, choose and plan a run's
parts, and give each part's rows. Conversion (:mod:`atari_zarr.conversion`) turns
that into stores the same way for every kind; a source writes nothing.

=================  ===========================================  ==========================
kind               layout                                       a part (one write task)
=================  ===========================================  ==========================
``dqn-replay``     ``{Game}/{run}/replay_logs/*_ckpt.N.gz``      a checkpoint
``rl-unplugged``   ``{Game}/run_{r}-{i:05d}-of-{N:05d}``         a shard
=================  ===========================================  ==========================

Planning differs in one way: a DQN Replay run is planned from its small arrays in
the calling process, while an RL Unplugged shard must first be *scanned* (pass 1,
one task per shard) because the frames and the per-step data share one stream.
A kind with a ``scan`` hook is scanned; its ``plan`` then reads the scans' per-record
fields. Adding a kind is adding a :class:`SourceKind` to :data:`KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.layout import (
    FINAL_OBSERVATION,
    OBSERVATION,
    UNCLIPPED_REWARD,
    spec,
)
from atari_zarr.sources.dqn_replay import files as dqn_files
from atari_zarr.sources.dqn_replay.planner import RunPlan, lap_destinations, lap_step_arrays
from atari_zarr.sources.dqn_replay.selection import (
    Selection,
    build_plan,
    parse_checkpoints,
)
from atari_zarr.sources.rl_unplugged import files as rlu_files
from atari_zarr.sources.rl_unplugged.planner import (
    RluPlan,
    ShardPart,
    plan_shards,
    return_disagreements,
    scans_needed,
)
from atari_zarr.sources.rl_unplugged.rows import iter_shard_frames, shard_step_arrays
from atari_zarr.sources.rl_unplugged.scan import RECORD_FIELDS, ShardScan, scan_shard
from atari_zarr.sources.subset_plan import SubsetPart, apply_subset, subset_rows
from atari_zarr.storage.filesystem import get_fs

__all__ = [
    "KINDS",
    "Part",
    "Plan",
    "Selection",
    "SourceKind",
    "detect_kind",
    "get_kind",
    "part_rows",
    "plan_run",
]

#: Rows of a part: ``(array name, output rows, values)`` blocks, frames and final frames.
Stream = Iterator[tuple[str, np.ndarray, np.ndarray]]


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


@dataclass(frozen=True)
class SourceKind:
    """What conversion asks of one kind of source: a new kind is one more of these.

    Every hook takes the kind's run object (what ``find_runs`` and ``open_run`` give).
    """

    #: The kind's name (``--source-kind``, the store's ``kind`` attribute).
    name: str
    #: Its layout, for messages.
    layout: str
    #: ``(fs, path, games) -> bool``: the location holds this kind (root, game or run
    #: directory); ``games`` narrows which game directories of a root are looked into.
    detect: Callable[[Any, str, list[str] | None], bool]
    #: ``(source, games, runs, storage_options) -> runs``.
    find_runs: Callable[..., list[Any]]
    #: ``(url, game, run, storage_options) -> run``: a run again, inside a task.
    open_run: Callable[[str, str, str, dict[str, Any]], Any]
    #: ``(run, selection) -> units``: checkpoint suffixes or shard indices chosen.
    select: Callable[[Any, Selection], list[int]]
    #: ``(run, selection, scans, load_scan, progress) -> Plan``: ``scans`` maps units to
    #: their scans' record fields (empty for kinds without scans); ``load_scan(unit)``
    #: gives a whole scan; ``progress(1)`` after each unit planned.
    plan: Callable[..., Plan]
    #: ``(run, part, scan) -> (per-step arrays, stream of frames)``, inside a task.
    rows: Callable[[Any, Part, ScanArrays | None], tuple[dict[str, np.ndarray], Stream]]
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
    #: ``(run, unit) -> arrays``: pass 1 over one unit; None: planned without scans.
    scan: Callable[[Any, int], dict[str, np.ndarray]] | None = None
    #: The fields of a scan that planning reads (the rest is for the write tasks).
    scan_fields: tuple[str, ...] = ()
    #: ``(run, selection, scans, batch) -> units``: what to scan next; empty: plan now.
    scans_needed: Callable[[Any, Selection, Mapping[int, ScanArrays], int], list[int]] | None = None
    #: Record ``--source-kind`` in the store's command (DQN Replay stores, which
    #: predate kinds, do not).
    command_names_kind: bool = True

    @property
    def scans(self) -> bool:
        """Whether parts are scanned (pass 1) before planning."""
        return self.scan is not None


DQN_REPLAY = "dqn-replay"
RL_UNPLUGGED = "rl-unplugged"


# -- detection ------------------------------------------------------------------------
#: Game directories a detector looks into when no game is named: a dataset root holds
#: one layout throughout, and a remote listing per game costs a request.
DETECT_GAMES = 3


def _names(fs: Any, path: str) -> list[tuple[str, bool]]:
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    return sorted(
        (str(e["name"]).rstrip("/").rsplit("/", 1)[-1], e.get("type") == "directory")
        for e in entries
    )


def _game_dirs(names: list[tuple[str, bool]], games: list[str] | None) -> list[str]:
    dirs = [n for n, is_dir in names if is_dir]
    named = [g for g in dirs if g in (games or [])]
    # games that are not there are find_runs' to report, with the games found
    return named or dirs[:DETECT_GAMES]


def _is_dqn(fs: Any, path: str, games: list[str] | None = None) -> bool:
    names = _names(fs, path)
    if any(n == dqn_files.LOGS_DIR for n, _ in names):
        return True  # a run directory
    for game in _game_dirs(names, games):
        runs = [r for r, is_dir in _names(fs, f"{path}/{game}") if is_dir]
        if runs and fs.exists(f"{path}/{game}/{runs[0]}/{dqn_files.LOGS_DIR}"):
            return True  # one run per game tells the layout
    return False


def _is_rlu(fs: Any, path: str, games: list[str] | None = None) -> bool:
    names = _names(fs, path)
    if any(rlu_files.is_shard_name(n) for n, is_dir in names if not is_dir):
        return True  # a game directory
    return any(rlu_files.holds_shards(fs, f"{path}/{g}") for g in _game_dirs(names, games))


# -- DQN Replay -----------------------------------------------------------------------
def _dqn_select(run: Any, selection: Selection) -> list[int]:
    return selection.suffixes(run.suffixes) or list(run.suffixes)


def _dqn_open(url: str, game: str, run: str, options: dict[str, Any]) -> Any:
    return dqn_files.RunSource(url, game, run, options)


def _dqn_plan(
    run: dqn_files.RunSource,
    selection: Selection,
    scans: Mapping[int, ScanArrays] | None = None,
    load_scan: Callable[[int], ScanArrays] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Plan:
    """The plan of a DQN Replay run (:func:`~.dqn_replay.selection.build_plan`)."""
    plan: RunPlan = build_plan(run, selection, progress=progress)
    parts = [
        Part(f"lap-{lap.suffix}", lap.suffix, lap.out_start, lap.n_out, 0, 0, lap)
        for lap in plan.laps
        if lap.n_out
    ]
    return Plan(
        parts=parts,
        n_rows=plan.n_rows,
        n_final=None,
        episodes=plan.episodes,
        gaps=plan.gaps,
        conversion=plan.attributes(),
        episode_columns=plan.episodes.as_attributes(),
        source_plan=plan,
    )


def _dqn_rows(
    run: dqn_files.RunSource, part: Part, scan: ScanArrays | None
) -> tuple[dict[str, np.ndarray], Stream]:
    lap = part.spec
    return lap_step_arrays(lap, run.read_small(lap.suffix)), _dqn_frames(run, lap)


def _dqn_frames(run: dqn_files.RunSource, lap: Any) -> Stream:
    # rows in buffer order: a rotation of the output order
    dest = lap_destinations(lap)
    for start, block in run.iter_observations(lap.suffix, lap.capacity):
        d = dest[start : start + len(block)]
        sel = np.flatnonzero(d >= 0)
        if sel.size:
            yield OBSERVATION, d[sel], block[sel]


def _dqn_source(run: dqn_files.RunSource, selected: list[int]) -> dict[str, Any]:
    return {"url": run.url, "checkpoints_selected": selected or run.suffixes}


# -- RL Unplugged ---------------------------------------------------------------------
def _rlu_select(run: rlu_files.RluRun, selection: Selection) -> list[int]:
    spec: Any = selection.checkpoints
    if isinstance(spec, str) and spec.strip().lower() != "all":
        presets = rlu_files.presets(run.num_shards)
        parts: list[str] = []
        for part in spec.split(","):
            key = part.strip().lower()
            if key in presets:
                parts.extend(str(s) for s in presets[key])
            else:
                parts.append(part.strip())
        spec = ",".join(parts)
    chosen = parse_checkpoints(spec, run.suffixes)
    return list(run.suffixes) if chosen is None else chosen


def _rlu_open(url: str, game: str, run: str, options: dict[str, Any]) -> rlu_files.RluRun:
    return rlu_files.RluRun(url, game, run, options)


def _rlu_scan(run: rlu_files.RluRun, index: int) -> dict[str, np.ndarray]:
    """Pass 1 over shard ``index`` of ``run``, as plain arrays."""
    with run.open(index) as stream:
        return scan_shard(stream, run.where(index), index).to_arrays()


def _rlu_scans_needed(
    run: rlu_files.RluRun, selection: Selection, scans: Mapping[int, ScanArrays], batch: int
) -> list[int]:
    """Shards to scan next (see :func:`~.rl_unplugged.planner.scans_needed`)."""
    summary = {i: (int(a["real"].sum()), int((a["real"] > 0).sum())) for i, a in scans.items()}
    return scans_needed(
        _rlu_select(run, selection),
        summary,
        max_transitions=selection.max_transitions,
        max_episodes=selection.max_episodes,
        batch=batch,
    )


def _rlu_plan(
    run: rlu_files.RluRun,
    selection: Selection,
    scans: Mapping[int, ScanArrays] | None = None,
    load_scan: Callable[[int], ScanArrays] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Plan:
    """The plan of an RL Unplugged run from its scans (records only)."""
    records = {i: ShardScan.from_arrays(a) for i, a in (scans or {}).items()}

    def load_steps(index: int) -> ShardScan:
        if load_scan is None:  # pragma: no cover - conversion always passes it
            raise ValueError(f"planning needs the steps of shard {index}")
        return ShardScan.from_arrays(load_scan(index))

    plan: RluPlan = plan_shards(
        records,
        num_shards=run.num_shards,
        present=run.suffixes,
        selected=[i for i in _rlu_select(run, selection) if i in records],
        max_transitions=selection.max_transitions,
        max_episodes=selection.max_episodes,
        load_steps=load_steps,
    )
    parts = [
        Part(p.key, p.index, p.out_start, p.rows, p.first_episode, p.episodes, p)
        for p in plan.parts
    ]
    return Plan(
        parts=parts,
        n_rows=plan.n_rows,
        n_final=plan.n_episodes,
        episodes=plan.episodes,
        gaps=plan.gaps,
        conversion=plan.attributes(),
        episode_columns=plan.episode_attributes(),
        source_plan=plan,
    )


def _rlu_rows(
    run: rlu_files.RluRun, part: Part, scan: ScanArrays | None
) -> tuple[dict[str, np.ndarray], Stream]:
    if scan is None:  # pragma: no cover - conversion always passes the scan
        raise ValueError(f"shard {part.unit} needs its scan")
    spec: ShardPart = part.spec
    shard = ShardScan.from_arrays(scan)
    return shard_step_arrays(spec, shard), iter_shard_frames(run, spec, shard)


def _rlu_source(run: rlu_files.RluRun, selected: list[int]) -> dict[str, Any]:
    return {
        "url": run.url,
        "num_shards": run.num_shards,
        "shards_present": run.suffixes,
        "shards_missing": run.missing,
        "shards_selected": selected,
    }


KINDS: dict[str, SourceKind] = {
    kind.name: kind
    for kind in (
        SourceKind(
            DQN_REPLAY,
            "{Game}/{run}/replay_logs/ holding $store$_*_ckpt.N.gz files",
            detect=_is_dqn,
            find_runs=dqn_files.find_runs,
            open_run=_dqn_open,
            select=_dqn_select,
            plan=_dqn_plan,
            rows=_dqn_rows,
            source_attributes=_dqn_source,
            part_name="checkpoint",
            command_names_kind=False,
        ),
        SourceKind(
            RL_UNPLUGGED,
            "{Game}/run_{r}-xxxxx-of-yyyyy GZIP TFRecord shards",
            detect=_is_rlu,
            find_runs=rlu_files.find_runs,
            open_run=_rlu_open,
            select=_rlu_select,
            plan=_rlu_plan,
            rows=_rlu_rows,
            source_attributes=_rlu_source,
            part_name="shard",
            optional_arrays=(FINAL_OBSERVATION, UNCLIPPED_REWARD),
            warnings=return_disagreements,
            scan=_rlu_scan,
            scan_fields=(*RECORD_FIELDS, "index"),
            scans_needed=_rlu_scans_needed,
        ),
    )
}


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


def detect_kind(
    source: str,
    storage_options: dict[str, Any] | None = None,
    games: list[str] | None = None,
) -> SourceKind:
    """The kind of the files under ``source``, recognised by their layout.

    Under a dataset root, the game directories ``games`` are looked into (default:
    the first :data:`DETECT_GAMES`, sorted by name).

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
    fs, path = get_fs(source, storage_options)
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
    run: Any,
    selection: Selection,
    scans: Mapping[int, ScanArrays] | None = None,
    load_scan: Callable[[int], ScanArrays] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Plan:
    """The plan of ``run`` for ``selection``: what ``convert`` writes and ``verify`` checks.

    The kind plans its checkpoints or shards and the limits; a ``selection.subset``
    then keeps the episodes it chooses (:mod:`atari_zarr.sources.subset_plan`).
    """
    plan = kind.plan(run, selection, scans or {}, load_scan, progress)
    if selection.subset is None:
        return plan

    def read(part: Part) -> tuple[dict[str, np.ndarray], Stream]:
        scan = load_scan(part.unit) if kind.scans and load_scan is not None else None
        return kind.rows(run, part, scan)

    return apply_subset(plan, selection.subset, read, where=run.url)  # type: ignore[no-any-return]


def part_rows(
    kind: SourceKind, run: Any, part: Part, scan: ScanArrays | None
) -> tuple[dict[str, np.ndarray], Stream]:
    """A planned part's per-step arrays and frames (a subset's part filtered to its pieces)."""
    if isinstance(part.spec, SubsetPart):
        return subset_rows(part, lambda original: kind.rows(run, original, scan))
    return kind.rows(run, part, scan)
