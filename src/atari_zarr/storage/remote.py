"""Zarr stores at local paths and fsspec URLs: :func:`open_zarr_store`, :class:`RemoteStore`.

Remote Zarr stores are opened as a :class:`RemoteStore`, which adds three things
to zarr's ``FsspecStore``:

* **a deadline and clear errors per request.** Every request zarr makes (reads,
  writes, deletes, existence checks, listings, sizes) goes through
  :mod:`atari_zarr.storage.deadline`, as the package's own file system calls do:
  ``timeout`` seconds, retries included, and failures naming the URL and the object,
  credentials redacted.
* **fork safety.** A file system instance holds an event loop's HTTP session
  and open sockets. After ``os.fork`` (a torch DataLoader worker) the store
  builds a fresh file system in the child instead of sharing the parent's.
* **plain web servers.** ``http://`` and ``https://`` stores (a public bucket's
  object URLs) are read-only: opening one for writing raises
  :class:`~atari_zarr.errors.StoreWriteError`. fsspec's HTTP file system does not
  retry, so reads there retry transient failures (``5xx``, ``408``, ``429``,
  dropped connections) themselves, within the same deadline.

Backends: any fsspec URL; tested on loopback against real servers are ``gs://``
(fake-gcs-server), ``s3://`` (moto's S3 server, with s3fs) and ``http://`` (the
emulator's public object URLs), see ``docs/remote.md``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable
from typing import Any, TypeVar

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from atari_zarr.errors import InvalidArgumentError, RemoteAccessError
from atari_zarr.forks import after_fork
from atari_zarr.storage.deadline import (
    DEFAULT_TIMEOUT,
    HTTP_ATTEMPTS,
    bounded,
    resolve_timeout,
    traced_options,
    with_retries,
)
from atari_zarr.storage.endpoint import check_resolves
from atari_zarr.storage.filesystem import backend_errors, check_local_metadata
from atari_zarr.storage.hub import is_hub_url
from atari_zarr.storage.paths import is_read_only_url, is_url, local_path, redact, refuse_write
from atari_zarr.storage.sessions import watch_store

__all__ = ["RemoteStore", "open_zarr_store"]

log = logging.getLogger("atari_zarr")

T = TypeVar("T")


def open_zarr_store(
    location: str,
    storage_options: dict[str, Any] | None = None,
    *,
    read_only: bool,
    timeout: float | str | None = "default",
    cache: str | os.PathLike[str] | None = None,
) -> Store:
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
        ``None`` for no limit. Default
        :data:`~atari_zarr.storage.deadline.DEFAULT_TIMEOUT` (60 s).
    cache : path, optional
        Local directory that keeps every object and byte range read, for the
        next epoch (see :class:`atari_zarr.storage.cache.RangeCacheStore`). Only for
        reading.

    Examples
    --------
    >>> store = open_zarr_store("memory://doc/x.zarr", read_only=False)
    >>> type(store).__name__, store.timeout
    ('RemoteStore', 60.0)
    """
    location = str(location)
    store: Store
    if not is_url(location):
        root = os.path.abspath(local_path(location))
        check_local_metadata(root)  # a FIFO in place of a zarr.json would hang zarr's open
        store = LocalStore(root, read_only=read_only)
    else:
        store = RemoteStore(
            location, storage_options, read_only=read_only, timeout=resolve_timeout(timeout)
        )
        if read_only and is_hub_url(location):
            store = _hub_objects(store, location, storage_options, resolve_timeout(timeout))
    if cache is not None:
        if not read_only:
            raise InvalidArgumentError(
                f"cache={str(cache)!r} was given for writing to {redact(location)}; the local "
                f"cache is for reading only. Drop the cache option when writing."
            )
        from atari_zarr.storage.cache import RangeCacheStore

        store = RangeCacheStore(store, cache, redact(location))
    return store


def _hub_objects(
    store: Store, location: str, storage_options: dict[str, Any] | None, timeout: float | None
) -> Store:
    """A Hub store read whole object by whole object, through the local object cache
    (:mod:`atari_zarr.storage.hub`); as byte ranges where the cache is off."""
    from atari_zarr.storage.filesystem import quiet_hub_logs
    from atari_zarr.storage.hub import HubObjects
    from atari_zarr.storage.objects import ObjectCacheStore, cache_bound, objects_root

    quiet_hub_logs()  # its 429 notes reach the application's logging only
    if cache_bound(objects_root()) <= 0:
        return store
    objects = HubObjects(location, storage_options, timeout)
    return ObjectCacheStore(store, objects.fetch, objects.folder, redact(location, storage_options))


