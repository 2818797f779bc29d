"""The one catalog of stores: what lies under a root, and the state of each store.

A destination root holds one store per run, ``{root}/{Game}/{run}.zarr``
(:func:`~atari_zarr.layout.store_path`). A location is in one of four states
(:data:`StoreState`), read from its root ``zarr.json`` alone:

``"complete"``
    Ours (the ``atari_zarr`` attributes) and marked complete: readable.
``"incomplete"``
    Ours, not marked complete: a conversion or recording that has not finished
    (run its command again to finish it). Never called damaged.
``"foreign"``
    Something that can be read and is not ours: a ``zarr.json`` without our
    attributes (or not JSON, or not a regular file of metadata's size: a FIFO or
    ``/dev/zero`` in its place is never read), or a directory of other things.
``"absent"``
    Nothing there (or an empty directory).

A location whose metadata cannot be read for a remote reason (a timeout, a
``5xx`` after retries, refused credentials) has no state: the
:class:`~atari_zarr.errors.RemoteAccessError` /
:class:`~atari_zarr.errors.RemoteTimeoutError` propagates, so that a network
blip is never taken for "not a store" (which would invite ``--overwrite``).
Every call goes through :func:`~atari_zarr.storage.filesystem.get_fs`, so it
honours the deadline, listings included.

:func:`list_stores` is what ``atari-zarr ls`` prints; :func:`complete_stores` is
what datasets offer (``MultiGameDataset.from_root``,
``AtariZarrExperienceReplay.available_datasets``): complete stores only.

A root may hold an index of its complete stores, ``catalog.json``
(:func:`write_catalog`, ``atari-zarr index ROOT``, ``convert --index``). When it is
there, :func:`list_stores` reads it with one request instead of listing the prefix
and opening every store (over https, where nothing can be listed, it is the only way
to list a root). Each entry records the store's :func:`content_id`; a reader that
opens a store whose content is no longer the one indexed warns and names
``atari-zarr index`` (:func:`check_entry`). Writers that finish at the same
time do not lose each other's entries: each rebuilds the catalog from the stores
and lists them again after writing, until what it wrote is what is there.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from atari_zarr.errors import InvalidArgumentError, StoreFormatError, StoreNotFoundError
from atari_zarr.layout import ACTION, ATTRS_KEY, WORK_SUFFIX, is_complete, store_path
from atari_zarr.redaction import redact_tree
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import FileSystem, get_fs
from atari_zarr.storage.paths import is_url, redact

__all__ = [
    "CATALOG",
    "CatalogEntry",
    "StoreRow",
    "StoreState",
    "build_catalog",
    "catalog_entries",
    "check_entry",
    "check_names",
    "check_root",
    "complete_store_entries",
    "complete_stores",
    "content_id",
    "find_store",
    "list_stores",
    "name_to_url",
    "object_problems",
    "read_catalog",
    "refresh_catalog",
    "size_text",
    "store_objects",
    "store_state",
    "write_catalog",
]

log = logging.getLogger("atari_zarr")

#: The index of a root's complete stores, at the root.
CATALOG = "catalog.json"
#: Version of the catalog's layout.
CATALOG_FORMAT = 1
#: Rounds of write-then-list a catalog writer makes before it gives up converging.
_CATALOG_ROUNDS = 6

#: The state of a location (see the module docstring).
StoreState = Literal["absent", "complete", "incomplete", "foreign"]

_ROOT_META = "zarr.json"
_SUFFIX = ".zarr"
# what `atari-zarr ls` prints for each state of a *.zarr directory
_ROW_STATUS: dict[str, str] = {
    "complete": "complete",
    "incomplete": "incomplete",
    "foreign": "not a store",
    "absent": "not a store",
}


class CatalogEntry(TypedDict):
    """One complete store in a root's ``catalog.json``."""

    #: Relative to the root: ``"Pong/1.zarr"``.
    path: str
    game: str | None
    run: str
    kind: str | None
    transitions: int | None
    episodes: int | None
    stored_bytes: int | None
    return_mean: float | None
    return_min: float | None
    return_max: float | None
    #: :func:`content_id` of the store when it was indexed.
    content: str


class StoreRow(TypedDict):
    """One store found by :func:`list_stores` (a row of ``atari-zarr ls``)."""

    url: str
    game: str | None
    run: str
    status: str
    transitions: int | None
    episodes: int | None
    stored_bytes: int | None


