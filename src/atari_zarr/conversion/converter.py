"""Convert source runs (DQN Replay, RL Unplugged) into atari_zarr stores, as Dask graphs.

The conversion of one run happens in passes; every source kind
(:mod:`atari_zarr.sources.registry`) goes through the same machinery:

1. **Scan** (RL Unplugged only), as a Dask graph with one task per shard: stream
   the shard once, parse every Example without keeping its PNGs, and save the
   small per-step arrays and per-episode rows in the work area. A shard's row
   offsets depend on every earlier shard, and a shard (0.5 to 2 GB) is never held
   whole, so the frames wait for pass 3. With ``max_episodes`` or
   ``max_transitions``, shards are scanned in index order only until the limit is
   reached.
2. **Plan**, in the calling process: DQN Replay reads the small per-step arrays of
   every checkpoint (:func:`atari_zarr.sources.dqn_replay.selection.build_plan`);
   RL Unplugged reads the scans' per-episode rows
   (:func:`atari_zarr.sources.rl_unplugged.planner.plan_shards`). This fixes the
   store's length, so row ``i`` of every array is transition ``i``.
3. **Write**, as a Dask graph (:mod:`atari_zarr.conversion.graph`) that runs on any
   scheduler (:mod:`atari_zarr.conversion.scheduling`) and writes the same bytes
   whichever runs it: one task per checkpoint or shard, plus one per unit two of
   them share.

What the passes cost an RL Unplugged run (bytes read, work area, memory per worker) is
``docs/format.md``'s "The passes, and what they cost".

Every task records a marker after its data (:mod:`atari_zarr.conversion.workdir`); a
conversion killed at any point and run again redoes only the work without a marker
(scans included), after checking that the plan is the same (``plan_digest``
attribute). The work area also holds the lock that refuses a second, concurrent
conversion of the same store. The completion marker is written last
(:func:`atari_zarr.layout.mark_complete`).

How to convert is one frozen :class:`ConvertOptions`, made once by :func:`convert`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from atari_zarr._version import __version__
from atari_zarr.catalog import store_state
from atari_zarr.commands import command_line
from atari_zarr.conversion.derived import write_derived
from atari_zarr.conversion.graph import Job, build_graph, build_scan_graph, expected_keys
from atari_zarr.conversion.scheduling import (
    describe_scheduler,
    process_pool,
    run_graph,
    scheduler_for,
)
from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.errors import (
    InvalidArgumentError,
    StoreExistsError,
    StoreFormatError,
    StoreIncompleteError,
    StoreWriteError,
)
from atari_zarr.layout import (
    ARRAYS,
    ATTRS_KEY,
    FORMAT_VERSION,
    OPTIONAL_ARRAYS,
    create_array,
    create_store,
    mark_complete,
    store_path,
)
from atari_zarr.progress import progress_bar
from atari_zarr.resources import cpu_count
from atari_zarr.sources.registry import (
    DQN_REPLAY,
    Plan,
    ScanArrays,
    Selection,
    SourceKind,
    SourceRun,
    detect_kind,
    get_kind,
    plan_run,
)
from atari_zarr.storage.deadline import DEFAULT_TIMEOUT, Timeout, resolve_timeout
from atari_zarr.storage.filesystem import disk_full_error
from atari_zarr.storage.paths import is_url
from atari_zarr.storage.remote import open_zarr_store
from atari_zarr.subsets import CHECKPOINT_ROWS, RANDOM, Subset

__all__ = ["ConvertOptions", "ConvertedStore", "convert", "convert_run"]

log = logging.getLogger("atari_zarr")


@dataclass(frozen=True)
class ConvertedStore:
    """What one conversion wrote."""

    game: str
    run: str
    url: str
    transitions: int
    episodes: int
    gaps: int


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert: everything :func:`convert` takes besides where from and where to.

    See :func:`convert` for the meaning of each field; ``storage_options`` are the
    destination's.

    Examples
    --------
    >>> options = ConvertOptions(Selection("expert", max_episodes=10), return_to_go=True)
    >>> options.selection.suffixes(range(60)), options.overwrite
    ([50], False)
    """

    selection: Selection = field(default_factory=Selection)
    overwrite: bool = False
    progress: bool = True
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    scheduler: Any = None
    workers: int | None = None
    full_action_space: bool = False
    return_to_go: bool = False
    #: Seconds each call to the source's or the destination's storage may take.
    timeout: float | None = DEFAULT_TIMEOUT
    #: Scans keep the frames they decode for the write pass, so the source is read once
    #: (None: when it is read over a network).
    keep_frames: bool | None = None
    #: The command recorded in the store (None: the ``convert`` line of these options);
    #: a pull records its own ``atari-zarr pull`` line.
    command: str | None = None

    def keeps_frames(self, source_url: str) -> bool:
        """Whether scans of the source at ``source_url`` keep their frames."""
        return is_url(source_url) if self.keep_frames is None else bool(self.keep_frames)

    def derived(self) -> dict[str, bool]:
        """The optional arrays asked for (part of the plan's digest)."""
        return {"full_action_space": self.full_action_space, "return_to_go": self.return_to_go}


