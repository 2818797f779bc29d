"""Paths, URLs and storage options: one way to reach local and remote data.

Every public function that takes a location accepts a local path or any fsspec
URL (``gs://``, ``s3://``, ``https://``, ``memory://``, ``file://``) plus a
``storage_options`` dict passed to the filesystem (``{"token": "anon"}`` for a
public bucket).
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import zarr
from fsspec.implementations.local import LocalFileSystem
from zarr.storage import FsspecStore, LocalStore

from .errors import InvalidArgumentError

__all__ = ["get_fs", "is_url", "join", "open_zarr_store", "parse_storage_options"]

# An emulator or a private endpoint has no gRPC control plane; gcsfs otherwise
# probes it per bucket and waits 60 s for each probe to time out.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def is_url(location: str) -> bool:
    """True when ``location`` names a protocol other than the local file system.

    Examples
    --------
    >>> is_url("gs://bucket/x"), is_url("/data/x"), is_url("file:///data/x")
    (True, False, False)
    """
    location = str(location)
    if "://" not in location:
        return False
    return not location.startswith("file://")


def local_path(location: str) -> str:
    """Strip a ``file://`` prefix."""
    location = str(location)
    return location[len("file://") :] if location.startswith("file://") else location


def join(location: str, *parts: str) -> str:
    """Join path components with ``/`` (URLs) or the OS separator (local paths)."""
    location = str(location)
    if is_url(location):
        return "/".join([location.rstrip("/"), *parts])
    return os.path.join(local_path(location), *parts)


def get_fs(
    location: str, storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return ``(filesystem, path)`` for a local path or fsspec URL.

    Examples
    --------
    >>> fs, path = get_fs("memory://atari/Pong")
    >>> type(fs).__name__, path
    ('MemoryFileSystem', '/atari/Pong')
    """
    location = str(location)
    if not is_url(location):
        return LocalFileSystem(), os.path.abspath(local_path(location))
    fs, path = fsspec.core.url_to_fs(location, **(storage_options or {}))
    return fs, path


def open_zarr_store(
    location: str,
    storage_options: dict[str, Any] | None = None,
    *,
    read_only: bool,
) -> zarr.abc.store.Store:
    """Return a zarr store object for a local path or fsspec URL."""
    location = str(location)
    if not is_url(location):
        return LocalStore(os.path.abspath(local_path(location)), read_only=read_only)
    return FsspecStore.from_url(
        location, storage_options=dict(storage_options or {}), read_only=read_only
    )


def parse_storage_options(pairs: list[str] | None) -> dict[str, Any]:
    """Turn CLI ``KEY=VALUE`` strings into a storage-options dict.

    Values ``true``/``false``/``none`` and numbers are converted; anything
    else stays a string.

    Examples
    --------
    >>> parse_storage_options(["token=anon", "timeout=5", "anon=true"])
    {'token': 'anon', 'timeout': 5, 'anon': True}
    """
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(
                f"--storage-option {pair!r} is not KEY=VALUE; "
                f"write it as e.g. --storage-option token=anon"
            )
        lowered = value.lower()
        parsed: Any
        if lowered in ("true", "false"):
            parsed = lowered == "true"
        elif lowered in ("none", "null"):
            parsed = None
        else:
            try:
                parsed = int(value)
            except ValueError:
                try:
                    parsed = float(value)
                except ValueError:
                    parsed = value
        options[key] = parsed
    return options
