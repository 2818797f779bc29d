"""Summaries of stores: what ``atari-zarr info`` prints."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import zarr

from atari_zarr.errors import StoreFormatError
from atari_zarr.layout import ACTION, ARRAYS, ATTRS_KEY, FLUSHED_KEY, OPTIONAL_ARRAYS, read_metadata
from atari_zarr.storage.remote import get_fs, open_zarr_store

__all__ = ["format_info", "format_store_list", "list_stores", "open_store_group", "store_info"]


def open_store_group(url: str, storage_options: dict[str, Any] | None = None) -> zarr.Group:
    """Open the root group of a store read-only, with clear errors when it is not one.

    Raises
    ------
    FileNotFoundError
        Nothing exists at ``url``.
    StoreFormatError
        Something exists but it is not a Zarr group.

    Examples
    --------
    >>> import tempfile
    >>> open_store_group(tempfile.mkdtemp() + "/missing.zarr")
    Traceback (most recent call last):
        ...
    FileNotFoundError: .../missing.zarr does not exist: expected a store ...
    """
    fs, path = get_fs(url, storage_options)
    if not fs.exists(path):
        raise FileNotFoundError(
            f"{url} does not exist: expected a store written by `atari-zarr convert` "
            f"(e.g. DEST/Pong/1.zarr). Check the path, or list the stores under a "
            f"directory with `atari-zarr ls DEST`."
        )
    try:
        return zarr.open_group(open_zarr_store(url, storage_options, read_only=True), mode="r")
    except FileNotFoundError as exc:  # zarr's GroupNotFoundError: no zarr.json
        raise StoreFormatError(
            f"{url} exists but is not a Zarr store: expected a zarr.json written by "
            f"`atari-zarr convert`, found none. If it holds stores, list them with "
            f"`atari-zarr ls {url}`."
        ) from exc


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
    group = open_store_group(url, storage_options)
    meta = read_metadata(group, url, require_complete=False)
    fs, path = get_fs(url, storage_options)
    stored = int(fs.du(path, total=True))
    n = int(group[next(iter(ARRAYS))].shape[0])
    present = [spec for spec in (*ARRAYS.values(), *OPTIONAL_ARRAYS.values()) if spec.name in group]
    raw = sum(
        int(group[spec.name].shape[0])
        * int(np.prod(spec.row_shape, dtype=np.int64))
        * spec.dtype.itemsize
        for spec in present
    )
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
        "episodes": len(lengths),
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
        status = (
            f"INCOMPLETE recording: {f['transitions']:,} transitions in "
            f"{f['episodes']:,} whole episodes flushed (readable with partial=True)"
        )
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
        "gaps         none"
        if not gaps
        else f"gaps         {len(gaps)} missed logs, {sum(g['rows'] for g in gaps):,} source rows lost"
    )
    if episodes and info.get("episode_list"):
        lines.append("episode      length     return  end")
        for i, ep in enumerate(info["episode_list"]):
            end = "terminated" if ep["terminated"] else "truncated"
            lines.append(f"{i:>7}  {ep['length']:>10,}  {ep['return']:>9.2f}  {end}")
    return "\n".join(lines)


def _read_json(fs: Any, path: str) -> dict[str, Any] | None:
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def _find_stores(fs: Any, path: str, depth: int) -> list[str]:
    """``*.zarr`` directories at most ``depth`` levels below ``path``, not looking inside them.

    One listing per directory visited; stores themselves are never listed, which
    matters on object stores where a store holds thousands of objects.
    """
    if path.endswith(".zarr") or fs.exists(f"{path}/zarr.json"):
        return [path]
    found: list[str] = []
    level = [path]
    for _ in range(depth):
        below = []
        for directory in level:
            for entry in fs.ls(directory, detail=True):
                if entry.get("type") != "directory":
                    continue
                name = entry["name"].rstrip("/")
                (found if name.endswith(".zarr") else below).append(name)
        level = below
    return sorted(found)


def list_stores(
    root: str, storage_options: dict[str, Any] | None = None, *, sizes: bool = True
) -> list[dict[str, Any]]:
    """The stores under ``root`` (``{root}/{Game}/{run}.zarr``, at most 3 levels deep).

    Reads one ``zarr.json`` per store (two for an unfinished one) and, with
    ``sizes``, lists its objects to add up their size.

    Parameters
    ----------
    root : str
        Destination root of ``atari-zarr convert``, a game directory, or one store;
        local path or fsspec URL.
    storage_options : dict, optional
        fsspec options.
    sizes : bool
        Add ``stored_bytes`` (one listing per store).

    Returns
    -------
    list of dict
        One per ``*.zarr`` directory, sorted by URL: ``url``, ``game``, ``run``,
        ``status`` (``complete``, ``incomplete`` or ``not a store``),
        ``transitions``, ``episodes`` and ``stored_bytes`` (None when unknown).

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr import convert
    >>> from atari_zarr.testing import write_fixture_run
    >>> root, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = write_fixture_run(root, "Pong", "1", capacity=64, steps=300)
    >>> [store] = convert(root, dest, progress=False)
    >>> [(s["game"], s["run"], s["status"]) for s in list_stores(dest)]
    [('Pong', '1', 'complete')]
    """
    fs, path = get_fs(root, storage_options)
    path = path.rstrip("/")
    if not fs.exists(path):
        raise FileNotFoundError(
            f"{root} does not exist: expected a directory or URL holding "
            f"{{Game}}/{{run}}.zarr stores (the DEST of `atari-zarr convert`). Check the path."
        )
    found = _find_stores(fs, path, depth=3)

    def url_of(p: str) -> str:
        # spelled the way the user spelled ROOT (relative path, URL with protocol)
        return str(root).rstrip("/") + p[len(path) :]

    rows = []
    for p in found:
        row: dict[str, Any] = {
            "url": url_of(p),
            "game": p.rstrip("/").split("/")[-2] if "/" in p else None,
            "run": p.rstrip("/").split("/")[-1].removesuffix(".zarr"),
            "status": "not a store",
            "transitions": None,
            "episodes": None,
            "stored_bytes": None,
        }
        group_json = _read_json(fs, f"{p}/zarr.json")
        attrs = (group_json or {}).get("attributes", {}).get(ATTRS_KEY)
        if isinstance(attrs, dict) and "format_version" in attrs:
            row["game"] = attrs.get("game", row["game"])
            row["run"] = attrs.get("run", row["run"])
            counts = attrs.get("counts", {})
            if attrs.get("complete"):
                row["status"] = "complete"
                row["transitions"] = counts.get("transitions")
                row["episodes"] = counts.get("episodes")
            else:
                row["status"] = "incomplete"
                action_json = _read_json(fs, f"{p}/{ACTION}/zarr.json") or {}
                row["transitions"] = (action_json.get("shape") or [None])[0]
        if sizes:
            row["stored_bytes"] = int(fs.du(p, total=True))
        rows.append(row)
    return rows


def format_store_list(rows: list[dict[str, Any]]) -> str:
    """Render :func:`list_stores` as an aligned table.

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
            "-" if r["stored_bytes"] is None else _size(r["stored_bytes"]),
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