def size_text(n: float | None) -> str:
    """A store's ``stored_bytes`` as people read it (``"-"`` when unknown).

    Examples
    --------
    >>> size_text(950), size_text(2_500), size_text(None)
    ('950 B', '2.5 KB', '-')
    """
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _our_attrs(raw: bytes) -> dict[str, Any] | None:
    """The ``atari_zarr`` attributes of a root ``zarr.json``, or None if it is not ours."""
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    attrs = meta.get("attributes", {}) if isinstance(meta, dict) else None
    ours = attrs.get(ATTRS_KEY) if isinstance(attrs, dict) else None
    if isinstance(ours, dict) and "format_version" in ours:
        return ours
    return None


def _inspect(fs: FileSystem, path: str, *, look_inside: bool) -> tuple[StoreState, Any]:
    """``(state, attributes)`` of the location ``path``; remote errors propagate."""
    try:
        raw = fs.cat_metadata(f"{path}/{_ROOT_META}")  # no FIFO, no /dev/zero
    except StoreFormatError:
        return "foreign", None  # a link, a special file or a huge file: not a store of ours
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        if not look_inside:
            return "absent", None
        try:
            entries = fs.ls(path)
        except (FileNotFoundError, NotADirectoryError):
            return "absent", None
        return ("foreign" if entries else "absent"), None
    attrs = _our_attrs(raw)
    if attrs is None:
        return "foreign", None
    return ("complete" if is_complete(attrs) else "incomplete"), attrs


def store_state(
    url: str, storage_options: dict[str, Any] | None = None, *, timeout: Timeout = "default"
) -> StoreState:
    """The state of the location ``url``: absent, complete, incomplete or foreign.

    One read of the root ``zarr.json`` (plus one listing when there is none).

    Raises
    ------
    RemoteAccessError, RemoteTimeoutError
        The metadata could not be read for a remote reason: the state is unknown.

    Examples
    --------
    >>> import tempfile
    >>> store_state(store_url), store_state(tempfile.mkdtemp() + "/Pong/1.zarr")
    ('complete', 'absent')
    """
    fs, path = get_fs(url, storage_options, timeout=timeout)
    state, _ = _inspect(fs, path.rstrip("/"), look_inside=True)
    return state


