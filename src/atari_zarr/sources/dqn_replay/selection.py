"""Choosing part of a DQN Replay run: :func:`build_plan` and its limits.

A :class:`~atari_zarr.sources.selection.Selection` says what to take from a run
(any kind's: checkpoints, presets, limits); :func:`build_plan` turns it and the run
into the plan of the store (the one function both ``convert`` and ``verify`` call, so
a store is checked against exactly the plan it was written from). Limits are applied
to the plan (:class:`~atari_zarr.sources.dqn_replay.planner.RunPlan`) before anything
is written: the plan is cut after the last row allowed, the episode that the cut falls
into is kept up to there and marked truncated, and checkpoints after the cut are not read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from atari_zarr.layout import REWARD, TERMINATED, TRUNCATED
from atari_zarr.sources.dqn_replay.files import RunSource
from atari_zarr.sources.dqn_replay.planner import RunPlan, lap_step_arrays, plan_run
from atari_zarr.sources.selection import Selection, check_limit

__all__ = ["build_plan", "limit_plan"]

log = logging.getLogger("atari_zarr")


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
    max_transitions = check_limit(max_transitions, "max_transitions")
    max_episodes = check_limit(max_episodes, "max_episodes")
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
