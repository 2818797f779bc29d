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
    attributes (or not JSON), or a directory of other things.
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
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, TypedDict

from atari_zarr.errors import InvalidArgumentError, StoreNotFoundError
from atari_zarr.layout import ACTION, ATTRS_KEY, is_complete, store_path
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import FileSystem, get_fs
from atari_zarr.storage.paths import redact

__all__ = [
    "StoreRow",
    "StoreState",
    "complete_stores",
    "list_stores",
    "name_to_url",
    "store_state",
]

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


class StoreRow(TypedDict):
    """One store found by :func:`list_stores` (a row of ``atari-zarr ls``)."""

    url: str
    game: str | None
    run: str
    status: str
    transitions: int | None
    episodes: int | None
    stored_bytes: int | None


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
        raw = fs.cat_file(f"{path}/{_ROOT_META}")
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


def _find_stores(fs: FileSystem, path: str, depth: int) -> list[str]:
    """``*.zarr`` directories at most ``depth`` levels below ``path``, not looking inside them.

    One listing per directory visited; stores themselves are never listed, which
    matters on object stores where a store holds thousands of objects.
    """
    if path.endswith(_SUFFIX) or fs.exists(f"{path}/{_ROOT_META}"):
        return [path]
    found: list[str] = []
    level = [path]
    for _ in range(depth):
        below: list[str] = []
        for directory in level:
            for entry in fs.ls(directory, detail=True):
                if entry.get("type") != "directory":
                    continue
                name = str(entry["name"]).rstrip("/")
                (found if name.endswith(_SUFFIX) else below).append(name)
        level = below
    return sorted(found)


def list_stores(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    sizes: bool = True,
    timeout: Timeout = "default",
) -> list[StoreRow]:
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
    timeout : float, None or "default"
        Seconds each call to storage may take, retries included (default 60).

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
    RemoteAccessError, RemoteTimeoutError
        A listing or a read failed for a remote reason.

    Examples
    --------
    >>> [(s["game"], s["run"], s["status"]) for s in list_stores(dest_root)]
    [('Pong', '1', 'complete')]
    """
    fs, path = get_fs(root, storage_options, timeout=timeout)
    path = path.rstrip("/")
    if fs.read_only:
        # plain http(s) has no listing; one store is still answered, from its zarr.json
        if not fs.exists(f"{path}/zarr.json"):
            raise InvalidArgumentError(
                f"{redact(str(root), storage_options)} cannot be listed: http(s):// has no "
                f"listing, so the stores under it cannot be found. Give one store's URL "
                f"(ROOT/Game/run.zarr), or list the bucket through gs:// or s3:// "
                f"(anonymously, for a public bucket)"
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

    return [_row(fs, p, url_of(p), sizes=sizes) for p in _find_stores(fs, path, depth=3)]


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
                action = json.loads(fs.cat_file(f"{p}/{ACTION}/{_ROOT_META}"))
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
    root: str, storage_options: dict[str, Any] | None = None, *, timeout: Timeout = "default"
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
    for row in list_stores(root, storage_options, sizes=False, timeout=timeout):
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
