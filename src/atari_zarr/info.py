"""Summaries of stores: what ``atari-zarr info`` and ``atari-zarr ls`` print.

The list of stores itself comes from the one catalog,
:func:`atari_zarr.catalog.list_stores`; this module renders it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atari_zarr.arguments import spans
from atari_zarr.catalog import StoreRow, size_text
from atari_zarr.episodes import checkpoint_summary, episode_table
from atari_zarr.layout import (
    ARRAYS,
    FLUSHED_KEY,
    OPTIONAL_ARRAYS,
    get_array,
    is_complete,
)
from atari_zarr.opening import open_store
from atari_zarr.sources.registry import kind_of
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs

__all__ = ["format_info", "format_store_list", "store_info"]


def store_info(
    url: str, storage_options: dict[str, Any] | None = None, *, timeout: Timeout = "default"
) -> dict[str, Any]:
    """Facts about one store: size, compression, counts, returns, source.

    ``checkpoints`` lists the parts converted: DQN Replay checkpoint suffixes, or
    RL Unplugged shard indices. For RL Unplugged stores, ``source_shards`` says
    how many shards the run has and which are missing, and
    ``return_disagreements`` lists, one line per column, the source returns that
    differ from the sum of their step rewards (a property of the source, which
    the store copies faithfully).

    Parameters
    ----------
    url : str
        Path or fsspec URL of a store.
    storage_options : dict, optional
        fsspec options.
    timeout : float, None or "default"
        Seconds each call to storage may take, retries included (default 60).

    Examples
    --------
    >>> # store_url: a store written by `atari-zarr convert` (300 transitions of Pong)
    >>> info = store_info(store_url)
    >>> info["game"], info["transitions"], info["complete"], info["stored_bytes"] > 0
    ('Pong', 300, True, True)
    """
    group, meta = open_store(url, storage_options, timeout=timeout, require_complete=False)
    fs, path = get_fs(url, storage_options, timeout=timeout)
    stored = fs.du(path)
    n = int(get_array(group, next(iter(ARRAYS)), url).shape[0])
    present = [spec for spec in (*ARRAYS.values(), *OPTIONAL_ARRAYS.values()) if spec.name in group]
    raw = 0
    for spec in present:
        rows = int(get_array(group, spec.name, url).shape[0])
        raw += rows * int(np.prod(spec.row_shape, dtype=np.int64)) * spec.dtype.itemsize
    # An unfinished recording's table covers its flushed rows only: no row count to match.
    table = episode_table(meta)
    lengths = table.length if table is not None else np.zeros(0, dtype=np.int64)
    terminated = table.terminated if table is not None else np.zeros(0, dtype=bool)
    returns = np.zeros(0) if table is None or table.returns is None else table.returns
    conversion = meta.get("conversion", {})
    flushed = meta.get(FLUSHED_KEY) if not is_complete(meta) else None
    # stores written before kinds were recorded are DQN Replay stores; None for recordings
    kind = kind_of(meta)
    return {
        "url": url,
        "game": meta.get("game"),
        "run": meta.get("run"),
        "kind": meta.get("kind"),
        "complete": is_complete(meta),
        "format_version": meta.get("format_version"),
        "transitions": n,
        "episodes": len(lengths),
        "terminated_episodes": int(terminated.sum()),
        "stored_bytes": stored,
        "raw_bytes": int(raw),
        "compression_ratio": float(raw / stored) if stored else float("nan"),
        "return_mean": float(returns.mean()) if returns.size else None,
        "return_min": float(returns.min()) if returns.size else None,
        "return_max": float(returns.max()) if returns.size else None,
        "length_mean": float(lengths.mean()) if lengths.size else None,
        "length_min": int(lengths.min()) if lengths.size else None,
        "length_max": int(lengths.max()) if lengths.size else None,
        "return_median": float(np.median(returns)) if returns.size else None,
        "return_std": float(returns.std()) if returns.size else None,
        "episode_list": [
            {"length": int(n_), "return": float(r), "terminated": bool(t)}
            for n_, r, t in zip(lengths, returns, terminated, strict=False)
        ],
        "optional_arrays": [name for name in OPTIONAL_ARRAYS if name in group],
        "flushed": flushed,
        "env_id": (meta.get("env") or {}).get("env_id"),
        "checkpoints": kind.parts_converted(meta) if kind else [],
        "source_shards": kind.source_summary(meta) if kind else None,
        "gaps": conversion.get("gaps", []),
        "return_disagreements": kind.warnings(meta) if kind else [],
        "checkpoint_stats": checkpoint_summary(meta),
        "command": meta.get("command"),
    }


def _shard_gap(gap: dict[str, Any]) -> str:
    """One gap of an RL Unplugged store: its shards, and which were absent from the source.

    Examples
    --------
    >>> _shard_gap({"from_shard": 1, "to_shard": 4, "shards": 3, "absent": [2]})
    '1-3 (2 absent)'
    """
    shards = list(range(int(gap["from_shard"]), int(gap["to_shard"])))
    absent = [int(i) for i in gap.get("absent") or []]
    if absent == shards:
        note = "absent"
    elif absent:
        note = f"{spans(absent)} absent"
    else:
        note = "not selected"
    return f"{spans(shards)} ({note})"


def format_info(info: dict[str, Any], *, episodes: bool = False, checkpoints: bool = False) -> str:
    """Render :func:`store_info` as readable text.

    Parameters
    ----------
    info : dict
        From :func:`store_info`.
    episodes : bool
        Add one line per episode (length, return, how it ended).
    checkpoints : bool
        Add one line per source checkpoint (RL Unplugged: shard; a recording: one line):
        episodes, mean, median, min and max return, mean length (the learning curve).
    """
    status = "complete" if info["complete"] else "INCOMPLETE: " + str(info["command"])
    if info.get("flushed"):
        f = info["flushed"]
        status = (
            f"INCOMPLETE recording: {f['transitions']:,} transitions in "
            f"{f['episodes']:,} whole episodes flushed (readable with partial=True)"
        )
    lines = [
        f"store        {info['url']}",
        f"game/run     {info['game']}/{info['run']} "
        f"({info['kind']}, format v{info['format_version']})",
        f"status       {status}",
        f"transitions  {info['transitions']:,}",
        f"episodes     {info['episodes']:,} ({info['terminated_episodes']:,} terminated, "
        f"{info['episodes'] - info['terminated_episodes']:,} cut)",
        f"size         {size_text(info['stored_bytes'])} on storage, "
        f"{size_text(info['raw_bytes'])} raw ({info['compression_ratio']:.1f}x)",
    ]
    if info["return_mean"] is not None:
        lines.append(
            f"returns      mean {info['return_mean']:.2f}, min {info['return_min']:.2f}, "
            f"max {info['return_max']:.2f}, median {info['return_median']:.2f}, "
            f"std {info['return_std']:.2f}"
        )
        lines.append(
            f"lengths      mean {info['length_mean']:.1f}, min {info['length_min']:,}, "
            f"max {info['length_max']:,}"
        )
    if info.get("env_id"):
        lines.append(f"env          {info['env_id']}")
    if info.get("optional_arrays"):
        lines.append(f"optional     {', '.join(info['optional_arrays'])}")
    shards = info.get("source_shards")
    if shards:
        missing = shards.get("missing") or []
        lines.append(
            f"source       {shards.get('num_shards')} shards, "
            f"{len(shards.get('present') or [])} present"
            + (f", missing {spans(missing)}" if missing else "")
        )
    if info["checkpoints"]:
        ck = info["checkpoints"]
        if shards:
            lines.append(f"shards       {len(ck)} converted ({spans(ck)})")
        else:
            lines.append(f"checkpoints  {len(ck)} ({ck[0]}..{ck[-1]})")
    gaps = info["gaps"]
    if not gaps:
        lines.append("gaps         none")
    elif all("shards" in g for g in gaps):  # RL Unplugged: a gap is shards never read
        lines.append(
            f"gaps         {len(gaps)}: shards {'; '.join(_shard_gap(g) for g in gaps)} "
            f"not converted (their rows are unknown)"
        )
    else:
        lost = sum(int(g.get("rows", 0)) for g in gaps)
        lines.append(f"gaps         {len(gaps)} missed logs, {lost:,} source rows lost")
    for line in info.get("return_disagreements") or []:
        lines.append(f"WARNING      source returns: {line}")
    if checkpoints and info.get("checkpoint_stats"):
        noun = "shard" if info.get("source_shards") else "checkpoint"
        lines.append(
            f"{noun:>10}  episodes    mean  median     min     max  mean length  cut  fragments"
        )
        for row in info["checkpoint_stats"]:
            label = "all" if row["checkpoint"] is None else str(row["checkpoint"])
            stats = "  ".join(
                f"{row[k]:>6.1f}" if row[k] is not None else f"{'-':>6}"
                for k in ("return_mean", "return_median", "return_min", "return_max")
            )
            length = row["length_mean"]
            length_text = f"{length:>11.1f}" if length is not None else f"{'-':>11}"
            lines.append(
                f"{label:>10}  {row['episodes']:>8,}  {stats}  {length_text}  "
                f"{row.get('cut', 0):>3,}  {row.get('fragments', 0):>9,}"
            )
        lines.append(
            "            (returns and lengths of whole episodes played to their end; cut "
            "episodes and fragments are counted apart)"
        )
    if episodes and info.get("episode_list"):
        lines.append("episode      length     return  end")
        for i, ep in enumerate(info["episode_list"]):
            end = "terminated" if ep["terminated"] else "truncated"
            lines.append(f"{i:>7}  {ep['length']:>10,}  {ep['return']:>9.2f}  {end}")
    return "\n".join(lines)


def format_store_list(rows: Sequence[StoreRow]) -> str:
    """Render :func:`~atari_zarr.catalog.list_stores` as an aligned table.

    Examples
    --------
    >>> row = {"url": "s/Pong/1.zarr", "transitions": 1200, "episodes": 3,
    ...        "stored_bytes": 2500, "status": "complete"}
    >>> print(format_store_list([row]))
    STORE          TRANSITIONS  EPISODES    SIZE  STATUS
    s/Pong/1.zarr        1,200         3  2.5 KB  complete
    """
    if not rows:
        return "no stores found"
    header = ("STORE", "TRANSITIONS", "EPISODES", "SIZE", "STATUS")
    table = [header] + [
        (
            r["url"],
            "-" if r["transitions"] is None else f"{r['transitions']:,}",
            "-" if r["episodes"] is None else f"{r['episodes']:,}",
            size_text(r["stored_bytes"]),
            r["status"],
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i in (0, 4) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in table
    )
