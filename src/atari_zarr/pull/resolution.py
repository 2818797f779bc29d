"""Resolution: a request's store found by a list of steps, and opened once for a loader.

:func:`resolve` tries :data:`STEPS` in turn, and the first that finds the store wins:
a local source the loader names (:func:`in_local_source`), the cache
(:func:`in_cache`), mirrors (:func:`in_mirrors`), then RL Unplugged's public copy
(:func:`from_public_copy`, converted into the cache by
:func:`~atari_zarr.pull.fetch.pull`). ``download`` says how far to go (``True``,
``"force"``, ``False``). ``docs/guides/pull.md`` says what each step looks at and what
``download`` allows. :func:`open_request` is what every drop-in calls: the store
resolved, opened as an :class:`~atari_zarr.AtariZarrDataset`, and checked once against
its root's catalog entry.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from atari_zarr.catalog import check_entry, complete_stores, find_store, store_state
from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    RemoteAccessError,
    StoreNotFoundError,
)
from atari_zarr.layout import store_path
from atari_zarr.pull.fetch import RLU_URL, pull
from atari_zarr.pull.request import (
    MIRRORS_ENV,
    Download,
    Request,
    Resolved,
    cache_home,
    pullable,
)
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.paths import is_url, join, redact

if TYPE_CHECKING:
    from atari_zarr.read.dataset import AtariZarrDataset

__all__ = [
    "STEPS",
    "Search",
    "from_public_copy",
    "in_cache",
    "in_local_source",
    "in_mirrors",
    "mirror_roots",
    "open_request",
    "resolve",
]

log = logging.getLogger("atari_zarr")


def mirror_roots(mirrors: str | Sequence[str] | None = None) -> list[str]:
    """The mirrors asked: ``mirrors`` (a list, or one comma-separated string), else
    ``$ATARI_ZARR_MIRRORS``.

    Examples
    --------
    >>> mirror_roots("gs://a/atari, https://b.org/atari")
    ['gs://a/atari', 'https://b.org/atari']
    """
    if mirrors is None:
        mirrors = os.environ.get(MIRRORS_ENV, "")
    if isinstance(mirrors, str):
        mirrors = mirrors.split(",")
    return [m.strip().rstrip("/") for m in mirrors if m and m.strip()]


@dataclass(frozen=True)
class Search:
    """One resolution: the request and where each step may look."""

    request: Request
    #: The cache's root (:func:`~atari_zarr.storage.paths.cache_home`).
    home: str
    home_options: dict[str, Any] = field(default_factory=dict)
    download: Download = True
    #: A root of the loader's own (its store, or DQN Replay files to convert beside them).
    local_source: str | None = None
    local_options: dict[str, Any] = field(default_factory=dict)
    mirrors: tuple[str, ...] = ()
    mirror_options: dict[str, Any] = field(default_factory=dict)
    source: str = RLU_URL
    source_options: dict[str, Any] | None = None
    scheduler: Any = None
    workers: int | None = None
    progress: bool = False
    timeout: Timeout = "default"


def _find(
    request: Request, root: str, options: dict[str, Any], origin: str, timeout: Timeout
) -> Resolved | None:
    """The request under ``root``: the store of exactly what is asked, else the whole run."""
    name = request.dataset_id
    if not request.whole:
        found = find_store(request.root(root), name, options, timeout=timeout)
        if found is not None:
            return Resolved(found[0], request.root(root), options, origin, True, found[1])
    found = find_store(root, name, options, timeout=timeout)
    if found is not None:
        return Resolved(found[0], root, options, origin, request.whole, found[1])
    return None


def in_cache(search: Search) -> Resolved | None:
    """Step 2: the cache (not with ``download="force"``, which fetches again)."""
    if search.download == "force":
        return None
    return _find(search.request, search.home, search.home_options, "cache", search.timeout)


def in_local_source(search: Search) -> Resolved | None:
    """Step 1: the loader's own root: its store of the run, else the run's DQN Replay
    files (``{root}/{Game}/{run}/replay_logs``) converted once beside them."""
    if search.local_source is None:
        return None
    from atari_zarr.conversion.converter import convert

    request, options = search.request, search.local_options
    root = search.local_source.rstrip("/") or "/"
    for name in dict.fromkeys([request.game, request.asked_game]):
        url = store_path(root, name, request.run)
        if store_state(url, options, timeout=search.timeout) == "complete":
            return Resolved(url, root, options, "local", request.whole)
    run_dir = join(root, request.asked_game, request.run)
    fs, path = get_fs(join(run_dir, "replay_logs"), options, timeout=search.timeout)
    if not fs.exists(path):
        return None
    [done] = convert(run_dir, root, storage_options=options, progress=False)
    return Resolved(done.url, root, options, "local", request.whole)


def in_mirrors(search: Search) -> Resolved | None:
    """Step 3: the mirrors, in order; one that cannot be reached is skipped with a warning.
    ``download=False`` asks only the local ones."""
    if search.download == "force":
        return None
    for mirror in search.mirrors:
        if search.download is False and is_url(mirror):
            continue
        try:
            found = _find(search.request, mirror, search.mirror_options, "mirror", search.timeout)
        except RemoteAccessError as exc:
            log.warning("mirror %s not reachable, skipped: %s", redact(mirror), exc)
            continue
        except InvalidArgumentError as exc:  # a URL that is none: say where it was given
            raise InvalidArgumentError(
                f"the mirror {redact(mirror)} (mirrors= or ${MIRRORS_ENV}): {exc}"
            ) from None
        if found is not None:
            return found
    return None


def from_public_copy(search: Search) -> Resolved | None:
    """Step 4: a pull from RL Unplugged's public copy; with ``download=False``, the one
    line that says what is missing and the command that fetches it."""
    request = search.request
    if search.download is False:
        where = [redact(search.home)] + [redact(m) for m in search.mirrors if not is_url(m)]
        try:
            pullable(request)
            advice = (
                f"download=False never touches the network: fetch it with "
                f"`{request.command()}`, or pass download=True."
            )
        except AtariZarrError as exc:  # nothing to pull: say why, advise no pull
            advice = f"It cannot be pulled either: {exc}"
        raise StoreNotFoundError(
            f"{request.describe()} is not in {' nor in '.join(where)}: expected a complete "
            f"store {store_path(request.root(search.home), request.game, request.run)}"
            f"{_close_matches(request, search.home, search.home_options, search.timeout)}. "
            f"{advice}"
        )
    return pull(
        request,
        home=search.home,
        home_options=search.home_options,
        overwrite=search.download == "force",
        source=search.source,
        source_options=search.source_options,
        scheduler=search.scheduler,
        workers=search.workers,
        progress=search.progress,
        timeout=search.timeout,
    )


#: The steps of a resolution, in order: the first that finds the store wins.
STEPS: tuple[Callable[[Search], Resolved | None], ...] = (
    in_local_source,
    in_cache,
    in_mirrors,
    from_public_copy,
)


def resolve(
    request: Request,
    *,
    home: str | os.PathLike[str] | None = None,
    home_options: dict[str, Any] | None = None,
    mirrors: str | Sequence[str] | None = None,
    download: Download = True,
    mirror_options: dict[str, Any] | None = None,
    local_source: str | os.PathLike[str] | None = None,
    local_options: dict[str, Any] | None = None,
    source: str = RLU_URL,
    source_options: dict[str, Any] | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    progress: bool = False,
    timeout: Timeout = "default",
) -> Resolved:
    """Find the store of ``request``: a local source, the cache, mirrors, then a pull.

    Parameters
    ----------
    request : Request
        What is asked for.
    home : str or path, optional
        The cache (default :func:`~atari_zarr.storage.paths.cache_home`), local or a URL.
    home_options : dict, optional
        fsspec options for a ``home`` URL.
    mirrors : str or list of str, optional
        Roots of stores read in place (default ``$ATARI_ZARR_MIRRORS``).
    download : bool or "force"
        ``True``: pull what is missing; ``"force"``: pull again, into the cache, even
        when it is there (a local source still comes first); ``False``: never touch the
        network (the cache, the local source and local mirrors only).
    mirror_options : dict, optional
        fsspec options for the mirrors (e.g. ``{"token": "anon"}``).
    local_source, local_options : optional
        A root of the loader's own, and its fsspec options (:func:`in_local_source`).
    source, source_options :
        Where a pull reads (default RL Unplugged's public bucket, anonymously).
    scheduler, workers, progress, timeout :
        As :func:`~atari_zarr.convert` takes them, for a pull.

    Raises
    ------
    StoreNotFoundError
        ``download=False`` and the request is neither in the cache nor in a local
        mirror; or a game or run RL Unplugged does not have.
    RemoteAccessError
        The source or a mirror cannot be reached: the message names the URL and
        says how to work without it.

    Examples
    --------
    >>> # dest_root: a directory holding the converted fixture store Pong/1
    >>> found = resolve(Request.parse("Pong/1"), home=dest_root, download=False)
    >>> found.origin, found.url.endswith("Pong/1.zarr")
    ('cache', True)
    """
    if download not in (True, False, "force"):
        raise InvalidArgumentError(
            f"download={download!r} for {request.dataset_id}; expected True (fetch what is "
            f"missing), 'force' (fetch again) or False (never touch the network)"
        )
    search = Search(
        request,
        cache_home(home),
        dict(home_options or {}),
        download,
        None if local_source is None else os.fspath(local_source),
        dict(local_options or {}),
        tuple(mirror_roots(mirrors)),
        dict(mirror_options or {}),
        source,
        source_options,
        scheduler,
        workers,
        progress,
        timeout,
    )
    for step in STEPS:
        found = step(search)
        if found is not None:
            return found
    raise AssertionError("the last step pulls or raises")  # pragma: no cover


def _close_matches(
    request: Request, root: str, options: dict[str, Any] | None, timeout: Timeout
) -> str:
    """``"; close matches there: [...], of N stores"``: the stores under ``root`` whose
    names are near the request's (for a message; empty when ``root`` cannot be listed)."""
    try:
        available = complete_stores(root, options, timeout=timeout)
    except (OSError, ValueError):
        return ""
    close = difflib.get_close_matches(request.dataset_id, available, n=5, cutoff=0.6)
    return f"; close matches there: {close or 'none'}, of {len(available)} stores"


def open_request(
    request: Request,
    *,
    store: str | os.PathLike[str] | AtariZarrDataset | None = None,
    home: str | os.PathLike[str] | None = None,
    mirrors: str | Sequence[str] | None = None,
    download: Download = True,
    local_source: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
    timeout: Timeout = "default",
    **open_options: Any,
) -> tuple[AtariZarrDataset, Resolved]:
    """The dataset of ``request``, as every drop-in opens it: ``store`` when given, else
    the store :func:`resolve` finds, checked once against its root's catalog entry.

    Parameters
    ----------
    request : Request
        What the loader asked for.
    store : str, path or AtariZarrDataset, optional
        Read this store instead of resolving (a path or URL, or a dataset already open).
    home, mirrors, download, local_source :
        As :func:`resolve` takes them (``home`` the cache).
    storage_options : dict, optional
        fsspec options for a URL ``store``, ``home``, local source or mirror.
    progress : bool
        A pull shows its bars, as the originals' downloads did.
    timeout : float, None or "default"
        Seconds each remote call may take.
    **open_options :
        Passed to :class:`~atari_zarr.AtariZarrDataset` (``frame_stack``, ``options``).

    Returns
    -------
    (AtariZarrDataset, Resolved)
        The dataset, and where it was found.

    Examples
    --------
    >>> # dest_root: a directory holding the converted fixture store Pong/1
    >>> ds, found = open_request(Request.parse("Pong/1"), home=dest_root, download=False)
    >>> len(ds) > 0, found.origin
    (True, 'cache')
    """
    from atari_zarr.read.dataset import AtariZarrDataset

    options = dict(storage_options or {})
    if isinstance(store, AtariZarrDataset):
        return store, Resolved(str(store.url), "", dict(store.storage_options or {}), "given")
    if store is not None:
        url = os.fspath(store)
        ds = AtariZarrDataset(url, storage_options=options, timeout=timeout, **open_options)
        return ds, Resolved(url, "", options, "given")
    found = resolve(
        request,
        home=home,
        home_options=options,
        mirrors=mirrors,
        mirror_options=options,
        download=download,
        local_source=local_source,
        local_options=options,
        progress=progress,
        timeout=timeout,
    )
    ds = AtariZarrDataset(
        found.url, storage_options=found.storage_options, timeout=timeout, **open_options
    )
    if found.entry is not None:
        check_entry(found.entry, ds.metadata, found.url)
    return ds, found
