"""Convert DQN Replay runs into atari_zarr stores.

The conversion of one run happens in two passes:

1. **Plan** (:func:`atari_zarr.stream.plan_run`): read the small per-step arrays of
   every checkpoint and decide, for each buffer row, whether it is a real new
   transition and which output row it becomes. This fixes the store's length.
2. **Write**: for each checkpoint, stream its observation file once and write
   every output unit (a shard of frames, a chunk of per-step data) that lies
   entirely within the checkpoint's output rows. Units that straddle two
   checkpoints are returned as pieces and written once all their pieces are in,
   so no unit is ever written by two writers.

The completion marker is written last (:func:`atari_zarr.layout.mark_complete`).
"""

from __future__ import annotations

import logging
import shlex
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from . import __version__
from .errors import (
    InvalidArgumentError,
    SourceNotFoundError,
    StoreExistsError,
    StoreFormatError,
)
from .layout import (
    ACTION,
    ARRAYS,
    ATTRS_KEY,
    EPISODE,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    create_store,
    mark_complete,
    store_path,
)
from .derived import write_derived
from .remote import get_fs, open_zarr_store
from .selection import expand_presets, limit_plan, selection_attrs, selection_flags
from .sources.dqn_replay import RunSource, find_runs
from .stream import Lap, RunPlan, lap_destinations, lap_step_arrays, plan_run

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


def parse_checkpoints(spec: str | Iterable[int] | None, available: Sequence[int]) -> list[int] | None:
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
    source: RunSource, group: zarr.Group, lap: Lap, n_rows: int
) -> list[_Piece]:
    """Write one checkpoint's transitions; return pieces of units it shares.

    Parameters
    ----------
    source : RunSource
        Where the checkpoint's files are.
    group : zarr.Group
        The open store.
    lap : Lap
        The planned part of this checkpoint.
    n_rows : int
        Length of the store.
    """
    if lap.n_out == 0:
        return []
    lo, hi = lap.out_start, lap.out_start + lap.n_out
    pieces: list[_Piece] = []

    def emit(name: str, unit: int, start: int, data: np.ndarray) -> None:
        rows = ARRAYS[name].write_rows
        u_lo, u_hi = _unit_bounds(unit, rows, n_rows)
        if start == u_lo and start + len(data) == u_hi:
            group[name][u_lo:u_hi] = data
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


class _Assembler:
    """Collects pieces of shared units and writes each unit once it is whole."""

    def __init__(self, group: zarr.Group, n_rows: int) -> None:
        self.group = group
        self.n_rows = n_rows
        self.pending: dict[tuple[str, int], list[_Piece]] = defaultdict(list)

    def add(self, pieces: Iterable[_Piece]) -> None:
        for piece in pieces:
            key = (piece.array, piece.unit)
            self.pending[key].append(piece)
            rows = ARRAYS[piece.array].write_rows
            u_lo, u_hi = _unit_bounds(piece.unit, rows, self.n_rows)
            if sum(len(p.data) for p in self.pending[key]) == u_hi - u_lo:
                spec = ARRAYS[piece.array]
                data = np.zeros((u_hi - u_lo, *spec.row_shape), dtype=spec.dtype)
                for p in self.pending.pop(key):
                    data[p.start - u_lo : p.start - u_lo + len(p.data)] = p.data
                self.group[piece.array][u_lo:u_hi] = data

    def check_done(self) -> None:
        if self.pending:  # pragma: no cover - the plan covers every row
            raise RuntimeError(f"units never completed: {sorted(self.pending)}")


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
    parts = ["atari-zarr", "convert", source.url, dest, "--games", source.game, "--runs", source.run]
    if source.url.rstrip("/").endswith(f"{source.game}/{source.run}"):
        parts = ["atari-zarr", "convert", source.url, dest]
    if checkpoints is not None:
        parts += ["--checkpoints", ",".join(map(str, checkpoints))]
    return " ".join(shlex.quote(p) for p in parts)


def _progress_bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="ckpt", leave=True)


def convert_run(
    source: RunSource,
    dest: str,
    *,
    checkpoints: str | Iterable[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
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
    if state == "incomplete":
        log.info("%s is an unfinished conversion; converting again from the start", url)

    bar = _progress_bar(len(source.suffixes), f"plan {source.game}/{source.run}", progress)
    try:
        plan: RunPlan = plan_run(source, selected, progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    plan = limit_plan(plan, source, max_transitions=max_transitions, max_episodes=max_episodes)

    attrs = {
        "kind": "dqn-replay",
        "game": source.game,
        "run": source.run,
        "source": {"url": source.url, "checkpoints_selected": selected or source.suffixes},
        "command": _command(source, str(dest), selected)
        + selection_flags(max_transitions, max_episodes, full_action_space, return_to_go),
        "selection": selection_attrs(checkpoints, max_transitions, max_episodes),
        "atari_zarr_version": __version__,
    }
    store = open_zarr_store(url, storage_options, read_only=False)
    group = create_store(store, plan.n_rows, attrs)
    assembler = _Assembler(group, plan.n_rows)
    bar = _progress_bar(len(plan.laps), f"write {source.game}/{source.run}", progress)
    try:
        for lap in plan.laps:
            assembler.add(write_lap(source, group, lap, plan.n_rows))
            if bar:
                bar.update(1)
    finally:
        if bar:
            bar.close()
    assembler.check_done()
    derived = write_derived(
        group, game=source.game, where=url, action_full=full_action_space,
        return_to_go=return_to_go,
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
        Replace complete stores that already exist.
    progress : bool
        Show tqdm progress bars.
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
            max_transitions=max_transitions,
            max_episodes=max_episodes,
            full_action_space=full_action_space,
            return_to_go=return_to_go,
        )
        for src in sources
    ]