def _command(kind: SourceKind, source: Any, dest: str, options: ConvertOptions) -> str:
    """The command that makes (or finishes) this store, recorded in its attributes."""
    if options.command is not None:
        return options.command
    url = source.url.rstrip("/")
    is_run_dir = url.endswith(f"{source.game}/{source.run}")
    is_game_dir = not is_run_dir and url.endswith(f"/{source.game}")  # RL Unplugged's
    spec = options.selection.checkpoints
    if spec is not None and not isinstance(spec, str):
        spec = ",".join(map(str, spec))
    return command_line(
        "convert",
        source.url,
        dest,
        games=None if is_run_dir or is_game_dir else [source.game],
        runs=None if is_run_dir else [source.run],
        checkpoints=spec,  # as asked for (a preset stays a preset), like `selection`
        max_transitions=options.selection.max_transitions,
        max_episodes=options.selection.max_episodes,
        **_subset_options(options.selection.subset),
        full_action_space=options.full_action_space,
        return_to_go=options.return_to_go,
        source_kind=kind.name if kind.command_names_kind else None,
    )


def _subset_options(subset: Subset | None) -> dict[str, Any]:
    """The command-line options of ``subset`` (the CLI's ``--fraction``, ``--dt-*``)."""
    if subset is None:
        return {}
    out: dict[str, Any] = {}
    if subset.rule == "fraction":
        out["fraction"] = subset.fraction
        if subset.checkpoint_rows is not None:  # pragma: no cover - Python API only
            out["fraction_rows"] = subset.checkpoint_rows
        if subset.order != RANDOM:
            out["fraction_order"] = subset.order
    else:
        out.update(
            dt_buffers=subset.num_buffers,
            dt_steps=subset.num_steps,
            dt_trajectories=subset.trajectories_per_buffer,
        )
    if subset.seed:
        out["subset_seed"] = subset.seed
    return out


