"""RL Unplugged as a source kind: the hooks conversion and verification call.

The kind's other modules are its own; this one is what it shows the rest of the package,
:data:`KIND`, which :mod:`atari_zarr.sources.registry` lists (``docs/architecture.md``
says what each module of the kind does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from atari_zarr.layout import FINAL_OBSERVATION, UNCLIPPED_REWARD
from atari_zarr.sources.kind import (
    FrameSink,
    KeptFrames,
    Part,
    Plan,
    ScanArrays,
    SourceKind,
    Stream,
)
from atari_zarr.sources.rl_unplugged import files
from atari_zarr.sources.rl_unplugged.planner import (
    RluPlan,
    ShardPart,
    plan_shards,
    return_disagreements,
    scans_needed,
)
from atari_zarr.sources.rl_unplugged.rows import iter_shard_frames, shard_step_arrays
from atari_zarr.sources.rl_unplugged.scan import RECORD_FIELDS, ShardScan, scan_shard
from atari_zarr.sources.rl_unplugged.tfrecord import compressed_position
from atari_zarr.sources.roots import entries, game_dirs_to_detect
from atari_zarr.sources.selection import Selection, expand_presets, parse_checkpoints
from atari_zarr.subsets import CHECKPOINT_ROWS

__all__ = ["KIND", "RL_UNPLUGGED", "scan_limit"]

RL_UNPLUGGED = "rl-unplugged"


def _is_rlu(fs: Any, path: str, games: list[str] | None = None) -> bool:
    names = entries(fs, path)
    if any(files.is_shard_name(n) for n, is_dir in names if not is_dir):
        return True  # a game directory
    return any(files.holds_shards(fs, f"{path}/{g}") for g in game_dirs_to_detect(names, games))


def _rlu_select(run: files.RluRun, selection: Selection) -> list[int]:
    spec = expand_presets(selection.checkpoints, files.presets(run.num_shards))
    chosen = parse_checkpoints(spec, run.suffixes)
    return list(run.suffixes) if chosen is None else chosen


def _rlu_open(
    url: str, game: str, run: str, options: dict[str, Any], timeout: float | None
) -> files.RluRun:
    return files.RluRun(url, game, run, options, timeout=timeout)


def scan_limit(selection: Selection) -> int | None:
    """Real steps from the start of each shard that hold every row ``selection`` takes
    (None: the whole shard): a subset that takes a prefix of each checkpoint."""
    subset = selection.subset
    return None if subset is None else subset.prefix_rows(CHECKPOINT_ROWS)


def _rlu_scan(
    run: files.RluRun, index: int, selection: Selection, keep: FrameSink | None = None
) -> dict[str, np.ndarray]:
    """Pass 1 over shard ``index`` of ``run``, as far as ``selection`` needs, as arrays."""
    limit = scan_limit(selection)
    with run.open(index, prefix=limit is not None) as stream:
        scan = scan_shard(stream, run.where(index), index, limit=limit, keep=keep)
        read = compressed_position(stream)
    arrays = scan.to_arrays()
    # what was read of the file (progress in bytes; a prefix scan stops early)
    arrays["source_bytes"] = np.array(-1 if read is None else read, dtype=np.int64)
    return arrays


def _rlu_scans_needed(
    run: files.RluRun, selection: Selection, scans: Mapping[int, ScanArrays], batch: int
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
    run: files.RluRun,
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
    if progress is not None:  # planned from the scans at once
        progress(len(run.suffixes))
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
    run: files.RluRun, part: Part, scan: ScanArrays | None, kept: KeptFrames | None = None
) -> tuple[dict[str, np.ndarray], Stream]:
    if scan is None:  # pragma: no cover - conversion always passes the scan
        raise ValueError(f"shard {part.unit} needs its scan")
    spec: ShardPart = part.spec
    shard = ShardScan.from_arrays(scan)
    return shard_step_arrays(spec, shard), iter_shard_frames(run, spec, shard, kept=kept)


def _rlu_source(run: files.RluRun, selected: list[int]) -> dict[str, Any]:
    return {
        "url": run.url,
        "num_shards": run.num_shards,
        "shards_present": run.suffixes,
        "shards_missing": run.missing,
        "shards_selected": selected,
    }


def _rlu_parts(meta: Mapping[str, Any]) -> list[int]:
    return [s["shard"] for s in (meta.get("conversion") or {}).get("shards", [])]


def _rlu_summary(meta: Mapping[str, Any]) -> dict[str, Any]:
    source = meta.get("source") or {}
    return {
        "num_shards": source.get("num_shards"),
        "present": source.get("shards_present"),
        "missing": source.get("shards_missing"),
        "selected": source.get("shards_selected"),
    }


KIND = SourceKind(
    RL_UNPLUGGED,
    "{Game}/run_{r}-xxxxx-of-yyyyy GZIP TFRecord shards",
    detect=_is_rlu,
    find_runs=files.find_runs,
    open_run=_rlu_open,
    select=_rlu_select,
    plan=_rlu_plan,
    rows=_rlu_rows,
    source_attributes=_rlu_source,
    part_name="shard",
    parts_converted=_rlu_parts,
    source_summary=_rlu_summary,
    optional_arrays=(FINAL_OBSERVATION, UNCLIPPED_REWARD),
    warnings=return_disagreements,
    scan=_rlu_scan,
    scan_fields=(*RECORD_FIELDS, "index"),
    scans_needed=_rlu_scans_needed,
    part_file=files.shard_name,
    run_of_file=files.shard_run,
)