def _find_stores(fs: FileSystem, path: str, depth: int, root: str) -> tuple[list[str], list[str]]:
    """``*.zarr`` directories at most ``depth`` levels below ``path``, not looking inside
    them, and the folders below ``path`` skipped because they cannot be read
    (``/proc/1``, another user's folder: the caller warns, :func:`_warn_unreadable`).

    One listing per directory visited; stores themselves are never listed, which
    matters on object stores where a store holds thousands of objects. ``path`` itself
    unreadable is one line (``root``, as the user spelled it, names it).

    Raises
    ------
    InvalidArgumentError
        ``path`` itself cannot be listed for want of permission.
    """
    if path.endswith(_SUFFIX) or fs.exists(f"{path}/{_ROOT_META}"):
        return [path], []
    found: list[str] = []
    unreadable: list[str] = []
    level = [path]
    for _ in range(depth):
        below: list[str] = []
        for directory in level:
            try:
                listed = fs.ls(directory, detail=True)
            except PermissionError as exc:
                if directory == path:
                    raise _unreadable_root_error(root, exc) from None
                unreadable.append(directory)
                continue
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone since its parent was listed (a process's folder in /proc)
            for entry in listed:
                if entry.get("type") != "directory":
                    continue
                name = str(entry["name"]).rstrip("/")
                if name.endswith(_SUFFIX + WORK_SUFFIX):
                    continue  # a conversion's work area: never a store, never descended
                (found if name.endswith(_SUFFIX) else below).append(name)
        level = below
    return sorted(found), unreadable


def _unreadable_root_error(root: str, exc: OSError) -> InvalidArgumentError:
    """The one-line error of a ROOT this user may not list.

    Examples
    --------
    >>> str(_unreadable_root_error("/root", PermissionError(13, "Permission denied")))[:52]
    '/root cannot be listed (Permission denied): expected'
    """
    reason = exc.strerror or str(exc)
    return InvalidArgumentError(
        f"{redact(root)} cannot be listed ({reason}): expected a directory of "
        f"{{Game}}/{{run}}.zarr stores this user may read. Give such a ROOT, or fix its "
        f"permissions."
    )


def _warn_unreadable(root: str, paths: Sequence[str]) -> None:
    """One warning naming the folders under ``root`` skipped because they cannot be read
    (the first three, and how many more)."""
    if not paths:
        return
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    folders = "folder" if len(paths) == 1 else "folders"
    warnings.warn(
        f"skipped {len(paths)} {folders} under {redact(root)} that could not be read "
        f"(permission denied): {shown}. Run as a user who may read them, or give a ROOT "
        f"that holds only stores.",
        stacklevel=3,
    )


def list_stores(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    sizes: bool = True,
    timeout: Timeout = "default",
    use_catalog: bool = True,
) -> list[StoreRow]:
    """The stores under ``root`` (``{root}/{Game}/{run}.zarr``, and the subsets a pull
    keeps, ``{root}/subsets/{label}/{Game}/{run}.zarr``).

    With a ``catalog.json`` at a bucket's ``root`` (and ``use_catalog``), its complete
    stores, read with one request: what was indexed. Otherwise (and always for a local
    root, where listing is cheap and the stores are the truth) the root is listed: one
    ``zarr.json`` per store (two for an unfinished one) and, with ``sizes``, a listing of
    its objects to add up their size.

    Parameters
    ----------
    root : str
        Destination root of ``atari-zarr convert``, a game directory, or one store;
        local path or fsspec URL.
    storage_options : dict, optional
        fsspec options.
    sizes : bool
        Add ``stored_bytes`` (one listing per store).
    timeout : float, None or "default"
        Seconds each call to storage may take, retries included (default 60).
    use_catalog : bool
        Read the root's ``catalog.json`` when there is one (False: always list).

    Returns
    -------
    list of StoreRow
        One per ``*.zarr`` directory, sorted by URL: ``url``, ``game``, ``run``,
        ``status`` (``complete``, ``incomplete`` or ``not a store``),
        ``transitions``, ``episodes`` and ``stored_bytes`` (None when unknown).

    Raises
    ------
    StoreNotFoundError
        Nothing exists at ``root``.
    InvalidArgumentError
        ``root`` cannot be listed: http(s) without a catalog, or a folder this user may
        not read (a folder below it that cannot be read is skipped, with a warning).
    RemoteAccessError, RemoteTimeoutError
        A listing or a read failed for a remote reason.

    Examples
    --------
    >>> [(s["game"], s["run"], s["status"]) for s in list_stores(dest_root)]
    [('Pong', '1', 'complete')]
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    path = path.rstrip("/")
    doc = _read_catalog(fs, path, str(root)) if use_catalog else None
    if doc is not None and fs.remote:
        base = str(root).rstrip("/")
        return [
            {
                "url": f"{base}/{e['path']}",
                "game": e.get("game"),
                "run": str(e.get("run")),
                "status": "complete",
                "transitions": e.get("transitions"),
                "episodes": e.get("episodes"),
                "stored_bytes": e.get("stored_bytes") if sizes else None,
            }
            for e in doc["stores"]
        ]
    if fs.read_only:
        # plain http(s) has no listing; one store is still answered, from its zarr.json
        if not fs.exists(f"{path}/zarr.json"):
            raise InvalidArgumentError(
                f"{redact(str(root), storage_options)} cannot be listed: http(s):// has no "
                f"listing and the root has no {CATALOG}. Give one store's URL "
                f"(ROOT/Game/run.zarr), list the bucket through gs:// or s3:// "
                f"(anonymously, for a public bucket), or have its owner run "
                f"`atari-zarr index ROOT`"
            )
        return [_row(fs, path, str(root), sizes=False)]
    if not fs.exists(path):
        raise StoreNotFoundError(
            f"{root} does not exist: expected a directory or URL holding "
            f"{{Game}}/{{run}}.zarr stores (the DEST of `atari-zarr convert`). Check the path."
        )

    def url_of(p: str) -> str:
        # spelled the way the user spelled ROOT (relative path, URL with protocol)
        return str(root).rstrip("/") + p[len(path) :]

    rows: list[StoreRow] = []
    # listings as they are now: a conversion's work area is written and removed through
    # a file system of its own (no listing cache), which this one never hears of
    fs.invalidate_cache()
    found, unreadable = _find_stores(fs, path, depth=4, root=str(root))
    for p in found:
        try:
            rows.append(_row(fs, p, url_of(p), sizes=sizes))
        except PermissionError:
            unreadable.append(p)
    _warn_unreadable(str(root), unreadable)
    return rows


def _row(fs: FileSystem, p: str, url: str, *, sizes: bool) -> StoreRow:
    """The row of ``list_stores`` for the store (or ``*.zarr`` directory) at path ``p``."""
    parts = p.rstrip("/").split("/")
    row: StoreRow = {
        "url": url,
        "game": parts[-2] if len(parts) > 1 else None,
        "run": parts[-1].removesuffix(_SUFFIX),
        "status": "not a store",
        "transitions": None,
        "episodes": None,
        "stored_bytes": None,
    }
    state, attrs = _inspect(fs, p, look_inside=False)
    row["status"] = _ROW_STATUS[state]
    if attrs is not None:
        row["game"] = attrs.get("game", row["game"])
        row["run"] = attrs.get("run", row["run"])
        counts = attrs.get("counts", {})
        if state == "complete":
            row["transitions"] = counts.get("transitions")
            row["episodes"] = counts.get("episodes")
        else:
            try:
                action = json.loads(fs.cat_metadata(f"{p}/{ACTION}/{_ROOT_META}"))
            except (FileNotFoundError, ValueError):
                action = {}
            row["transitions"] = (action.get("shape") or [None])[0]
    if sizes:
        row["stored_bytes"] = fs.du(p)
    return row


def _natural(name: str) -> tuple[Any, ...]:
    # "Pong/10" after "Pong/2"
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def complete_stores(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: Timeout = "default",
    use_catalog: bool = True,
) -> list[str]:
    """The ``"Game/run"`` names of the complete stores ``{root}/{Game}/{run}.zarr``.

    Unfinished stores and directories that are not stores are left out: every
    name listed can be opened.

    Parameters
    ----------
    root : str
        Local directory or fsspec URL that ``atari-zarr convert`` wrote to.
    storage_options : dict, optional
        fsspec options for URLs.
    timeout : float, None or "default"
        Seconds each call to storage may take, retries included (default 60).

    Returns
    -------
    list of str
        Sorted by game, then run number.

    Raises
    ------
    StoreNotFoundError
        Nothing exists at ``root``.

    Examples
    --------
    >>> complete_stores(dest_root)
    ['Pong/1']
    """
    prefix = str(root).rstrip("/") + "/"
    names = []
    rows = list_stores(root, storage_options, sizes=False, timeout=timeout, use_catalog=use_catalog)
    for row in rows:
        relative = row["url"][len(prefix) :] if row["url"].startswith(prefix) else ""
        parts = relative.split("/")
        if row["status"] == "complete" and len(parts) == 2 and parts[1].endswith(_SUFFIX):
            names.append(f"{parts[0]}/{parts[1].removesuffix(_SUFFIX)}")
    return sorted(names, key=_natural)


def name_to_url(root: str, name: str) -> str:
    """Where the store of ``"Game/run"`` lives under ``root``.

    Examples
    --------
    >>> name_to_url("gs://bucket/atari", "Pong/5")
    'gs://bucket/atari/Pong/5.zarr'
    """
    game, _, run = str(name).partition("/")
    return store_path(str(root), game, run)


# -- the catalog -------------------------------------------------------------------------
def content_id(attrs: dict[str, Any]) -> str:
    """What identifies a store's content: a digest of its ``atari_zarr`` attributes
    (the plan, counts, episode table and completion marker change with any rewrite, and
    ``objects_digest`` with the crc32c the writer recorded of every object, so the id
    costs no read of the arrays; a frame shard's is its index's, so frames that encode
    to the very same sizes keep it). A store completed
    before ``objects_digest`` was recorded is identified by its other attributes.

    Examples
    --------
    >>> a, b = {"game": "Pong", "complete": True}, {"complete": True, "game": "Pong"}
    >>> content_id(a) == content_id(b), content_id(a) == content_id({**a, "complete": False})
    (True, False)
    """
    text = json.dumps(attrs, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _entry(
    fs: FileSystem, p: str, relative: str, attrs: dict[str, Any], sizes: bool
) -> CatalogEntry:
    from atari_zarr.episodes import episode_table

    table = episode_table(attrs)
    returns = None if table is None or table.returns is None or not len(table) else table.returns
    counts = attrs.get("counts", {})
    parts = relative.split("/")
    return {
        "path": relative,
        "game": attrs.get("game", parts[-2] if len(parts) > 1 else None),
        "run": str(attrs.get("run", parts[-1].removesuffix(_SUFFIX))),
        "kind": attrs.get("kind"),
        "transitions": counts.get("transitions"),
        "episodes": counts.get("episodes"),
        "stored_bytes": fs.du(p) if sizes else None,
        "return_mean": None if returns is None else float(returns.mean()),
        "return_min": None if returns is None else float(returns.min()),
        "return_max": None if returns is None else float(returns.max()),
        "content": content_id(attrs),
    }


def store_objects(fs: FileSystem, path: str) -> list[str]:
    """The files the metadata of the store at ``path`` names, relative to it: its root
    ``zarr.json``, each group's and array's, and every chunk (or shard) object of every
    array, as its chunk key encoding spells it. Nothing else belongs to the store.

    Raises
    ------
    StoreFormatError
        The root ``zarr.json`` holds no consolidated metadata of its groups and arrays.

    Examples
    --------
    >>> names = store_objects(get_fs(store_url)[0], store_url)
    >>> names[0], "observation/zarr.json" in names, "observation/c/0/0/0" in names
    ('zarr.json', True, True)
    """
    from zarr.core.metadata.v3 import ArrayV3Metadata

    raw = fs.cat_metadata(f"{path}/{_ROOT_META}")
    try:
        meta = json.loads(raw)
        nodes = meta["consolidated_metadata"]["metadata"]
        assert isinstance(nodes, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise StoreFormatError(
            f"{redact(path)}/{_ROOT_META} holds no consolidated metadata of the store's "
            f"groups and arrays, as `atari-zarr convert` writes it; convert the store again"
        ) from None
    out = [_ROOT_META]
    for name in sorted(nodes):
        node = nodes[name]
        out.append(f"{name}/{_ROOT_META}")
        if not isinstance(node, dict) or node.get("node_type") != "array":
            continue
        try:
            array = ArrayV3Metadata.from_dict(node)
            unit = array.chunk_grid.chunk_shape  # type: ignore[attr-defined]
            grid = [-(-n // c) for n, c in zip(array.shape, unit, strict=True)]
        except Exception as exc:  # whatever zarr makes of metadata that is not an array's
            raise StoreFormatError(
                f"{redact(path)}: array {name!r} has metadata zarr cannot read "
                f"({type(exc).__name__}); convert the store again"
            ) from None
        out += [f"{name}/{array.encode_chunk_key(c)}" for c in itertools.product(*map(range, grid))]
    return out


def object_problems(fs: FileSystem, path: str) -> list[str]:
    """What a cheap look finds wrong with the complete store at ``path``, one line each: a
    symbolic link inside it (a local store), or an object its metadata names that is not
    there. One listing of the store; no chunk is read (``atari-zarr verify`` reads them).

    Examples
    --------
    >>> object_problems(get_fs(store_url)[0], store_url)
    []
    """
    try:
        named = store_objects(fs, path)
    except StoreFormatError as exc:
        return [str(exc)]
    problems = []
    if not fs.remote:
        for top, dirs, files in os.walk(path):  # never follows a link
            for entry in sorted([*dirs, *files]):
                if os.path.islink(os.path.join(top, entry)):
                    where = os.path.relpath(os.path.join(top, entry), path)
                    problems.append(f"{where} is a symbolic link")
    found = {p[len(path) + 1 :] for p in fs.find(path)}
    missing = [k for k in named if k not in found]
    if missing:
        more = f" and {len(missing) - 1:,} more" if len(missing) > 1 else ""
        problems.append(f"{missing[0]}{more}, named by its metadata, is missing")
    return problems


def _complete_under(fs: FileSystem, path: str, *, sizes: bool) -> list[CatalogEntry]:
    """Entries of the complete stores under ``path``, found by listing (no catalog).

    A store with a link inside or an object missing (:func:`object_problems`) is left
    out, with a warning: what would open it reads another file, or zeros."""
    fs.invalidate_cache()  # listings as they are now, not as this process saw them
    out = []
    found, unreadable = _find_stores(fs, path, depth=3, root=fs.url(path))
    for p in found:
        try:
            state, attrs = _inspect(fs, p, look_inside=False)
            if state != "complete" or p == path:
                continue
            problems = object_problems(fs, p)
        except PermissionError:
            unreadable.append(p)
            continue
        if problems:
            shown = redact(p)
            warnings.warn(
                f"{shown} is left out: {problems[0]}"
                f"{f' ({len(problems) - 1} more problems)' if len(problems) > 1 else ''}; "
                f"expected a store as convert wrote it. Run `atari-zarr verify {shown}`, "
                f"then convert it again (--overwrite)",
                stacklevel=3,
            )
            continue
        out.append(_entry(fs, p, p[len(path) + 1 :], attrs, sizes))
    _warn_unreadable(fs.url(path), unreadable)
    return sorted(out, key=lambda e: _natural(e["path"]))


def build_catalog(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    sizes: bool = True,
    timeout: Timeout = "default",
) -> dict[str, Any]:
    """The catalog :func:`write_catalog` would write for ``root``, written nowhere (what
    ``publish`` uploads, leaving the local root as it was).

    Examples
    --------
    >>> [e["path"] for e in build_catalog(dest_root)["stores"]]
    ['Pong/1.zarr']
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    path = path.rstrip("/")
    if not fs.exists(path):
        raise StoreNotFoundError(
            f"{root} does not exist: expected the DEST of `atari-zarr convert`. Check the path."
        )
    check_root(root, storage_options, timeout=timeout)
    return {"format": CATALOG_FORMAT, "stores": _complete_under(fs, path, sizes=sizes)}


def read_catalog(
    root: str, storage_options: dict[str, Any] | None = None, *, timeout: Timeout = "default"
) -> dict[str, Any] | None:
    """The ``catalog.json`` of ``root`` (one request), or None when there is none or it
    cannot be used (then a warning says so, and readers list the root instead)."""
    fs, path = get_fs(root, storage_options, timeout=timeout)
    return _read_catalog(fs, path.rstrip("/"), str(root))


_ENTRY_PATH_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+\.zarr$")
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "game": (str, type(None)),
    "run": (str,),
    "kind": (str, type(None)),
    "transitions": (int, type(None)),
    "episodes": (int, type(None)),
    "stored_bytes": (int, type(None)),
    "return_mean": (int, float, type(None)),
    "return_min": (int, float, type(None)),
    "return_max": (int, float, type(None)),
    "content": (str,),
}