def _plan_digest(
    kind: SourceKind,
    source: Any,
    selected: list[int],
    plan: Plan,
    derived: dict[str, Any],
    scans: str | None,
) -> str:
    """Fingerprint of the work: resuming is allowed only into a store with the same one."""
    doc: dict[str, Any] = {
        "derived": derived,
        "format_version": FORMAT_VERSION,
        "source": source.url,
        "game": source.game,
        "run": source.run,
        "selected": selected,
        "n_rows": plan.n_rows,
        "conversion": plan.conversion,
    }
    doc.update(kind=kind.name, n_final=plan.n_final, scans=scans)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _scan_digest(source: Any, selection: Selection) -> str:
    """Fingerprint of the shards a scan reads, and how far: scans are reused only for the
    same files read as far."""
    subset = selection.subset
    doc: dict[str, Any] = {
        "scan_format": 1,
        "source": source.url,
        "game": source.game,
        "run": source.run,
        "shards": source.names(),
    }
    prefix = None if subset is None else subset.prefix_rows(CHECKPOINT_ROWS)
    if prefix is not None:  # whole scans keep the fingerprint they always had
        doc["prefix_rows"] = prefix
    if any(size is None or version is None for _, size, version in doc["shards"]):
        # a source that tells neither size nor version (a web server with no ETag: its
        # Last-Modified seconds are no version) cannot tell whether it changed: its scans
        # are never resumed, and the plan they are part of starts over
        doc["unversioned"] = uuid.uuid4().hex
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def convert_run(
    source: Any,
    dest: str,
    options: ConvertOptions | None = None,
    *,
    kind: str | SourceKind = DQN_REPLAY,
) -> ConvertedStore:
    """Convert one game/run into ``{dest}/{game}/{run}.zarr``.

    Parameters
    ----------
    source : RunSource or RluRun
        The run (from the kind's ``find_runs``).
    dest : str
        Destination root (path or fsspec URL).
    options : ConvertOptions, optional
        How (default: everything, with progress bars); see :func:`convert`.
    kind : str or SourceKind
        The run's source kind (default ``"dqn-replay"``).

    Returns
    -------
    ConvertedStore

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr.sources.dqn_replay.files import RunSource
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> source = RunSource(f"{source_root}/Pong/1", "Pong", "1")
    >>> options = ConvertOptions(Selection(max_episodes=2), progress=False)
    >>> convert_run(source, tempfile.mkdtemp(), options).episodes
    2
    """
    options = options or ConvertOptions()
    kind = get_kind(kind) if isinstance(kind, str) else kind
    url = store_path(dest, source.game, source.run)
    kind.select(source, options.selection)  # a bad selection fails before anything is locked
    command = _command(kind, source, str(dest), options)
    work = WorkDir(url, dict(options.storage_options), timeout=options.timeout)
    work.acquire(command)
    finished = False
    try:
        result = _convert_locked(kind, source, url, work, command, options)
        finished = True
        return result
    except StoreExistsError:
        finished = True  # complete already: a work area a crash left behind is stale
        raise
    except OSError as exc:
        full = disk_full_error(
            url, exc, resume="the conversion resumes where it stopped, with what was written"
        )
        if full is None:
            raise
        raise full from None
    finally:
        work.release(remove_all=finished)


def _check_state(source: Any, url: str, options: ConvertOptions) -> str:
    # remote errors propagate
    state = store_state(url, dict(options.storage_options), timeout=options.timeout)
    if state == "complete" and not options.overwrite:
        raise StoreExistsError(
            f"{url} already holds a complete store of {source.game}/{source.run}; expected an "
            f"empty destination. Pass --overwrite (overwrite=True) to replace it, or choose "
            f"another DEST."
        )
    if state == "foreign" and not options.overwrite:
        raise StoreFormatError(
            f"{url} exists and is not an atari_zarr store; refusing to write over it. Remove "
            f"it, choose another DEST, or pass --overwrite."
        )
    return state


def _job(kind: SourceKind, source: Any, url: str, options: ConvertOptions, plan: Plan) -> Job:
    sizes = [(name, plan.n_rows) for name in ARRAYS]
    for name in kind.optional_arrays:
        spec = OPTIONAL_ARRAYS[name]
        sizes.append(
            (name, plan.n_final or 0) if spec.dims[0] == "episode" else (name, plan.n_rows)
        )
    return Job(
        kind.name,
        source.url,
        source.game,
        source.run,
        dict(source.storage_options),
        url,
        dict(options.storage_options),
        tuple(sizes),
        options.timeout,
        keep_frames=options.keeps_frames(source.url),
        listed=source,
    )