def _range_length(byte_range: ByteRequest | None) -> int | None:
    """The most bytes ``byte_range`` can give (None: no bound)."""
    if isinstance(byte_range, RangeByteRequest):
        return max(0, byte_range.end - byte_range.start)
    if isinstance(byte_range, SuffixByteRequest):
        return byte_range.suffix
    return None


def _unsatisfiable(exc: BaseException) -> bool:
    """True for an HTTP 416 (Range Not Satisfiable) however the file system raises it:
    aiohttp's ``status``, gcsfs's ``code`` (aiohttp's own ``code`` is deprecated)."""
    status = getattr(exc, "status", None)
    return (status if status is not None else getattr(exc, "code", None)) == 416


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

    _inner: Store

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
        # a web server's objects are read with retries (and never written)
        self._http = is_read_only_url(self.url)
        if self._http and not read_only:
            raise refuse_write("opening for writing", self.url, self.storage_options)
        self._read_only_flag = read_only
        self._forked = False
        after_fork(self._after_fork)
        super().__init__(self._connect())

    def _after_fork(self) -> None:
        self._forked = True

    def _connect(self) -> Store:
        check_resolves(self.url, self.storage_options, timeout=self.timeout)
        with backend_errors(self.url, self.storage_options):
            store = FsspecStore.from_url(
                self.url,
                storage_options=traced_options(self.url, dict(self.storage_options)),
                read_only=self._read_only_flag,
            )
        watch_store(store)
        return store

    # The inner store is rebuilt in a forked child: its file system instance would
    # otherwise keep the parent's HTTP session, sockets and (dead) event loop.
    @property  # type: ignore[override]
    def _store(self) -> Store:
        if self._forked:
            was_open = self._inner._is_open
            self._inner = self._connect()
            self._inner._is_open = was_open
            self._forked = False
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
        return await bounded(
            what, where, awaitable, timeout=self.timeout, storage_options=self.storage_options
        )

    async def _guard_iter(
        self, what: str, key: str, items: AsyncIterator[str]
    ) -> AsyncIterator[str]:
        # a listing is fetched page by page as it is iterated: each step is bounded
        iterator = aiter(items)
        while True:
            try:
                item = await self._guard(what, key, anext(iterator))
            except StopAsyncIteration:
                return
            yield item

    async def get(self, key: str, prototype: Any, byte_range: ByteRequest | None = None) -> Any:
        async def call() -> Any:
            try:
                return await self._store.get(key, prototype, byte_range)
            except Exception as exc:
                # 416: the range starts at or past the object's end (a crafted shard
                # index's offset): no bytes are there, as a file read there finds none
                if _unsatisfiable(exc) and isinstance(
                    byte_range, RangeByteRequest | OffsetByteRequest
                ):
                    return prototype.buffer.from_bytes(b"")
                raise

        if self._http:
            found = await self._guard(
                "reading", _describe(key, byte_range), with_retries(call, HTTP_ATTEMPTS)
            )
        else:
            found = await self._guard("reading", _describe(key, byte_range), call())
        asked = _range_length(byte_range)
        if found is not None and asked is not None and len(found) > asked:
            raise RemoteAccessError(
                f"{self.url}/{key}: the server answered a request for {asked:,} bytes "
                f"({_describe(key, byte_range)}) with {len(found):,}: it does not serve byte "
                f"ranges (HTTP Range; `python -m http.server` does not), which reading a store "
                f"needs; the store is not damaged. Serve it from a server that does (a bucket, "
                f"nginx, Caddy), or copy the store and read it locally."
            )
        return found

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

    async def _set_many(self, values: Iterable[tuple[str, Any]]) -> None:
        await asyncio.gather(*(self.set(key, value) for key, value in values))

    def list(self) -> AsyncIterator[str]:
        return self._guard_iter("listing", "", self._store.list())

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        return self._guard_iter("listing", prefix, self._store.list_prefix(prefix))

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        return self._guard_iter("listing", prefix, self._store.list_dir(prefix))

    async def getsize(self, key: str) -> int:
        return await self._guard("checking the size of", key, self._store.getsize(key))

    async def _ensure_open(self) -> None:
        await self._guard("opening", "", self._store._ensure_open())

    async def _open(self) -> None:
        await self._guard("opening", "", self._store._open())
