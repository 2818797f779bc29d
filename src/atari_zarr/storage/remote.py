"""Paths, URLs and storage options: one way to reach local and remote data.

Every public function that takes a location accepts a local path or any fsspec
URL (``gs://``, ``s3://``, ``https://``, ``memory://``, ``file://``) plus a
``storage_options`` dict passed to the filesystem (``{"token": "anon"}`` for a
public bucket).

Remote Zarr stores are opened as a :class:`RemoteStore`, which adds three
things to zarr's ``FsspecStore``:

* **a deadline per request.** Transient failures (``5xx``, ``429``, refused
  connections) are retried by the file system itself (gcsfs: 6 attempts with
  exponential back-off, about 31 s in all); a server that stops answering would
  otherwise hold a read for minutes. Every request, retries included, gets
  ``timeout`` seconds (default 60, or ``ATARI_ZARR_TIMEOUT``), then raises
  :class:`~atari_zarr.errors.RemoteTimeoutError`.
* **clear errors.** Failures name the URL and the object; credentials
  (``user:password@``, tokens in query strings or storage options) are
  redacted from every message.
* **fork safety.** A file system instance holds an event loop's HTTP session
  and open sockets. After ``os.fork`` (a torch DataLoader worker) the store
  builds a fresh file system in the child instead of sharing the parent's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncGenerator, Awaitable, Iterable
from typing import Any, TypeVar

import fsspec
import zarr
from fsspec.implementations.local import LocalFileSystem
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    RemoteAccessError,
    RemoteTimeoutError,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "RemoteStore",
    "default_timeout",
    "get_fs",
    "is_url",
    "join",
    "open_zarr_store",
    "parse_storage_options",
    "redact",
]

log = logging.getLogger("atari_zarr")

# An emulator or a private endpoint has no gRPC control plane; gcsfs otherwise
# probes it per bucket and waits 60 s for each probe to time out.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

#: Seconds one storage request may take, the file system's own retries included.
#: Above gcsfs's full retry schedule (about 31 s), so transient errors are retried.
DEFAULT_TIMEOUT = 60.0
_TIMEOUT_ENV = "ATARI_ZARR_TIMEOUT"

T = TypeVar("T")


def default_timeout() -> float | None:
    """The request deadline: ``$ATARI_ZARR_TIMEOUT`` if set (``none`` for no limit), else 60 s.

    Examples
    --------
    >>> default_timeout() > 0
    True
    """
    value = os.environ.get(_TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT
    if value.lower() in ("none", "inf", "0"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidArgumentError(
            f"{_TIMEOUT_ENV}={value!r} is not a number of seconds; set it to e.g. 60, or "
            f"'none' for no limit."
        ) from None
    return seconds if seconds > 0 else None


_USERINFO_RE = re.compile(r"(?<=://)[^/@\s]+@")
_QUERY_SECRET_RE = re.compile(
    r"(?i)((?:access_token|token|signature|sig|key|secret|password|credential|"
    r"x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential|"
    r"x-amz-security-token)=)[^&\s'\"]+"
)
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s'\",]+")
_SECRET_KEY_RE = re.compile(r"(?i)token|secret|password|passwd|credential|auth|key|session")


def _secret_values(options: Any, key: str = "") -> list[str]:
    """String values of storage options whose key sounds secret (nested dicts too)."""
    if isinstance(options, dict):
        out: list[str] = []
        for k, v in options.items():
            out += _secret_values(v, str(k))
        return out
    if isinstance(options, str) and len(options) >= 4 and _SECRET_KEY_RE.search(key):
        return [] if options in ("anon", "google_default", "cloud", "browser") else [options]
    return []


def redact(text: str, storage_options: dict[str, Any] | None = None) -> str:
    """Remove credentials from ``text``: URL user info, secret query parameters, bearer
    tokens, and the values of secret-looking storage options.

    Examples
    --------
    >>> redact("https://me:hunter2@host/x?X-Goog-Signature=abc&a=1")
    'https://***@host/x?X-Goog-Signature=***&a=1'
    >>> redact("token s3cr3t-value refused", {"token": "s3cr3t-value"})
    'token *** refused'
    """
    text = _USERINFO_RE.sub("***@", str(text))
    text = _QUERY_SECRET_RE.sub(r"\1***", text)
    text = _BEARER_RE.sub(r"\1***", text)
    for secret in sorted(_secret_values(storage_options or {}), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


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
    timeout: float | str | None = "default",
    cache: str | os.PathLike[str] | None = None,
) -> zarr.abc.store.Store:
    """Return a zarr store object for a local path or fsspec URL.

    Parameters
    ----------
    location : str
        Local path or fsspec URL of the store.
    storage_options : dict, optional
        fsspec options for URLs.
    read_only : bool
        Open for reading only.
    timeout : float or None
        Seconds each request of a remote store may take (retries included);
        ``None`` for no limit. Default: :func:`default_timeout`.
    cache : path, optional
        Local directory that keeps every object and byte range read, for the
        next epoch (see :class:`atari_zarr.storage.cache.RangeCacheStore`). Only for
        reading.

    Examples
    --------
    >>> store = open_zarr_store("memory://doc/x.zarr", read_only=False)
    >>> type(store).__name__, store.timeout == default_timeout()
    ('RemoteStore', True)
    """
    location = str(location)
    store: Store
    if not is_url(location):
        store = LocalStore(os.path.abspath(local_path(location)), read_only=read_only)
    else:
        seconds = default_timeout() if timeout == "default" else timeout
        store = RemoteStore(
            location,
            storage_options,
            read_only=read_only,
            timeout=seconds,  # type: ignore[arg-type]
        )
    if cache is not None:
        if not read_only:
            raise InvalidArgumentError(
                f"cache={str(cache)!r} was given for writing to {redact(location)}; the local "
                f"cache is for reading only. Drop the cache option when writing."
            )
        from atari_zarr.storage.cache import RangeCacheStore

        store = RangeCacheStore(store, cache, redact(location))
    return store


def _describe(key: str, byte_range: ByteRequest | None) -> str:
    if isinstance(byte_range, RangeByteRequest):
        return f"{key} (bytes {byte_range.start}-{byte_range.end})"
    if isinstance(byte_range, OffsetByteRequest):
        return f"{key} (bytes {byte_range.offset}-)"
    if byte_range is not None:
        return f"{key} (last {byte_range.suffix} bytes)"  # type: ignore[union-attr]
    return key


class RemoteStore(WrapperStore[Store]):
    """zarr ``FsspecStore`` with a deadline per request, clear errors and fork safety.

    Parameters
    ----------
    url : str
        fsspec URL of the store (``gs://bucket/Pong/1.zarr``).
    storage_options : dict, optional
        Passed to the file system (``token``, ``endpoint_url``, ...).
    read_only : bool
        Open for reading only.
    timeout : float or None
        Seconds each request may take, the file system's retries included;
        ``None`` for no limit.

    Examples
    --------
    >>> import pickle
    >>> store = RemoteStore("memory://doc/remote.zarr", read_only=False, timeout=5)
    >>> copy = pickle.loads(pickle.dumps(store))
    >>> copy.url, copy.timeout
    ('memory://doc/remote.zarr', 5)
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        read_only: bool,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self.url = str(url).rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.timeout = timeout
        self._read_only_flag = read_only
        self._pid = os.getpid()
        super().__init__(self._connect())

    def _connect(self) -> Store:
        return FsspecStore.from_url(
            self.url, storage_options=dict(self.storage_options), read_only=self._read_only_flag
        )

    # The inner store is rebuilt in a forked child: its file system instance would
    # otherwise keep the parent's HTTP session, sockets and (dead) event loop.
    @property  # type: ignore[override]
    def _store(self) -> Store:
        if self._pid != os.getpid():
            was_open = self._inner._is_open
            self._inner = self._connect()
            self._inner._is_open = was_open
            self._pid = os.getpid()
            log.debug("rebuilt the file system of %s after a fork", self.safe_url)
        return self._inner

    @_store.setter
    def _store(self, store: Store) -> None:
        self._inner = store

    @property
    def safe_url(self) -> str:
        """The URL with any credentials removed."""
        return redact(self.url, self.storage_options)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "storage_options": self.storage_options,
            "read_only": self._read_only_flag,
            "timeout": self.timeout,
            "is_open": self._inner._is_open,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["url"],
            state["storage_options"],
            read_only=state["read_only"],
            timeout=state["timeout"],
        )
        self._inner._is_open = state["is_open"]

    def with_read_only(self, read_only: bool = False) -> RemoteStore:
        return RemoteStore(
            self.url, self.storage_options, read_only=read_only, timeout=self.timeout
        )

    def _with_store(self, store: Store) -> RemoteStore:  # pragma: no cover - zarr internal
        clone = RemoteStore.__new__(RemoteStore)
        clone.__dict__.update(self.__dict__)
        clone._inner = store
        return clone

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RemoteStore)
            and (self.url, self._read_only_flag) == (other.url, other._read_only_flag)
            and self.storage_options == other.storage_options
        )

    def __hash__(self) -> int:
        return hash((self.url, self._read_only_flag))

    def __str__(self) -> str:
        return self.safe_url

    def __repr__(self) -> str:
        return f"RemoteStore({self.safe_url!r}, read_only={self._read_only_flag})"

    # -- every request goes through _guard -------------------------------------------
    async def _guard(self, what: str, key: str, awaitable: Awaitable[T]) -> T:
        where = f"{self.safe_url}/{key}" if key else self.safe_url
        try:
            if self.timeout is None:
                return await awaitable
            return await asyncio.wait_for(awaitable, self.timeout)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, AtariZarrError):
            raise
        except TimeoutError:
            raise RemoteTimeoutError(
                f"{what} {where} did not finish within {self.timeout:g} s: the server did not "
                f"answer in time (it may be down, overloaded or unreachable; transient errors "
                f"were retried). Check the URL, endpoint and network, or allow more time with "
                f"timeout=... (CLI --timeout, environment {_TIMEOUT_ENV})."
            ) from None
        except Exception as exc:
            detail = redact(f"{type(exc).__name__}: {exc}", self.storage_options)
            # The original exception is not chained: its text may carry credentials.
            raise RemoteAccessError(
                f"{what} {where} failed after the file system's retries ({detail}). Check the "
                f"URL, the storage options (credentials, endpoint_url) and that the server "
                f"is reachable."
            ) from None

    async def get(self, key: str, prototype: Any, byte_range: ByteRequest | None = None) -> Any:
        return await self._guard(
            "reading", _describe(key, byte_range), self._store.get(key, prototype, byte_range)
        )

    async def get_partial_values(
        self, prototype: Any, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Any]:
        return list(
            await asyncio.gather(*(self.get(key, prototype, rng) for key, rng in key_ranges))
        )

    async def _get_many(
        self, requests: Iterable[tuple[str, Any, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Any], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    async def exists(self, key: str) -> bool:
        return await self._guard("checking", key, self._store.exists(key))

    async def set(self, key: str, value: Any) -> None:
        await self._guard("writing", key, self._store.set(key, value))

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        await self._guard("writing", key, self._store.set_if_not_exists(key, value))

    async def delete(self, key: str) -> None:
        await self._guard("deleting", key, self._store.delete(key))

    async def delete_dir(self, prefix: str) -> None:
        await self._guard("deleting", prefix, self._store.delete_dir(prefix))

    async def is_empty(self, prefix: str) -> bool:
        return await self._guard("listing", prefix, self._store.is_empty(prefix))

    async def clear(self) -> None:
        await self._guard("clearing", "", self._store.clear())

    async def _ensure_open(self) -> None:
        await self._guard("opening", "", self._store._ensure_open())

    async def _open(self) -> None:
        await self._guard("opening", "", self._store._open())


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
