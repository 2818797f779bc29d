"""Summaries of stores: what ``atari-zarr info`` prints."""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from .layout import ARRAYS, FLUSHED_KEY, OPTIONAL_ARRAYS, read_metadata
from .remote import get_fs, open_zarr_store

__all__ = ["format_info", "store_info"]


def store_info(url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Facts about one store: size, compression, counts, returns, source.

    Parameters
    ----------
    url : str
        Path or fsspec URL of a store.
    storage_options : dict, optional
        fsspec options.

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr import convert
    >>> from atari_zarr.testing import write_fixture_run
    >>> root, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = write_fixture_run(root, "Pong", "1", capacity=64, steps=300)
    >>> [store] = convert(root, dest, progress=False)
    >>> info = store_info(store.url)
    >>> info["transitions"] == store.transitions, info["stored_bytes"] > 0
    (True, True)
    """
    group = zarr.open_group(open_zarr_store(url, storage_options, read_only=True), mode="r")
    meta = read_metadata(group, url, require_complete=False)
    fs, path = get_fs(url, storage_options)
    stored = int(fs.du(path, total=True))
    n = int(group[next(iter(ARRAYS))].shape[0])
    present = [spec for spec in (*ARRAYS.values(), *OPTIONAL_ARRAYS.values()) if spec.name in group]
    raw = sum(int(group[spec.name].shape[0]) * int(np.prod(spec.row_shape, dtype=np.int64))
              * spec.dtype.itemsize for spec in present)
    episodes = meta.get("episodes", {})
    returns = np.asarray(episodes.get("return", []), dtype=np.float64)
    lengths = np.asarray(episodes.get("length", []), dtype=np.int64)
    conversion = meta.get("conversion", {})
    terminated = np.asarray(episodes.get("terminated", []), dtype=bool)
    flushed = meta.get(FLUSHED_KEY) if not meta.get("complete") else None
    return {
        "url": url,
        "game": meta.get("game"),
        "run": meta.get("run"),
        "kind": meta.get("kind"),
        "complete": bool(meta.get("complete")),
        "format_version": meta.get("format_version"),
        "transitions": n,
        "episodes": int(len(lengths)),
        "terminated_episodes": int(np.sum(episodes.get("terminated", []))),
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
        "checkpoints": [c["suffix"] for c in conversion.get("checkpoints", [])],
        "gaps": conversion.get("gaps", []),
        "command": meta.get("command"),
    }


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def format_info(info: dict[str, Any], *, episodes: bool = False) -> str:
    """Render :func:`store_info` as readable text.

    Parameters
    ----------
    info : dict
        From :func:`store_info`.
    episodes : bool
        Add one line per episode (length, return, how it ended).
    """
    status = "complete" if info["complete"] else "INCOMPLETE: " + str(info["command"])
    if info.get("flushed"):
        f = info["flushed"]
        status = (f"INCOMPLETE recording: {f['transitions']:,} transitions in "
                  f"{f['episodes']:,} whole episodes flushed (readable with partial=True)")
    lines = [
        f"store        {info['url']}",
        f"game/run     {info['game']}/{info['run']} ({info['kind']}, format v{info['format_version']})",
        f"status       {status}",
        f"transitions  {info['transitions']:,}",
        f"episodes     {info['episodes']:,} ({info['terminated_episodes']:,} terminated, "
        f"{info['episodes'] - info['terminated_episodes']:,} cut)",
        f"size         {_size(info['stored_bytes'])} on storage, {_size(info['raw_bytes'])} raw "
        f"({info['compression_ratio']:.1f}x)",
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
    if info["checkpoints"]:
        ck = info["checkpoints"]
        lines.append(f"checkpoints  {len(ck)} ({ck[0]}..{ck[-1]})")
    gaps = info["gaps"]
    lines.append(
        "gaps         none" if not gaps else
        f"gaps         {len(gaps)} missed logs, {sum(g['rows'] for g in gaps):,} source rows lost"
    )
    if episodes and info.get("episode_list"):
        lines.append("episode      length     return  end")
        for i, ep in enumerate(info["episode_list"]):
            end = "terminated" if ep["terminated"] else "truncated"
            lines.append(f"{i:>7}  {ep['length']:>10,}  {ep['return']:>9.2f}  {end}")
    return "\n".join(lines)
