"""A store opened for reading: its group and metadata, with the one set of good errors.

Every reader of a store's metadata (the dataset, ``verify``, ``info``, the learning
curves, the dataset card, the drop-ins) opens it with :func:`open_store`, so
"nothing there", "not a store" and "unfinished" read the same everywhere. Which
source kind wrote it is :func:`atari_zarr.sources.registry.kind_of`.

Examples
--------
>>> opened = open_store(store_url)  # the converted Pong/1 fixture store
>>> opened.metadata["game"], "observation" in opened.group
('Pong', True)
>>> open_store(store_url + "-nothing")  # doctest: +ELLIPSIS
Traceback (most recent call last):
    ...
atari_zarr.errors.StoreNotFoundError: ...-nothing does not exist: expected a store written by \
`atari-zarr convert` (e.g. DEST/Pong/1.zarr). Check the path, or list the stores under a \
directory with `atari-zarr ls DEST`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

import zarr

from atari_zarr.errors import (
    StoreChangedError,
    StoreCorruptError,
    StoreFormatError,
    StoreNotFoundError,
)
from atari_zarr.layout import ATTRS_KEY, is_complete, read_metadata
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.paths import is_url, redact
from atari_zarr.storage.remote import open_zarr_store

__all__ = ["OpenedStore", "changed_or_damaged", "open_store"]

log = logging.getLogger("atari_zarr")

# the object a store's (consolidated) metadata is read from
_ROOT_META = "zarr.json"


class OpenedStore(NamedTuple):
    """A store's zarr group and its atari_zarr attributes."""

    group: zarr.Group
    metadata: dict[str, Any]


def open_store(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: Timeout = "default",
    cache: str | os.PathLike[str] | None = None,
    require_complete: bool = True,
) -> OpenedStore:
    """Open the store at ``url`` read-only: one request for a store in a bucket.

    Parameters
    ----------
    url : str
        Path or fsspec URL of a store.
    storage_options : dict, optional
        fsspec options.
    timeout : float, None or "default"
        Seconds each call to storage may take.
    cache : path, optional
        Local directory keeping the byte ranges fetched (remote stores).
    require_complete : bool
        Refuse a store whose writer has not finished
        (:class:`~atari_zarr.errors.StoreIncompleteError`, naming the command that
        finishes it).

    Raises
    ------
    StoreNotFoundError
        Nothing is at ``url``.
    StoreFormatError
        Something is there, but not a Zarr v3 store this version reads.
    StoreIncompleteError
        The store is unfinished and ``require_complete``.
    """
    url = str(url)
    store = open_zarr_store(url, storage_options, read_only=True, timeout=timeout, cache=cache)
    try:
        return _open(store, url, storage_options, timeout, require_complete)
    except StoreFormatError as exc:
        # a local cache's copy of the metadata (the Hub's object cache) that fails to
        # parse is thrown away and fetched once more before the store is judged
        discard = getattr(store, "discard", None)
        note = discard(_ROOT_META) if discard is not None else ""
        if not note:
            raise
        log.info("%s: %s; fetching it again", redact(url), exc)
    try:
        return _open(store, url, storage_options, timeout, require_complete)
    except StoreFormatError as exc:
        raise StoreFormatError(f"{str(exc).rstrip('.')}. {note}") from None


def _open(
    store: Any,
    url: str,
    storage_options: dict[str, Any] | None,
    timeout: Timeout,
    require_complete: bool,
) -> OpenedStore:
    """:func:`open_store` of ``store``, opened from ``url``."""
    where = redact(url)
    try:
        # zarr_format=3: no probes for v2 keys; the root zarr.json carries the
        # consolidated metadata, so opening costs one request
        group = zarr.open_group(store, mode="r", zarr_format=3)
    except FileNotFoundError as exc:  # zarr's GroupNotFoundError: no zarr.json
        # the error path alone asks what is there (over http(s) only objects exist)
        fs, path = get_fs(url, storage_options, timeout=timeout)
        if not fs.read_only and fs.exists(path):
            raise StoreNotFoundError(
                f"{where} exists but is not a Zarr store: expected a zarr.json written by "
                f"`atari-zarr convert`, found none. If it holds stores, list them with "
                f"`atari-zarr ls {where}`."
            ) from None if is_url(url) else exc
        found = "is not a Zarr store (no zarr.json)" if fs.read_only else "does not exist"
        raise StoreNotFoundError(
            f"{where} {found}: expected a store written by `atari-zarr convert` (e.g. "
            f"DEST/Pong/1.zarr). Check the path, or list the stores under a directory with "
            f"`atari-zarr ls DEST`."
        ) from None if is_url(url) else exc
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
        # zarr's validation of the metadata (it divides by a crafted chunk's 0 rows)
        raise StoreFormatError(
            f"{where}: its zarr.json is not valid Zarr v3 metadata ("
            f"{' '.join(str(exc).split())[:300]}); expected what `atari-zarr convert` "
            f"writes. The metadata is damaged: convert the source again."
        ) from None
    return OpenedStore(group, read_metadata(group, url, require_complete=require_complete))


def changed_or_damaged(
    err: StoreCorruptError,
    url: str,
    storage_options: dict[str, Any] | None,
    metadata: dict[str, Any],
    *,
    timeout: Timeout = "default",
) -> Exception:
    """``err``, or the error saying the store was replaced while it was being read.

    Damage found in a store opened complete (with attributes ``metadata``) is
    checked against the store as it is now: gone, unfinished (being written again)
    or converted again (other attributes) means it was replaced under the reader
    (:class:`~atari_zarr.errors.StoreChangedError`), not damaged.
    """
    where = redact(str(url))
    why = None
    try:
        store = open_zarr_store(url, storage_options, read_only=True, timeout=timeout)
        now = zarr.open_group(store, mode="r", zarr_format=3).attrs.get(ATTRS_KEY)
    except FileNotFoundError:
        why = "it is gone"
    except Exception:  # the store cannot be read now: report what was found
        return err
    if why is None:
        if not isinstance(now, dict):
            why = "it is no longer an atari_zarr store"
        elif not is_complete(now):
            why = "it is being written again (it is not marked complete now)"
        elif now != metadata:
            why = "it was written again since it was opened"
        else:
            return err
    # what the reader found, without the store's name and the "damaged" verdict
    found = str(err).split(". The store is damaged")[0].removeprefix(f"{where}: ")
    return StoreChangedError(
        f"{where} changed while it was being read ({why}): {found}. That is not "
        f"damage; open the store again, e.g. AtariZarrDataset({where!r}), once it is "
        f"complete"
    )
