"""DQN Replay as a source kind: the hooks conversion and verification call.

The kind's other modules are its own; this one is what it shows the rest of the package,
:data:`KIND`, which :mod:`atari_zarr.sources.registry` lists (``docs/architecture.md``
says what each module of the kind does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from atari_zarr.episodes import FIRST_STEP
from atari_zarr.layout import OBSERVATION
from atari_zarr.sources.dqn_replay import files
from atari_zarr.sources.dqn_replay.planner import RunPlan, lap_destinations, lap_step_arrays
from atari_zarr.sources.dqn_replay.selection import build_plan
from atari_zarr.sources.kind import KeptFrames, Part, Plan, ScanArrays, SourceKind, Stream
from atari_zarr.sources.roots import entries, game_dirs_to_detect
from atari_zarr.sources.selection import Selection

__all__ = ["DQN_REPLAY", "KIND"]

DQN_REPLAY = "dqn-replay"


def _is_dqn(fs: Any, path: str, games: list[str] | None = None) -> bool:
    names = entries(fs, path)
    if any(n == files.LOGS_DIR for n, _ in names):
        return True  # a run directory
    for game in game_dirs_to_detect(names, games):
        runs = [r for r, is_dir in entries(fs, f"{path}/{game}") if is_dir]
        if runs and fs.exists(f"{path}/{game}/{runs[0]}/{files.LOGS_DIR}"):
            return True  # one run per game tells the layout
    return False


def _dqn_select(run: Any, selection: Selection) -> list[int]:
    return selection.suffixes(run.suffixes) or list(run.suffixes)


def _dqn_open(
    url: str, game: str, run: str, options: dict[str, Any], timeout: float | None
) -> files.RunSource:
    return files.RunSource(url, game, run, options, timeout=timeout)


def _dqn_plan(
    run: files.RunSource,
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
        episode_columns={**plan.episodes.as_attributes(), FIRST_STEP: list(plan.first_steps)},
        source_plan=plan,
    )


def _dqn_rows(
    run: files.RunSource, part: Part, scan: ScanArrays | None, kept: KeptFrames | None = None
) -> tuple[dict[str, np.ndarray], Stream]:
    lap = part.spec
    return lap_step_arrays(lap, run.read_small(lap.suffix)), _dqn_frames(run, lap)


def _dqn_frames(run: files.RunSource, lap: Any) -> Stream:
    # rows in buffer order: a rotation of the output order
    dest = lap_destinations(lap)
    for start, block in run.iter_observations(lap.suffix, lap.capacity):
        d = dest[start : start + len(block)]
        sel = np.flatnonzero(d >= 0)
        if sel.size:
            yield OBSERVATION, d[sel], block[sel]


def _dqn_source(run: files.RunSource, selected: list[int]) -> dict[str, Any]:
    return {"url": run.url, "checkpoints_selected": selected or run.suffixes}


def _dqn_parts(meta: Mapping[str, Any]) -> list[int]:
    return [c["suffix"] for c in (meta.get("conversion") or {}).get("checkpoints", [])]


KIND = SourceKind(
    DQN_REPLAY,
    "{Game}/{run}/replay_logs/ holding $store$_*_ckpt.N.gz files",
    detect=_is_dqn,
    find_runs=files.find_runs,
    open_run=_dqn_open,
    select=_dqn_select,
    plan=_dqn_plan,
    rows=_dqn_rows,
    source_attributes=_dqn_source,
    part_name="checkpoint",
    parts_converted=_dqn_parts,
    command_names_kind=False,
)
