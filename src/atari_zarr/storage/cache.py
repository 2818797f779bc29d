"""A local directory that keeps what a remote store has served: :class:`RangeCacheStore`.

Frames live in shards of 4096 frames; a sample needs a few 16-frame chunks of a
shard, fetched as byte ranges. fsspec's ``simplecache::``/``filecache::`` copy
*whole* objects on first touch (a whole shard per sampled frame), which is the
download this package avoids, and zarr's experimental ``CacheStore`` keeps byte
ranges in memory only. So this store caches exactly what was asked for: each
object or byte range read becomes one file under the cache directory, and the
next epoch (or another worker process) reads it from there.

Validity: a complete store never changes, but a path can be converted again
with ``--overwrite``. Every open reads the root ``zarr.json`` from the remote
store (it holds the consolidated metadata and the conversion's attributes); if
its content differs from the one the cache was filled under, the cache of
that store is emptied first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store
from zarr.storage import WrapperStore

__all__ = ["PART_PREFIX", "RangeCacheStore", "ReadThroughStore", "write_whole"]

log = logging.getLogger("atari_zarr")

_ROOT_META = "zarr.json"
_FINGERPRINT = "fingerprint"


def _range_suffix(byte_range: ByteRequest | None) -> str:
    if byte_range is None:
        return "all"
    if isinstance(byte_range, RangeByteRequest):
        return f"{byte_range.start}-{byte_range.end}"
    if isinstance(byte_range, OffsetByteRequest):
        return f"{byte_range.offset}-"
    return f"-{byte_range.suffix}"  # SuffixByteRequest


#: What a file being written is named until it is whole (``.part-XXXX``, in its folder).
PART_PREFIX = ".part-"


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: to a temporary name in its folder,
    then renamed into place; the temporary file removed if that fails (``OSError``)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=PART_PREFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


class ReadThroughStore(WrapperStore[Store]):
    """A read-only wrapper whose every read is its ``get``: what the local caches of
    remote stores (:class:`RangeCacheStore`, :class:`~atari_zarr.storage.objects.ObjectCacheStore`)
    share."""

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
        reads = (self.get(key, prototype, rng) for key, rng in key_ranges)
        return list(await asyncio.gather(*reads))

    async def _get_many(self, requests: Any) -> Any:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)

    @property
    def supports_writes(self) -> bool:
        return False

    @property
    def supports_deletes(self) -> bool:
        return False

    @property
    def read_only(self) -> bool:
        return True


class RangeCacheStore(ReadThroughStore):
    """Read-only wrapper that keeps every object and byte range read in a local directory.

    Parameters
    ----------
    store : zarr.abc.store.Store
        The (remote) store to read from.
    directory : path
        Cache root; each store gets its own subdirectory, named by a hash of
        ``url``. Several processes may share it: files are written to a
        temporary name and renamed into place.
    url : str
        Identifies the store (without credentials).

    Attributes
    ----------
    hits, misses : int
        Reads served from the directory and from ``store`` (this process).

    Examples
    --------
    >>> import tempfile, zarr
    >>> from zarr.storage import MemoryStore
    >>> remote = MemoryStore()
    >>> zarr.create_array(remote, shape=(8,), chunks=(4,), dtype="int8")[:] = 1
    >>> cached = RangeCacheStore(remote.with_read_only(True), tempfile.mkdtemp(), "memory://x")
    >>> int(zarr.open_array(cached, mode="r", zarr_format=3)[:].sum()), cached.misses
    (8, 2)
    >>> int(zarr.open_array(cached, mode="r", zarr_format=3)[:].sum()), cached.hits
    (8, 2)
    """

    def __init__(self, store: Store, directory: str | os.PathLike[str], url: str) -> None:
        super().__init__(store)
        self.directory = Path(directory).expanduser().absolute()
        self.url = url
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        self.root = self.directory / digest
        self.hits = 0
        self.misses = 0
        #: False once a write to the cache failed (disk full, permissions): reads go on
        #: from the remote, uncached, after one warning.
        self.writable = True

    def with_read_only(self, read_only: bool = False) -> RangeCacheStore:
        if not read_only:
            raise ValueError(f"the local cache of {self.url} is read-only")
        return self

    def _with_store(self, store: Store) -> RangeCacheStore:  # pragma: no cover - zarr internal
        return RangeCacheStore(store, self.directory, self.url)

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self._store, "directory": str(self.directory), "url": self.url}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["store"], state["directory"], state["url"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"RangeCacheStore({self.url!r}, cache={str(self.directory)!r})"

    # -- files -----------------------------------------------------------------------
    def _path(self, key: str, byte_range: ByteRequest | None) -> Path:
        # zarr keys are '/'-separated relative names ('observation/c/0/0/0'); '..' never occurs.
        return self.root / "objects" / f"{key}@{_range_suffix(byte_range)}"

    def _write(self, path: Path, data: bytes) -> None:
        """Keep ``data`` at ``path``; a cache that cannot be written is skipped from then on,
        with one warning (the reads it would have served go to the remote)."""
        if not self.writable:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_whole(path, data)
        except OSError as exc:
            self.writable = False
            warnings.warn(
                f"the cache {self.directory} of {self.url} cannot be written "
                f"({exc.strerror or exc}); reading on without it. Free space there, or "
                f"choose another cache= directory",
                RuntimeWarning,
                stacklevel=2,
            )

    def _check_fingerprint(self, meta: bytes) -> None:
        """Empty this store's cache if the remote root metadata changed."""
        digest = hashlib.sha256(meta).hexdigest()
        marker = self.root / _FINGERPRINT
        try:
            old = marker.read_text()
        except FileNotFoundError:
            old = None
        if old == digest:
            return
        if old is not None:
            log.info("%s changed since it was cached; emptying %s", self.url, self.root)
            shutil.rmtree(self.root / "objects", ignore_errors=True)
        self._write(marker, digest.encode())

    # -- reads -----------------------------------------------------------------------
    async def get(self, key: str, prototype: Any, byte_range: ByteRequest | None = None) -> Any:
        if key == _ROOT_META:
            # always from the remote: it decides whether the cache is still valid
            value = await self._store.get(key, prototype, byte_range)
            if value is not None and byte_range is None:
                self._check_fingerprint(value.to_bytes())
            return value
        if not self.writable:
            # a cache that could not be written may also hold what no longer holds
            return await self._store.get(key, prototype, byte_range)
        path = self._path(key, byte_range)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            pass
        else:
            self.hits += 1
            return prototype.buffer.from_bytes(data)
        self.misses += 1
        value = await self._store.get(key, prototype, byte_range)
        if value is not None:  # absent objects are not cached: they may be written later
            self._write(path, value.to_bytes())
        return value
