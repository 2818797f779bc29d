"""Choosing part of a run: checkpoints, presets and transition/episode limits.

A :class:`Selection` says what to take from a run; :func:`build_plan` turns it and
the run into the plan of the store (the one function both ``convert`` and ``verify``
call, so a store is checked against exactly the plan it was written from).

The presets are d4rl-atari's: ``mixed`` is checkpoint 1 (early training), ``medium``
checkpoint 10, ``expert`` checkpoint 50 (the end of training), each one checkpoint of
1M transitions. Limits are applied to the plan
(:class:`~atari_zarr.sources.dqn_replay.planner.RunPlan`) before anything is written:
the plan is cut after the last row allowed, the episode that the cut falls into is
kept up to there and marked truncated, and checkpoints after the cut are not read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atari_zarr.errors import InvalidArgumentError, SourceNotFoundError
from atari_zarr.layout import REWARD, TERMINATED, TRUNCATED
from atari_zarr.sources.dqn_replay.files import RunSource
from atari_zarr.sources.dqn_replay.planner import RunPlan, lap_step_arrays, plan_run
from atari_zarr.subsets import Subset

__all__ = [
    "CHECKPOINT_PRESETS",
    "Selection",
    "build_plan",
    "expand_presets",
    "limit_plan",
    "parse_checkpoints",
]

log = logging.getLogger("atari_zarr")

#: d4rl-atari's dataset names -> checkpoint suffixes (its ``start_epoch..last_epoch``).
CHECKPOINT_PRESETS: dict[str, list[int]] = {"mixed": [1], "medium": [10], "expert": [50]}


def expand_presets(spec: str | Iterable[int] | None) -> str | Iterable[int] | None:
    """Replace preset names in a checkpoint selection by their suffixes.

    Parameters
    ----------
    spec : str, iterable of int or None
        A selection as :func:`parse_checkpoints` takes it, where comma-separated
        parts may also be ``mixed``, ``medium`` or ``expert``.

    Examples
    --------
    >>> expand_presets("expert")
    '50'
    >>> expand_presets("mixed,40-42")
    '1,40-42'
    >>> expand_presets([3, 4])
    [3, 4]
    """
    if not isinstance(spec, str) or spec.strip().lower() == "all":
        return spec
    parts: list[str] = []
    for part in spec.split(","):
        key = part.strip().lower()
        if key in CHECKPOINT_PRESETS:
            parts.extend(str(s) for s in CHECKPOINT_PRESETS[key])
        else:
            parts.append(part.strip())
    return ",".join(parts)


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

    Raises
    ------
    InvalidArgumentError
        A part of ``spec`` is neither a suffix nor a range.
    SourceNotFoundError
        A suffix asked for is not in ``available``.

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


def _check_limit(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if int(value) < 1:
        raise InvalidArgumentError(
            f"{name} must be a positive number, got {value}; pass at least 1, or no limit."
        )
    return int(value)


@dataclass(frozen=True)
class Selection:
    """What to take from a run: checkpoints, and at most how many transitions and episodes.

    Parameters
    ----------
    checkpoints : str, iterable of int or None
        As :func:`parse_checkpoints` takes it, presets included (``"expert"``,
        ``"0-9,50"``, ``[1, 2]``); None or ``"all"``: every checkpoint.
    max_transitions, max_episodes : int, optional
        Limits applied by :func:`limit_plan` (None: no limit).
    subset : Subset, optional
        A subset of the episodes those give (:mod:`atari_zarr.subsets`: d3rlpy's
        fraction, Decision Transformer sampling), applied after the limits.

    Raises
    ------
    InvalidArgumentError
        A limit is not a positive number.

    Examples
    --------
    >>> sel = Selection("medium", max_transitions=1000)
    >>> sel.suffixes(range(12))
    [10]
    >>> sel.attributes()
    {'checkpoints': 'medium', 'max_transitions': 1000, 'max_episodes': None}
    >>> Selection.from_attributes(sel.attributes()) == sel
    True
    """

    checkpoints: str | Iterable[int] | None = None
    max_transitions: int | None = None
    max_episodes: int | None = None
    #: Episodes chosen from what the checkpoints and limits give (None: all).
    subset: Subset | None = None

    def __post_init__(self) -> None:
        # Normalised so that a selection and its recorded attributes compare equal.
        spec: Any = self.checkpoints
        if spec is not None and not isinstance(spec, str):
            object.__setattr__(self, "checkpoints", tuple(int(s) for s in spec))
        for name in ("max_transitions", "max_episodes"):
            object.__setattr__(self, name, _check_limit(getattr(self, name), name))

    def suffixes(self, available: Sequence[int]) -> list[int] | None:
        """The checkpoints chosen among ``available`` (None: all of them)."""
        return parse_checkpoints(expand_presets(self.checkpoints), available)

    def attributes(self) -> dict[str, Any]:
        """The selection as recorded in a store's ``selection`` attribute."""
        spec = self.checkpoints
        out: dict[str, Any] = {
            "checkpoints": spec if spec is None or isinstance(spec, str) else list(spec),
            "max_transitions": self.max_transitions,
            "max_episodes": self.max_episodes,
        }
        if self.subset is not None:  # stores of whole runs record what they always did
            out["subset"] = self.subset.attributes()
        return out

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any]) -> Selection:
        """The selection a store recorded (:meth:`attributes`)."""
        return cls(
            attrs.get("checkpoints"),
            attrs.get("max_transitions"),
            attrs.get("max_episodes"),
            Subset.from_attributes(attrs.get("subset")),
        )


