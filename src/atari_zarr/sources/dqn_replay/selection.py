"""Choosing part of a run: checkpoint presets and transition/episode limits.

The presets are d4rl-atari's: ``mixed`` is checkpoint 1 (early training), ``medium``
checkpoint 10, ``expert`` checkpoint 50 (the end of training), each one checkpoint of
1M transitions. Limits are applied to a conversion plan (:class:`~atari_zarr.sources.dqn_replay.planner.RunPlan`)
before anything is written: the plan is cut after the last row allowed, the episode
that the cut falls into is kept up to there and marked truncated, and checkpoints after
the cut are not read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.sources.dqn_replay.files import RunSource
from atari_zarr.sources.dqn_replay.planner import RunPlan, lap_step_arrays

__all__ = [
    "CHECKPOINT_PRESETS",
    "expand_presets",
    "limit_plan",
    "selection_attrs",
    "selection_flags",
]

log = logging.getLogger("atari_zarr")

#: d4rl-atari's dataset names -> checkpoint suffixes (its ``start_epoch..last_epoch``).
CHECKPOINT_PRESETS: dict[str, list[int]] = {"mixed": [1], "medium": [10], "expert": [50]}


def expand_presets(spec: str | Iterable[int] | None) -> str | Iterable[int] | None:
    """Replace preset names in a checkpoint selection by their suffixes.

    Parameters
    ----------
    spec : str, iterable of int or None
        A selection as :func:`atari_zarr.conversion.converter.parse_checkpoints` takes it, where
        comma-separated parts may also be ``mixed``, ``medium`` or ``expert``.

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
    parts = []
    for part in spec.split(","):
        key = part.strip().lower()
        if key in CHECKPOINT_PRESETS:
            parts.extend(str(s) for s in CHECKPOINT_PRESETS[key])
        else:
            parts.append(part.strip())
    return ",".join(parts)


def _check_limit(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if int(value) < 1:
        raise InvalidArgumentError(f"{name} must be a positive number, got {value}")
    return int(value)


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
    >>> import tempfile
    >>> from atari_zarr.sources.dqn_replay.planner import plan_run
    >>> from atari_zarr.testing import write_fixture_run
    >>> root = tempfile.mkdtemp()
    >>> _ = write_fixture_run(root, "Pong", "1", capacity=64, steps=300)
    >>> src = RunSource(f"{root}/Pong/1", "Pong", "1")
    >>> plan = limit_plan(plan_run(src), src, max_transitions=100)
    >>> plan.n_rows, sum(plan.episode_length)
    (100, 100)
    """
    max_transitions = _check_limit(max_transitions, "max_transitions")
    max_episodes = _check_limit(max_episodes, "max_episodes")
    lengths = np.asarray(plan.episode_length, dtype=np.int64)
    ends = np.cumsum(lengths)  # row after the last of each episode
    limit = plan.n_rows
    if max_episodes is not None and max_episodes < len(lengths):
        limit = int(ends[max_episodes - 1])
    if max_transitions is not None:
        limit = min(limit, max_transitions)
    if limit >= plan.n_rows:
        return plan

    # The episode the cut falls into, and whether the cut is at its end.
    ep = int(np.searchsorted(ends, limit, side="left"))
    at_end = int(ends[ep]) == limit
    ep_start = int(ends[ep] - lengths[ep])
    # The lap holding the last kept row.
    k = next(
        i for i, lap in enumerate(plan.laps) if lap.out_start + lap.n_out >= limit and lap.n_out > 0
    )
    lap = plan.laps[k]
    keep_in_lap = limit - lap.out_start
    kept_pos = np.flatnonzero(lap.kept_mask())  # offsets from first_pos
    stop = lap.first_pos + int(kept_pos[keep_in_lap - 1]) + 1
    if not at_end or not plan.episode_terminated[ep]:
        if not at_end:
            plan.episode_return[ep] = _partial_return(plan, source, ep_start, limit)
        plan.episode_length[ep] = limit - ep_start
        plan.episode_terminated[ep] = False
        lap.truncate_last = True
    else:
        lap.truncate_last = False
    dropped = plan.n_rows - limit
    lap.padding = lap.padding[lap.padding < stop - lap.first_pos]
    lap.stop_pos = stop
    lap.n_out = keep_in_lap
    last_source_row = lap.first_row + stop - 1
    plan.laps = plan.laps[: k + 1]
    plan.n_rows = limit
    del plan.episode_length[ep + 1 :]
    del plan.episode_return[ep + 1 :]
    del plan.episode_terminated[ep + 1 :]
    plan.gaps = [g for g in plan.gaps if g["to_row"] <= last_source_row]
    plan.dropped["over_limit"] = plan.dropped.get("over_limit", 0) + dropped
    log.info("limits keep %d transitions, %d episodes (%d left out)", limit, ep + 1, dropped)
    return plan


def _partial_return(plan: RunPlan, source: RunSource, lo: int, hi: int) -> float:
    """Sum of the rewards of output rows ``lo .. hi - 1`` (re-reads their laps' small arrays)."""
    total = 0.0
    for lap in plan.laps:
        a, b = max(lo, lap.out_start), min(hi, lap.out_start + lap.n_out)
        if a < b:
            steps = lap_step_arrays(lap, source.read_small(lap.suffix))
            rewards = steps["reward"][a - lap.out_start : b - lap.out_start]
            total += float(rewards.astype(np.float64).sum())
    return total


def selection_attrs(
    checkpoints: Any, max_transitions: int | None, max_episodes: int | None
) -> dict[str, Any]:
    """What the user asked for, as recorded in the store's ``source.selection``."""
    return {
        "checkpoints": checkpoints if isinstance(checkpoints, str | None) else list(checkpoints),
        "max_transitions": max_transitions,
        "max_episodes": max_episodes,
    }


def selection_flags(
    max_transitions: int | None,
    max_episodes: int | None,
    full_action_space: bool,
    return_to_go: bool,
) -> str:
    """The ``convert`` flags that repeat these options (for the store's ``command``).

    Examples
    --------
    >>> selection_flags(1000, None, True, False)
    ' --max-transitions 1000 --full-action-space'
    """
    flags = ""
    if max_transitions:
        flags += f" --max-transitions {int(max_transitions)}"
    if max_episodes:
        flags += f" --max-episodes {int(max_episodes)}"
    if full_action_space:
        flags += " --full-action-space"
    if return_to_go:
        flags += " --return-to-go"
    return flags