class _WorkScans:
    """Scans of a run's parts (pass 1), made by the conversion's workers and kept in
    the work area, so that an interrupted conversion scans only what is missing."""

    def __init__(
        self, kind: SourceKind, source: SourceRun, url: str, work: WorkDir, options: ConvertOptions
    ) -> None:
        self.kind, self.source, self.url, self.work, self.options = kind, source, url, work, options
        #: Fingerprint of the files scanned (None: nothing was asked of the scans).
        self.digest: str | None = None
        self._bar: Any = None
        #: Source bytes and transitions the scans of this conversion read.
        self._read = [0, 0]
        #: Parts whose scan this conversion ran.
        self._ran: set[int] = set()

    def done(self) -> set[int]:
        if self.digest is None:  # first use: scans of other files are not reused
            self.digest = _scan_digest(self.source, self.options.selection)
            if self.options.overwrite or self.work.scan_digest() != self.digest:
                self.work.reset_scans(self.digest)
        return self.work.scans_done()

    def load(self, unit: int, names: list[str] | None = None) -> ScanArrays:
        return self.work.load_scan(unit, names)

    def run(self, units: list[int]) -> None:
        label = f"{self.source.game}/{self.source.run}"
        again = sorted(set(units) & self._ran)
        if again:  # never scan the same parts for ever
            raise StoreWriteError(
                f"{self.work.url}: the scans of {self.kind.part_name}s {again[:10]} of {label} "
                f"finished, but the work area does not list them (scans/done); expected "
                f"every scan listed once it is kept. The store stays unfinished: run the same "
                f"command again to resume."
            )
        self._ran.update(units)
        if self._bar is None:
            selected = self.kind.select(self.source, self.options.selection)
            self._bar = progress_bar(
                len(selected),
                f"scan {label}",
                unit=self.kind.part_name,
                enabled=self.options.progress,
                initial=len(self.work.scans_done() & set(selected)),
            )
        job = _job(
            self.kind, self.source, self.url, self.options, Plan([], 0, 0, None, [], {}, {}, None)
        )
        graph = build_scan_graph(
            job, units, f"atari-zarr-scan-{uuid.uuid4().hex[:8]}-", self.options.selection
        )
        log.info("scanning %d %ss of %s", len(graph), self.kind.part_name, label)
        bar = self._bar

        def on_done(key: Any) -> None:
            bar.update(1)
            if self.options.progress:  # what was read so far, in bytes and transitions
                unit = int(str(key).rsplit("-", 1)[-1])
                self._read[1] += int(self.work.load_scan(unit, ["real"])["real"].sum())
                with contextlib.suppress(FileNotFoundError):  # scans kept by older releases
                    read = self.work.load_scan(unit, ["source_bytes"])["source_bytes"]
                    self._read[0] += max(0, int(np.asarray(read).reshape(-1)[0]))
                bar.set_postfix_str(
                    f"{self._read[0] / 1e6:,.1f} MB read, {self._read[1]:,} transitions"
                )

        run_graph(
            graph,
            list(graph),
            scheduler=self.options.scheduler,
            workers=self.options.workers,
            on_done=on_done,
            timeout=self.options.timeout,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _plan(
    kind: SourceKind, source: SourceRun, url: str, work: WorkDir, options: ConvertOptions
) -> tuple[Plan, str | None]:
    """Scan what the kind needs scanned, then plan: the plan and the scans' fingerprint."""
    scans = _WorkScans(kind, source, url, work, options)
    bar = progress_bar(
        len(source.suffixes),
        f"plan {source.game}/{source.run}",
        unit=kind.part_name,
        enabled=options.progress,
    )
    try:
        plan = plan_run(
            kind,
            source,
            options.selection,
            scans,
            batch=options.workers or cpu_count(),
            progress=bar.update,
        )
    finally:
        scans.close()
        bar.close()
    return plan, scans.digest


def _convert_locked(
    kind: SourceKind,
    source: Any,
    url: str,
    work: WorkDir,
    command: str,
    options: ConvertOptions,
) -> ConvertedStore:
    storage_options = dict(options.storage_options)
    state = _check_state(source, url, options)
    label = f"{source.game}/{source.run}"
    plan, scans = _plan(kind, source, url, work, options)
    selected = kind.select(source, options.selection)
    digest = _plan_digest(kind, source, selected, plan, options.derived(), scans)
    job = _job(kind, source, url, options, plan)
    sizes = dict(job.sizes)

    done: set[str] = set()
    fresh = state != "incomplete" or options.overwrite
    if not fresh:
        group = zarr.open_group(
            open_zarr_store(url, storage_options, read_only=False, timeout=options.timeout),
            mode="r+",
        )
        found = group.attrs.get(ATTRS_KEY)
        meta = found if isinstance(found, dict) else {}
        if meta.get("plan_digest") != digest:
            raise StoreIncompleteError(
                f"{url} is an unfinished conversion of different input (other source, "
                f"checkpoints or converter version): expected the plan of `{command}`, found "
                f"the one of `{meta.get('command')}`. Run that command to finish it, or pass "
                f"--overwrite to start over."
            )
        specs = {**ARRAYS, **OPTIONAL_ARRAYS}
        if any(
            name not in group
            or getattr(group[name], "shape", None) != (rows, *specs[name].row_shape)
            for name, rows in sizes.items()
        ):
            fresh = True  # killed while creating the arrays: nothing was written yet
        elif work.plan_digest() == digest:
            done = work.done()
        else:  # markers lost: redo everything into the existing arrays
            work.reset(digest)
        if not fresh:
            log.info(
                "%s: resuming, %d of %d %s already written",
                url,
                len([p for p in plan.parts if p.key in done]),
                len(plan.parts),
                f"{kind.part_name}s",
            )
    if fresh:
        work.reset(digest)
        attrs = {
            "kind": kind.name,
            "game": source.game,
            "run": source.run,
            "source": kind.source_attributes(source, selected),
            "command": command,
            "selection": options.selection.attributes(),
            "plan_digest": digest,
            "atari_zarr_version": __version__,
        }
        group = create_store(
            open_zarr_store(url, storage_options, read_only=False, timeout=options.timeout),
            plan.n_rows,
            attrs,
        )
        for name in kind.optional_arrays:
            create_array(group, name, sizes[name])

    conversion = work.conversion_id()
    if conversion is None:  # a work area of an earlier release: this conversion owns it now
        work.reset(digest)
        done, conversion = set(), work.conversion_id()
    job = dataclasses.replace(job, conversion=conversion or "")
    tag = f"atari-zarr-{digest[:12]}-{uuid.uuid4().hex[:8]}-"
    graph = build_graph(job, plan.parts, work, done, tag)
    part_keys = {tag + p.key for p in plan.parts}
    n_parts = len(plan.parts)
    n_done = n_parts - sum(1 for k in graph if k in part_keys)
    log.info(
        "writing %s with %s: %d tasks",
        url,
        describe_scheduler(options.scheduler, options.workers),
        len(graph),
    )
    bar = progress_bar(
        n_parts, f"write {label}", unit=kind.part_name, enabled=options.progress, initial=n_done
    )

    def on_done(key: Any) -> None:
        if str(key) in part_keys:
            bar.update(1)

    try:
        run_graph(
            graph,
            list(graph),
            scheduler=options.scheduler,
            workers=options.workers,
            on_done=on_done,
            timeout=options.timeout,
        )
    finally:
        bar.close()

    # Nothing is marked complete unless every marker is in.
    missing = expected_keys(plan.parts, sizes, work) - work.done()
    if missing:  # pragma: no cover - a task returned without writing its marker
        raise StoreWriteError(
            f"{work.url}: the write tasks finished, but the work area does not list the "
            f"markers of {sorted(missing)[:10]}; expected every task's marker once its data "
            f"is written. The store stays unfinished: run the same command again to resume "
            f"(work without a marker is done again)."
        )

    group = zarr.open_group(
        open_zarr_store(url, storage_options, read_only=False, timeout=options.timeout), mode="r+"
    )
    # optional arrays derived from the finished per-step arrays, before the marker
    derived = write_derived(
        group,
        game=source.game,
        where=url,
        action_full=options.full_action_space,
        return_to_go=options.return_to_go,
    )
    n_ep = len(plan.episodes)
    mark_complete(
        group,
        {
            "conversion": plan.conversion,
            "counts": {"transitions": plan.n_rows, **plan.episodes.counts()},
            "episodes": plan.episode_columns,
            **({"derived": derived} if derived else {}),
        },
    )
    log.info("wrote %s: %d transitions, %d episodes", url, plan.n_rows, n_ep)
    return ConvertedStore(source.game, source.run, url, plan.n_rows, n_ep, len(plan.gaps))


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
    source_kind: str | None = None,
    fraction: float | None = None,
    subset: Subset | None = None,
    timeout: Timeout = "default",
    keep_frames: bool | None = None,
    listed: Sequence[SourceRun] | None = None,
    command: str | None = None,
) -> list[ConvertedStore]:
    """Convert the runs under ``source`` (DQN Replay or RL Unplugged) into stores under ``dest``.

    Parameters
    ----------
    source : str
        DQN Replay: the dataset root holding ``{Game}/{run}/replay_logs/``, or one run
        directory. RL Unplugged: the root holding ``{Game}/run_{r}-xxxxx-of-yyyyy``
        (``gs://rl_unplugged/atari_episodes_ordered`` with ``token="anon"``), or one
        game directory. Local path or fsspec URL.
    dest : str
        Destination root; each run goes to ``{dest}/{Game}/{run}.zarr``.
    games, runs : sequence of str, optional
        Convert only these (default: everything found); RL Unplugged's ``run_1-*``
        is run ``"1"``.
    checkpoints : str or iterable of int, optional
        Checkpoint suffixes (RL Unplugged: shard indices) to convert, e.g.
        ``"0-9,50"`` (default: all), or d4rl-atari's presets ``"mixed"`` (1),
        ``"medium"`` (10), ``"expert"`` (50; RL Unplugged: its last shard).
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
    source_kind : str, optional
        ``"dqn-replay"`` or ``"rl-unplugged"``; None: recognised by the layout.
    fraction : float, optional
        d3rlpy's subset (``get_atari_transitions(fraction=F)``): from every checkpoint
        (shard), episodes in a random order until ``F`` x 1,000,000 transitions (a
        DQN Replay run: ``F`` x its capacity, 1,000,000 in the dataset), the last one
        trimmed to the exact count. The same as ``subset=Subset.fraction_of(F)``.
    subset : Subset, optional
        The episodes to keep (:mod:`atari_zarr.subsets`: ``Subset.fraction_of``,
        ``Subset.decision_transformer``), after the checkpoints and limits. The
        store records it; ``verify --source`` checks it.
    timeout : float, None or "default"
        Seconds each call to the source's or the destination's storage may take,
        retries included, in this process and in the workers (default 60; None: no
        limit).
    keep_frames : bool, optional
        A source that is scanned before it is written (RL Unplugged) is then read
        once: the scan decodes the frames and keeps them, compressed, in the work
        area until the write pass (:mod:`atari_zarr.conversion.kept_frames`). None
        (default): when ``source`` is read over a network.
    listed : sequence, optional
        The runs of ``source`` as a caller already listed and checked them (what
        ``find_runs`` of the source kind gives): those objects are converted, and
        nothing is listed again (``games`` and ``runs`` are then not used).
    command : str, optional
        The command the stores record as the one that makes them (default: this
        conversion's ``atari-zarr convert`` line); a pull records its own, redacted.

    Raises
    ------
    InvalidArgumentError
        A limit is not positive, or the scheduler is unknown.
    SourceNotFoundError
        ``source`` holds neither layout (or a game, run or checkpoint asked for).
    SourceFormatError
        A source file is damaged or not what its writer writes; the message names
        the file (and the record).
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
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> [done] = convert(source_root, tempfile.mkdtemp(), max_transitions=100, progress=False)
    >>> done.game, done.transitions, done.url.endswith("Pong/1.zarr")
    ('Pong', 100, True)
    """
    # memory:// lives in this process: its workers are threads of it, never processes
    scheduler = scheduler_for(scheduler, workers, [str(source), str(dest)])
    if fraction is not None:
        if subset is not None:
            raise InvalidArgumentError(
                f"fraction={fraction!r} and subset={subset!r} choose two subsets of {source}; "
                f"pass one"
            )
        subset = Subset.fraction_of(fraction, where=str(source))
    options = ConvertOptions(
        selection=Selection(checkpoints, max_transitions, max_episodes, subset),
        overwrite=overwrite,
        progress=progress,
        storage_options=dict(storage_options or {}),
        scheduler=scheduler,
        workers=workers,
        full_action_space=full_action_space,
        return_to_go=return_to_go,
        timeout=resolve_timeout(timeout),
        keep_frames=keep_frames,
        command=command,
    )
    src_options = storage_options if source_storage_options is None else source_storage_options
    names = list(games or []) or None
    kind = (
        get_kind(source_kind)
        if source_kind
        else detect_kind(source, src_options, names, timeout=options.timeout)
    )
    sources = (
        list(listed)
        if listed is not None
        else kind.find_runs(
            source,
            list(games or []) or None,
            list(runs or []) or None,
            src_options,
            timeout=options.timeout,
        )
    )
    with process_pool(scheduler, workers):  # one pool of workers for every run and pass
        return [convert_run(src, dest, options, kind=kind) for src in sources]