def _valid_entry(entry: Any) -> bool:
    """An entry as :func:`write_catalog` writes it: every field of its type, and a path
    ``{Game}/{run}.zarr`` that stays under the root (no ``..``, no absolute path)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        return False
    path = entry["path"]
    if not _ENTRY_PATH_RE.match(path) or ".." in path.split("/"):
        return False
    typed = all(
        name in entry
        and isinstance(entry[name], types)
        and not (isinstance(entry[name], bool) and bool not in types)
        for name, types in _ENTRY_TYPES.items()
    )
    # counts a store can hold: none negative, none beyond what an int64 row number holds
    return typed and all(
        entry[name] is None or 0 <= entry[name] < 2**62
        for name in ("transitions", "episodes", "stored_bytes")
    )


def _read_catalog(fs: FileSystem, path: str, root: str) -> dict[str, Any] | None:
    try:
        raw = fs.cat_metadata(f"{path}/{CATALOG}")  # no FIFO, no /dev/zero
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except PermissionError as exc:  # the root (or its catalog) this user may not read
        raise _unreadable_root_error(root, exc) from None
    except StoreFormatError:
        raw = b""  # a link, a special file or a huge file: not a catalog, the root is listed
    try:
        doc = json.loads(raw)
        stores = doc["stores"]
        usable = (
            doc.get("format") == CATALOG_FORMAT
            and isinstance(stores, list)
            and all(_valid_entry(e) for e in stores)
            and len({e["path"] for e in stores}) == len(stores)  # one entry per store
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        usable = False  # not JSON, JSON nested beyond reason, or not a catalog
    if not usable:
        warnings.warn(
            f"{redact(root)}/{CATALOG} is not a catalog this version reads (format "
            f"{CATALOG_FORMAT}, entries as `atari-zarr index` writes them); listing the root "
            f"instead. Run `atari-zarr index {redact(root)}` "
            f"to write it again.",
            stacklevel=3,
        )
        return None
    return dict(doc)


def _write_json(fs: FileSystem, target: str, doc: dict[str, Any]) -> None:
    # readers see the old catalog or the new one, never half of it (one PUT on a bucket)
    # what users publish: no credential in it, whatever the attributes held
    fs.write_whole(target, (json.dumps(redact_tree(doc), indent=1) + "\n").encode())


def _up(shown: str, levels: int) -> str:
    """The directory ``levels`` above ``shown``, as the user can pass it (a relative
    path stays relative: ``1.zarr`` two levels up is ``..``).

    Examples
    --------
    >>> _up("1.zarr", 2), _up(".", 1), _up("gdir/Pong", 1), _up("gs://b/a/Pong/1.zarr", 2)
    ('..', '..', 'gdir', 'gs://b/a')
    """
    if is_url(shown):
        return shown.rstrip("/").rsplit("/", levels)[0]
    return os.path.normpath(os.path.join(shown, *[".."] * levels))


def check_root(
    root: str, storage_options: dict[str, Any] | None = None, *, timeout: Timeout = "default"
) -> None:
    """Refuse ``root`` when it is a store, or a game directory of stores, not a root.

    What is written into a root (``catalog.json``, a card) would land inside a store
    or beside its runs, and a card's loading lines would name stores that are not
    there.

    Raises
    ------
    InvalidArgumentError
        ``root`` is a file, or holds a ``zarr.json`` (a store) or ``{run}.zarr``
        directories (a game directory); the message names the root to pass instead.
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    path = path.rstrip("/")
    shown = redact(str(root), storage_options)
    if not fs.remote and os.path.isfile(path):
        raise InvalidArgumentError(
            f"{shown} is a file, not a root of stores: expected the directory holding "
            f"{{Game}}/{{run}}.zarr (DEST of `atari-zarr convert`). Pass that directory."
        )
    if fs.exists(f"{path}/zarr.json"):
        raise InvalidArgumentError(
            f"{shown} is a store, not a root of stores: expected the directory holding "
            f"{{Game}}/{{run}}.zarr (DEST of `atari-zarr convert`). Pass "
            f"{_up(shown, 2)}, two levels up."
        )
    try:
        names = [str(n).rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(path, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return
    if any(n.endswith(_SUFFIX) for n in names):
        raise InvalidArgumentError(
            f"{shown} holds {{run}}.zarr stores directly (a game directory), not "
            f"{{Game}}/{{run}}.zarr: expected the root above it. Pass {_up(shown, 1)}"
        )


def write_catalog(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    sizes: bool = True,
    timeout: Timeout = "default",
) -> dict[str, Any]:
    """Write ``{root}/catalog.json``: one entry per complete store under ``root``.

    The catalog is rebuilt from the stores, not edited: after writing, the writer lists
    the stores again, and writes again until what it wrote is what is there. So
    converters that finish at the same time (``convert --index``) never lose each
    other's entries: the last to write has seen every store finished before it.

    Parameters
    ----------
    root : str
        The destination root of ``atari-zarr convert`` (local path or fsspec URL).
    storage_options : dict, optional
        fsspec options.
    sizes : bool
        Record each store's size (one listing per store).
    timeout : float, None or "default"
        Seconds each call to storage may take, retries included (default 60).

    Returns
    -------
    dict
        The catalog written: ``format`` and ``stores`` (:class:`CatalogEntry` each).

    Examples
    --------
    >>> doc = write_catalog(dest_root)
    >>> [(e["path"], e["transitions"]) for e in doc["stores"]]
    [('Pong/1.zarr', 300)]
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    path = path.rstrip("/")
    if fs.read_only:
        raise InvalidArgumentError(
            f"{redact(str(root), storage_options)}: cannot write {CATALOG} over http(s), "
            f"which is read-only. Index the root through gs://, s3:// or a local path."
        )
    if not fs.exists(path):
        raise StoreNotFoundError(
            f"{root} does not exist: expected the DEST of `atari-zarr convert`. Check the path."
        )
    check_root(root, storage_options, timeout=timeout)
    doc: dict[str, Any] = {}
    for _ in range(_CATALOG_ROUNDS):
        entries = _complete_under(fs, path, sizes=sizes)
        doc = {"format": CATALOG_FORMAT, "stores": entries}
        _write_json(fs, f"{path}/{CATALOG}", doc)
        now = _complete_under(fs, path, sizes=False)
        if [(e["path"], e["content"]) for e in now] == [(e["path"], e["content"]) for e in entries]:
            break
        log.info("%s: stores changed while indexing; indexing again", redact(str(root)))
    return doc


def refresh_catalog(
    root: str, storage_options: dict[str, Any] | None = None, *, timeout: Timeout = "default"
) -> bool:
    """Write ``{root}/catalog.json`` again if the root has one (after a store was added
    there, so the catalog never goes stale); True when it was rewritten.

    Examples
    --------
    >>> refresh_catalog(dest_root)  # no catalog there: nothing is written
    False
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    if not fs.exists(f"{path.rstrip('/')}/{CATALOG}"):
        return False
    write_catalog(root, storage_options, timeout=timeout)
    return True


def catalog_entries(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    sizes: bool = True,
    timeout: Timeout = "default",
) -> tuple[list[CatalogEntry], bool]:
    """The complete stores under ``root`` as catalog entries, and whether they came from
    its ``catalog.json`` (one request) rather than from listing the root (what
    :func:`write_catalog` would write)."""
    fs, path = get_fs(root, storage_options, timeout=timeout)
    path = path.rstrip("/")
    doc = _read_catalog(fs, path, str(root))
    if doc is not None:
        return list(doc["stores"]), True
    if fs.read_only or not fs.exists(path):
        list_stores(root, storage_options, timeout=timeout)  # its one-line error
    return _complete_under(fs, path, sizes=sizes), False


def _entry_name(entry: CatalogEntry) -> str | None:
    parts = entry["path"].split("/")
    if len(parts) == 2 and parts[1].endswith(_SUFFIX):
        return f"{parts[0]}/{parts[1].removesuffix(_SUFFIX)}"
    return None


def complete_store_entries(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: Timeout = "default",
    names: Sequence[str] | None = None,
) -> tuple[list[str], dict[str, CatalogEntry] | None]:
    """The ``"Game/run"`` names of the complete stores under ``root``, and their catalog
    entries when there is a ``catalog.json`` (None when there is none).

    The stores are the truth, the catalog their index: a local root is listed as well
    (it is cheap), and of a bucket's root the ``names`` asked that the catalog lacks
    are looked up; a complete store the catalog does not list is available (read from
    its own ``zarr.json``), and a listed one that is not there complete is not, with one
    warning that says to run ``atari-zarr index ROOT``.
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    doc = _read_catalog(fs, path.rstrip("/"), str(root))
    if doc is None:
        return complete_stores(root, storage_options, timeout=timeout, use_catalog=False), None
    entries = {n: e for e in doc["stores"] if (n := _entry_name(e)) is not None}
    if not fs.remote:
        found = complete_stores(root, storage_options, timeout=timeout, use_catalog=False)
    else:
        found = list(entries) + [
            n
            for n in dict.fromkeys(names or [])
            if n not in entries
            and store_state(name_to_url(root, n), storage_options, timeout=timeout) == "complete"
        ]
    stale = [n for n in entries if n not in found]
    unlisted = [n for n in found if n not in entries]
    if stale or unlisted:
        said = [f"does not list {unlisted}, complete stores read from their own zarr.json"]
        if stale:
            said.append(f"lists {stale}, which are not there complete and are left out")
        warnings.warn(
            f"{redact(str(root)).rstrip('/')}/{CATALOG} {'; it '.join(said)}. Run "
            f"`atari-zarr index {redact(str(root))}` to write it again.",
            stacklevel=3,
        )
    return sorted(found, key=_natural), {n: e for n, e in entries.items() if n in found}


def find_store(
    root: str,
    name: str,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: Timeout = "default",
) -> tuple[str, CatalogEntry | None] | None:
    """Where the complete store ``"Game/run"`` lies under ``root``, without listing it.

    The store's own ``zarr.json`` says whether it is there complete (a catalog may be
    older than the store); the root's ``catalog.json``, when there is one, gives the
    store's entry, for :func:`check_entry`. None when the store is not there complete.

    Examples
    --------
    >>> # dest_root: a root holding the converted fixture store Pong/1
    >>> url, entry = find_store(dest_root, "Pong/1")
    >>> url.endswith("Pong/1.zarr"), entry is None
    (True, True)
    >>> find_store(dest_root, "Pong/2") is None
    True
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    url = name_to_url(root, name)
    doc = _read_catalog(fs, path.rstrip("/"), str(root))
    entries = {} if doc is None else {n: e for e in doc["stores"] if (n := _entry_name(e))}
    # the store's own zarr.json says whether it is there complete, never the catalog: a
    # store deleted, or started over by `pull --force`, since the catalog was written
    if store_state(url, storage_options, timeout=timeout) == "complete":
        return url, entries.get(name)
    return None


def check_entry(entry: CatalogEntry, attrs: dict[str, Any], url: str) -> bool:
    """Warn when the store opened at ``url`` is no longer the one the catalog indexed.

    The data read is the store's own, never the catalog's; the warning names the
    store and says how to refresh the catalog. True when the entry still holds.
    """
    if content_id(attrs) == entry.get("content"):
        return True
    warnings.warn(
        f"{redact(url)} changed since its root's {CATALOG} was written (its entry says "
        f"{entry.get('transitions')} transitions, content {entry.get('content')}); the "
        f"store itself is read. Run `atari-zarr index ROOT` again to refresh the catalog.",
        stacklevel=2,
    )
    return False


def check_names(
    root: str,
    names: Sequence[str],
    available: Sequence[str],
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Refuse ``"Game/run"`` names with no complete store under ``root``, in one line that
    lists what is there and says which of them are unfinished."""
    missing = [n for n in names if n not in available]
    if not missing:
        return
    unfinished = [
        n for n in missing if store_state(name_to_url(root, n), storage_options) == "incomplete"
    ]
    hint = (
        f" {unfinished} are unfinished: run the command that started each again to "
        f"finish it (`atari-zarr info STORE` shows it)."
        if unfinished
        else ""
    )
    raise StoreFormatError(
        f"{root} holds no store for {missing}: expected complete "
        f"{{root}}/{{Game}}/{{run}}.zarr stores; available: {list(available)}.{hint} "
        f"Convert them with `atari-zarr convert`."
    )