def build_plan(
    source: RunSource,
    selection: Selection | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> RunPlan:
    """The plan of the store of ``selection`` from ``source``: what ``convert`` writes.

    Parameters
    ----------
    source : RunSource
        The run.
    selection : Selection, optional
        What to take (default: everything).
    progress : callable, optional
        Called with 1 after each checkpoint is planned.

    Returns
    -------
    RunPlan

    Examples
    --------
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> src = RunSource(f"{source_root}/Pong/1", "Pong", "1")
    >>> build_plan(src, Selection("1-2", max_episodes=3)).n_rows
    63
    """
    selection = selection or Selection()
    plan = plan_run(source, selection.suffixes(source.suffixes), progress=progress)
    return limit_plan(
        plan,
        source,
        max_transitions=selection.max_transitions,
        max_episodes=selection.max_episodes,
    )


def limit_plan(
    plan: RunPlan,
    source: RunSource,
    *,
    max_transitions: int | None = None,
    max_episodes: int | None = None,
) -> RunPlan:
    """Cut ``plan`` to at most ``max_transitions`` rows and ``max_episodes`` episodes.

    The first ``max_episodes`` episodes are kept whole; ``max_transitions`` cuts
    the episode it falls into, which ends there as truncated. Whichever limit
    comes first applies.

    Parameters
    ----------
    plan : RunPlan
        From :func:`atari_zarr.sources.dqn_replay.planner.plan_run`; changed in place and returned.
    source : RunSource
        The run (the checkpoint of a cut falling inside an episode is re-read for
        the partial episode's return).
    max_transitions, max_episodes : int, optional
        Limits (None: no limit).

    Returns
    -------
    RunPlan

    Examples
    --------
    >>> from atari_zarr.sources.dqn_replay.planner import plan_run
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> src = RunSource(f"{source_root}/Pong/1", "Pong", "1")
    >>> plan = limit_plan(plan_run(src), src, max_transitions=100)
    >>> plan.n_rows, plan.episodes.transitions
    (100, 100)
    """
    max_transitions = _check_limit(max_transitions, "max_transitions")
    max_episodes = _check_limit(max_episodes, "max_episodes")
    table = plan.episodes.table()
    ends = table.ends + 1  # row after the last of each episode
    limit = plan.n_rows
    if max_episodes is not None and max_episodes < len(table):
        limit = int(ends[max_episodes - 1])
    if max_transitions is not None:
        limit = min(limit, max_transitions)
    if limit >= plan.n_rows:
        return plan

    # The episode the cut falls into, and whether the cut is at its end.
    ep = int(np.searchsorted(ends, limit, side="left"))
    at_end = int(ends[ep]) == limit
    ep_start = int(table.starts[ep])
    # The lap holding the last kept row.
    k = next(
        i for i, lap in enumerate(plan.laps) if lap.out_start + lap.n_out >= limit and lap.n_out > 0
    )
    lap = plan.laps[k]
    keep_in_lap = limit - lap.out_start
    kept_pos = np.flatnonzero(lap.kept_mask())  # offsets from first_pos
    stop = lap.first_pos + int(kept_pos[keep_in_lap - 1]) + 1
    # Episodes after the cut go; the one it falls inside is accounted again, up to the cut.
    if at_end:
        plan.episodes.keep(ep + 1)
    else:
        plan.episodes.keep(ep)
        _feed_rows(plan, source, ep_start, limit)
        plan.episodes.cut()
    del plan.first_steps[ep + 1 :]  # the episode cut keeps its first step
    lap.truncate_last = not plan.episodes.terminated[ep]
    dropped = plan.n_rows - limit
    lap.padding = lap.padding[lap.padding < stop - lap.first_pos]
    lap.stop_pos = stop
    lap.n_out = keep_in_lap
    last_source_row = lap.first_row + stop - 1
    plan.laps = plan.laps[: k + 1]
    plan.n_rows = limit
    plan.gaps = [g for g in plan.gaps if g["to_row"] <= last_source_row]
    plan.dropped["over_limit"] = plan.dropped.get("over_limit", 0) + dropped
    log.info("limits keep %d transitions, %d episodes (%d left out)", limit, ep + 1, dropped)
    return plan


def _feed_rows(plan: RunPlan, source: RunSource, lo: int, hi: int) -> None:
    """Feed output rows ``lo .. hi - 1`` to the plan's episodes (re-reads their laps)."""
    for lap in plan.laps:
        a, b = max(lo, lap.out_start), min(hi, lap.out_start + lap.n_out)
        if a < b:
            steps = lap_step_arrays(lap, source.read_small(lap.suffix))
            rows = slice(a - lap.out_start, b - lap.out_start)
            plan.episodes.feed(steps[REWARD][rows], steps[TERMINATED][rows], steps[TRUNCATED][rows])
