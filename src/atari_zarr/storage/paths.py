"""Locations: local paths and fsspec URLs, joined, spelled and redacted one way.

Every public function of the package that takes a location accepts a local path or
any fsspec URL (``gs://``, ``s3://``, ``https://``, ``memory://``, ``file://``) plus
a ``storage_options`` dict for the file system (``{"token": "anon"}`` for a public
bucket). ``http://`` and ``https://`` locations are read-only (a web server, such as
a public bucket's object URLs, takes no writes): :func:`refuse_write` is the one
error for a write there. Nothing here does I/O.
"""

from __future__ import annotations

import os
from typing import Any

from atari_zarr.errors import InvalidArgumentError, StoreWriteError
from atari_zarr.redaction import redact

__all__ = [
    "HOME_ENV",
    "PROCESS_LOCAL_PROTOCOLS",
    "READ_ONLY_PROTOCOLS",
    "cache_home",
    "is_process_local",
    "is_read_only_url",
    "is_url",
    "join",
    "local_path",
    "parse_storage_options",
    "redact",
    "refuse_write",
]

#: The package's local home: pulled stores, the objects read from the Hub (default
#: ``~/.cache/atari_zarr``).
HOME_ENV = "ATARI_ZARR_HOME"
#: Protocols that are read, never written: plain web servers.
READ_ONLY_PROTOCOLS = frozenset({"http", "https"})
#: Protocols whose files live in the memory of one process: another process (a worker
#: of the ``processes`` scheduler, of a dask cluster) sees a file system of its own.
PROCESS_LOCAL_PROTOCOLS = frozenset({"memory"})


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


def is_read_only_url(location: str) -> bool:
    """True for ``http://`` and ``https://`` URLs, which are only ever read.

    Examples
    --------
    >>> is_read_only_url("https://host/b/Pong/1.zarr"), is_read_only_url("http://h/x")
    (True, True)
    >>> is_read_only_url("s3://b/x"), is_read_only_url("/data/x")
    (False, False)
    """
    location = str(location)
    return "://" in location and location.split("://", 1)[0].lower() in READ_ONLY_PROTOCOLS


def is_process_local(location: str) -> bool:
    """True when ``location`` lives in this process's memory (``memory://``), so that
    other processes cannot reach it (each has a ``memory://`` of its own).

    Examples
    --------
    >>> is_process_local("memory://x/Pong"), is_process_local("simplecache::memory://x")
    (True, True)
    >>> is_process_local("gs://b/x"), is_process_local("/data/x")
    (False, False)
    """
    return any(
        part.split("://", 1)[0].lower() in PROCESS_LOCAL_PROTOCOLS
        for part in str(location).split("::")
        if "://" in part
    )


def refuse_write(
    what: str, location: str, storage_options: dict[str, Any] | None = None
) -> StoreWriteError:
    """The error for a write to a read-only (``http(s)://``) location.

    Examples
    --------
    >>> err = refuse_write("writing", "https://host/bucket/out/Pong/1.zarr/zarr.json")
    >>> str(err).split(" (")[0]
    'writing https://host/bucket/out/Pong/1.zarr/zarr.json: https:// is read-only'
    """
    protocol = str(location).split("://", 1)[0].lower()
    return StoreWriteError(
        f"{what} {redact(location, storage_options)}: {protocol}:// is read-only (a web server "
        f"takes no writes); expected a writable destination (a local path, gs://, s3:// or "
        f"another fsspec URL). Write the store there, then read it over {protocol}://."
    )


def local_path(location: str) -> str:
    """Strip a ``file://`` prefix.

    Examples
    --------
    >>> local_path("file:///data/x"), local_path("data/x")
    ('/data/x', 'data/x')
    """
    location = str(location)
    return location[len("file://") :] if location.startswith("file://") else location


def join(location: str, *parts: str) -> str:
    """Join path components with ``/`` (URLs) or the OS separator (local paths).

    Examples
    --------
    >>> join("gs://bucket/atari/", "Pong", "1.zarr")
    'gs://bucket/atari/Pong/1.zarr'
    """
    location = str(location)
    if is_url(location):
        return "/".join([location.rstrip("/"), *parts])
    return os.path.join(local_path(location), *parts)


def parse_storage_options(
    pairs: list[str] | None, option: str = "--storage-option"
) -> dict[str, Any]:
    """Turn CLI ``KEY=VALUE`` strings into a storage-options dict.

    Values ``true``/``false``/``none`` and numbers are converted; anything
    else stays a string. ``option`` is the flag they were given with, which an
    error names.

    Examples
    --------
    >>> parse_storage_options(["token=anon", "timeout=5", "anon=true"])
    {'token': 'anon', 'timeout': 5, 'anon': True}
    >>> parse_storage_options(["=x"], "--source-storage-option")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: --source-storage-option '=x' is not KEY=VALUE; ...
    """
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(
                f"{option} {pair!r} is not KEY=VALUE; write it as e.g. {option} token=anon"
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


def cache_home(home: str | os.PathLike[str] | None = None) -> str:
    """The package's home: ``home``, else ``$ATARI_ZARR_HOME``, else ``~/.cache/atari_zarr``.

    A leading ``~`` of a local path is the user's home directory. A blank ``home`` is
    not given, as a blank ``$ATARI_ZARR_HOME`` is (never the working directory).

    Examples
    --------
    >>> cache_home("~/stores") == os.path.expanduser("~/stores")
    True
    >>> cache_home("gs://bucket/~x")
    'gs://bucket/~x'
    >>> cache_home("") == cache_home(None)
    True
    """
    given = "" if home is None else os.fspath(home)
    found = given if given.strip() else os.environ.get(HOME_ENV, "").strip()
    found = found or os.path.join("~", ".cache", "atari_zarr")
    # "~/x" is the user's home, never a directory named "~" in the working directory
    return found if is_url(found) else os.path.expanduser(found)
