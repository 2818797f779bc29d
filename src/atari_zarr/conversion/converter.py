"""Convert DQN Replay runs into atari_zarr stores, as a Dask graph.

The conversion of one run happens in two passes:

1. **Plan** (:func:`atari_zarr.sources.dqn_replay.selection.build_plan`), in the
   calling process: read the small per-step arrays of every checkpoint and decide,
   for each buffer row, whether it is a real new transition and which output row it
   becomes. This fixes the store's length, so row ``i`` of every array is transition
   ``i``.
2. **Write**, as a Dask graph (:mod:`atari_zarr.conversion.graph`) that runs on any
   scheduler (:mod:`atari_zarr.conversion.scheduling`) and writes the same bytes
   whichever runs it.

Every task records a marker after its data (:mod:`atari_zarr.conversion.workdir`); a
conversion killed at any point and run again redoes only the work without a marker,
after checking that the plan is the same (``plan_digest`` attribute). The work area
also holds the lock that refuses a second, concurrent conversion of the same
store. The completion marker is written last (:func:`atari_zarr.layout.mark_complete`).

How to convert is one frozen :class:`ConvertOptions`, made once by :func:`convert`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import zarr

from atari_zarr._version import __version__
from atari_zarr.commands import command_line
from atari_zarr.conversion.derived import write_derived
from atari_zarr.conversion.graph import LAP_PREFIX, Job, build_graph, expected_keys
from atari_zarr.conversion.scheduling import check_scheduler, describe_scheduler, run_graph
from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.errors import StoreExistsError, StoreFormatError, StoreIncompleteError
from atari_zarr.layout import (
    ARRAYS,
    ATTRS_KEY,
    FORMAT_VERSION,
    create_store,
    mark_complete,
    store_path,
)
from atari_zarr.progress import progress_bar
from atari_zarr.sources.dqn_replay.files import RunSource, find_runs
from atari_zarr.sources.dqn_replay.planner import RunPlan
from atari_zarr.sources.dqn_replay.selection import Selection, build_plan
from atari_zarr.storage.catalog import store_state
from atari_zarr.storage.remote import open_zarr_store

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

    def derived(self) -> dict[str, bool]:
        """The optional arrays asked for (part of the plan's digest)."""
        return {"full_action_space": self.full_action_space, "return_to_go": self.return_to_go}


def _command(source: RunSource, dest: str, options: ConvertOptions) -> str:
    """The command that makes (or finishes) this store, recorded in its attributes."""
    is_run_dir = source.url.rstrip("/").endswith(f"{source.game}/{source.run}")
    spec = options.selection.checkpoints
    if spec is not None and not isinstance(spec, str):
        spec = ",".join(map(str, spec))
    return command_line(
        "convert",
        source.url,
        dest,
        games=None if is_run_dir else [source.game],
        runs=None if is_run_dir else [source.run],
        checkpoints=spec,  # as asked for (a preset stays a preset), like `selection`
        max_transitions=options.selection.max_transitions,
        max_episodes=options.selection.max_episodes,
        full_action_space=options.full_action_space,
        return_to_go=options.return_to_go,
    )


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


def convert_run(
    source: RunSource, dest: str, options: ConvertOptions | None = None
) -> ConvertedStore:
    """Convert one game/run into ``{dest}/{game}/{run}.zarr``.

    Parameters
    ----------
    source : RunSource
        The run.
    dest : str
        Destination root (path or fsspec URL).
    options : ConvertOptions, optional
        How (default: everything, with progress bars); see :func:`convert`.

    Returns
    -------
    ConvertedStore

    Examples
    --------
    >>> import tempfile
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> source = RunSource(f"{source_root}/Pong/1", "Pong", "1")
    >>> options = ConvertOptions(Selection(max_episodes=2), progress=False)
    >>> convert_run(source, tempfile.mkdtemp(), options).episodes
    2
    """
    options = options or ConvertOptions()
    url = store_path(dest, source.game, source.run)
    selected = options.selection.suffixes(source.suffixes)
    command = _command(source, str(dest), options)
    work = WorkDir(url, dict(options.storage_options))
    work.acquire(command)
    finished = False
    try:
        result = _convert_locked(source, url, work, selected, command, options)
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
    options: ConvertOptions,
) -> ConvertedStore:
    storage_options = dict(options.storage_options)
    state = store_state(url, storage_options)  # remote errors propagate, never 'foreign'
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

    label = f"{source.game}/{source.run}"
    bar = progress_bar(len(source.suffixes), f"plan {label}", unit="ckpt", enabled=options.progress)
    try:
        plan = build_plan(source, options.selection, progress=bar.update)
    finally:
        bar.close()
    digest = _plan_digest(source, selected, plan, options.derived())

    done: set[str] = set()
    fresh = state != "incomplete" or options.overwrite
    if not fresh:
        group = zarr.open_group(open_zarr_store(url, storage_options, read_only=False), mode="r+")
        found = group.attrs.get(ATTRS_KEY)
        meta = found if isinstance(found, dict) else {}
        if meta.get("plan_digest") != digest:
            raise StoreIncompleteError(
                f"{url} is an unfinished conversion of different input (other source, "
                f"checkpoints or converter version): expected the plan of `{command}`, found "
                f"the one of `{meta.get('command')}`. Run that command to finish it, or pass "
                f"--overwrite to start over."
            )
        shapes = {name: (plan.n_rows, *spec.row_shape) for name, spec in ARRAYS.items()}
        if any(
            name not in group or getattr(group[name], "shape", None) != shape
            for name, shape in shapes.items()
        ):
            fresh = True  # killed while creating the arrays: nothing was written yet
        elif work.plan_digest() == digest:
            done = work.done()
        else:  # markers lost: redo everything into the existing arrays
            work.reset(digest)
        if not fresh:
            log.info(
                "%s: resuming, %d of %d checkpoints already written",
                url,
                len([k for k in done if k.startswith(LAP_PREFIX)]),
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
            "selection": options.selection.attributes(),
            "plan_digest": digest,
            "atari_zarr_version": __version__,
        }
        create_store(open_zarr_store(url, storage_options, read_only=False), plan.n_rows, attrs)

    job = Job(
        source.url,
        source.game,
        source.run,
        dict(source.storage_options),
        url,
        storage_options,
        plan.n_rows,
    )
    tag = f"atari-zarr-{digest[:12]}-{uuid.uuid4().hex[:8]}-"
    graph = build_graph(job, plan, work, done, tag)
    n_laps = sum(1 for lap in plan.laps if lap.n_out)
    n_done = n_laps - sum(1 for k in graph if k.startswith(tag + LAP_PREFIX))
    log.info(
        "writing %s with %s: %d tasks",
        url,
        describe_scheduler(options.scheduler, options.workers),
        len(graph),
    )
    bar = progress_bar(
        n_laps, f"write {label}", unit="ckpt", enabled=options.progress, initial=n_done
    )

    def on_done(key: Any) -> None:
        if str(key).startswith(tag + LAP_PREFIX):
            bar.update(1)

    try:
        run_graph(
            graph,
            list(graph),
            scheduler=options.scheduler,
            workers=options.workers,
            on_done=on_done,
        )
    finally:
        bar.close()

    # Nothing is marked complete unless every marker is in.
    missing = expected_keys(plan, work) - work.done()
    if missing:  # pragma: no cover - a task returned without writing its marker
        raise RuntimeError(f"{url}: work never recorded as done: {sorted(missing)[:10]}")

    group = zarr.open_group(open_zarr_store(url, storage_options, read_only=False), mode="r+")
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
            "conversion": plan.attributes(),
            "counts": {"transitions": plan.n_rows, **plan.episodes.counts()},
            "episodes": plan.episodes.as_attributes(),
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
    InvalidArgumentError
        A limit is not positive, or the scheduler is unknown.
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
    check_scheduler(scheduler, workers)
    options = ConvertOptions(
        selection=Selection(checkpoints, max_transitions, max_episodes),
        overwrite=overwrite,
        progress=progress,
        storage_options=dict(storage_options or {}),
        scheduler=scheduler,
        workers=workers,
        full_action_space=full_action_space,
        return_to_go=return_to_go,
    )
    src_options = storage_options if source_storage_options is None else source_storage_options
    sources = find_runs(source, list(games or []) or None, list(runs or []) or None, src_options)
    return [convert_run(src, dest, options) for src in sources]
