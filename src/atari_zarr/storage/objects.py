"""Whole objects of a remote store kept on local disk: :class:`ObjectCacheStore`.

A store on the Hugging Face Hub is read through this cache (see
:mod:`atari_zarr.storage.hub` for why): the first byte range asked of an object fetches
the whole object with one request, checks it, and keeps it as one file; every later
range of it, in this process or another, is read from that file.

The design, in the order a read meets it:

* **Where.** ``$ATARI_ZARR_HOME/objects/`` (``~/.cache/atari_zarr/objects`` by default,
  and there too when ``$ATARI_ZARR_HOME`` is a bucket), one folder per host, repo and
  *commit*: an object is kept under the commit it was read at, so it never changes and
  is never checked for staleness.
* **Complete or absent.** An object is written to a temporary name in its folder and
  renamed into place after its length and checksum were checked. A file under an
  object's name is always a whole, checked object, whatever was killed when; a killed
  download leaves only its temporary file, which the next eviction pass removes.
* **Once across processes.** A download holds an ``flock`` on the object's lock file
  (the kernel releases it when its process dies, ``kill -9`` included); another process
  that wants the same object waits for the lock, then finds the file. Within a
  process, concurrent readers of one object share one download.
* **Bounded.** At most ``$ATARI_ZARR_OBJECT_CACHE_SIZE`` bytes (``"20G"``, ``"500M"``;
  default 50 GiB, or half the free space where that is less) across every repo. A
  process that has added a twentieth of the bound since its last pass scans the cache
  under a lock and removes the least recently used objects down to nine tenths of it.
  An object removed while another process wanted it is fetched again; one being read
  stays readable (POSIX keeps an unlinked file while it is open). An object larger than
  nine tenths of the bound is never kept: it is served as fetched, then read as byte
  ranges from the Hub, as with the cache off (a bound below one object reads through).
  A value that is no size (``nan``, ``inf``, ``-5G``) is refused in one line.
* ``ATARI_ZARR_OBJECT_CACHE_SIZE=0`` turns it off: reads go to the Hub as byte ranges.

Examples
--------
>>> parse_size("20G"), parse_size("512M"), parse_size("0")
(21474836480, 536870912, 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import math
import os
import shutil
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store

from atari_zarr.errors import InvalidArgumentError, StoreWriteError
from atari_zarr.forks import after_fork
from atari_zarr.storage.cache import PART_PREFIX, ReadThroughStore, write_whole
from atari_zarr.storage.paths import cache_home, is_url

__all__ = ["SIZE_ENV", "ObjectCacheStore", "cache_bound", "objects_root", "parse_size"]

log = logging.getLogger("atari_zarr")

#: Environment variable bounding the object cache (bytes, with K, M, G or T; 0: off).
SIZE_ENV = "ATARI_ZARR_OBJECT_CACHE_SIZE"
_DEFAULT_BOUND = 50 << 30
_LOCK = ".lock"
# a temporary file this old belongs to a download that died
_STALE_PART = 3600.0
# seconds a reader waits for another process's download of an object: what one fetch
# may take by default (ATARI_ZARR_TIMEOUT's default), and as much again
_LOCK_WAIT = 120.0
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in ``"20G"``, ``"500M"``, ``"1048576"`` (units of 1024; 0 turns the cache off).

    Raises
    ------
    InvalidArgumentError
        Not a finite number of bytes of 0 or more (``nan``, ``inf``, ``-5G``, ``lots``),
        in one line naming :data:`SIZE_ENV` and its value.
    """
    value = str(text).strip().upper().removesuffix("B").removesuffix("I")
    number, unit = value.rstrip("KMGT"), value[len(value.rstrip("KMGT")) :]
    try:
        size = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        size = math.nan
    if not math.isfinite(size) or size < 0:
        raise InvalidArgumentError(
            f"{SIZE_ENV}={text!r} is not a size: expected bytes of 0 or more, alone or with "
            f"K, M, G or T (e.g. 20G; 0 turns the cache off). Set it to the disk space the "
            f"cache of Hub objects may use, or unset it for the default"
        )
    return int(size)


def objects_root() -> Path:
    """Where whole objects are kept: ``$ATARI_ZARR_HOME/objects`` when that is local."""
    home = cache_home()
    if is_url(home):
        home = os.path.expanduser(os.path.join("~", ".cache", "atari_zarr"))
    return Path(home) / "objects"


def cache_bound(root: Path) -> int:
    """The cache's bound: ``$ATARI_ZARR_OBJECT_CACHE_SIZE``, else 50 GiB or half the space
    free under ``root``, whichever is less."""
    given = os.environ.get(SIZE_ENV, "").strip()
    if given:
        return parse_size(given)
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return _DEFAULT_BOUND
    return int(min(_DEFAULT_BOUND, free // 2))


def _read_range(found: Path | bytes, byte_range: ByteRequest | None) -> bytes:
    """``byte_range`` of a kept file (or of an object held in memory)."""
    if isinstance(found, bytes):
        start, stop = _bounds(byte_range, len(found))
        return found[start:stop]
    fd = os.open(found, os.O_RDONLY)
    try:
        start, stop = _bounds(byte_range, os.fstat(fd).st_size)
        return os.pread(fd, max(0, stop - start), start)
    finally:
        os.close(fd)


def _bounds(byte_range: ByteRequest | None, size: int) -> tuple[int, int]:
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        start, stop = byte_range.start, byte_range.end
    elif isinstance(byte_range, OffsetByteRequest):
        start, stop = byte_range.offset, size
    else:  # SuffixByteRequest
        start, stop = max(0, size - byte_range.suffix), size
    # past the end (a crafted shard index's offset, up to 2**64): nothing, never a read
    # at an offset ``pread`` cannot take
    start = min(start, size)
    return start, max(start, min(stop, size))


class ObjectCacheStore(ReadThroughStore):
    """Read-only wrapper that reads every object whole, once, into a local directory.

    Parameters
    ----------
    store : zarr.abc.store.Store
        The remote store; listings go to it.
    fetch : callable
        ``await fetch(key)``: the whole object, checked, or None where there is none.
    folder : callable
        ``await folder()``: the object's folder under the cache's root (a repo at a commit).
    name : str
        The store, for messages (no credentials).
    root : path, optional
        The cache's root (default :func:`objects_root`).

    Attributes
    ----------
    hits, fetched : int
        Ranges read from kept objects, objects fetched (this process).

    Examples
    --------
    >>> import tempfile, zarr
    >>> from zarr.storage import MemoryStore
    >>> remote = MemoryStore()
    >>> zarr.create_array(remote, shape=(8,), chunks=(4,), dtype="int8")[:] = 1
    >>> async def fetch(key):  # the whole object, as one request brings it
    ...     found = await remote.get(key, zarr.core.buffer.default_buffer_prototype())
    ...     return None if found is None else found.to_bytes()
    >>> async def folder():
    ...     return "host/datasets/org/x/0123abcd"
    >>> cached = ObjectCacheStore(remote, fetch, folder, "memory://x", tempfile.mkdtemp())
    >>> array = zarr.open_array(cached, mode="r", zarr_format=3)
    >>> int(array[:].sum()), int(array[1:3].sum()), cached.fetched
    (8, 2, 3)
    """

    #: Ranges are read from local files: the chunk engine merges none of them.
    local_ranges = True

    def __init__(
        self,
        store: Store,
        fetch: Callable[[str], Awaitable[bytes | None]],
        folder: Callable[[], Awaitable[str]],
        name: str,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(store)
        self._fetch, self._folder, self.name = fetch, folder, name
        self.root = Path(root) if root is not None else objects_root()
        self.bound = cache_bound(self.root)
        self.hits = self.fetched = 0
        self.writable = True
        self._inflight: dict[str, asyncio.Future[Path | bytes | None]] = {}
        self._touched: set[str] = set()
        # objects larger than the bound keeps: read through as byte ranges
        self._unkept: set[str] = set()
        # the folder of this store's objects, once a read asked for it
        self._where: str | None = None
        self._state_lock = threading.Lock()
        after_fork(self._after_fork)

    def _after_fork(self) -> None:
        self._inflight = {}
        self._state_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "store": self._store,
            "fetch": self._fetch,
            "folder": self._folder,
            "name": self.name,
            "root": str(self.root),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["store"], state["fetch"], state["folder"], state["name"], state["root"]
        )

    def __repr__(self) -> str:
        return f"ObjectCacheStore({self.name!r}, root={str(self.root)!r})"

    def with_read_only(self, read_only: bool = False) -> ObjectCacheStore:
        if not read_only:
            raise ValueError(f"{self.name} is read through a cache of its objects: read-only")
        return self

    def _with_store(self, store: Store) -> ObjectCacheStore:  # pragma: no cover - zarr internal
        return ObjectCacheStore(store, self._fetch, self._folder, self.name, self.root)

    # -- reads ----------------------------------------------------------------------------
    def _through(self, key: str) -> bool:
        """Whether ``key`` is read from the remote store as byte ranges: the cache off or
        unwritable, or the object larger than the bound keeps."""
        return self.bound <= 0 or not self.writable or key in self._unkept

    async def get(self, key: str, prototype: Any, byte_range: ByteRequest | None = None) -> Any:
        if self._through(key):
            return await self._store.get(key, prototype, byte_range)
        for _ in range(3):  # an object evicted between finding and reading it comes again
            found = await self.local(key)
            if found is None:
                return None
            try:
                data = _read_range(found, byte_range)
            except FileNotFoundError:
                continue
            self.hits += 1
            return prototype.buffer.from_bytes(data)
        # other processes evict it as fast as it comes (a bound of a few objects shared by
        # many readers): this range is read through, as with the cache off
        log.debug("%s/%s: evicted as fast as it was fetched; read through", self.name, key)
        return await self._store.get(key, prototype, byte_range)

    async def exists(self, key: str) -> bool:
        if self._through(key):
            return await self._store.exists(key)
        return await self.local(key) is not None

    async def local(self, key: str) -> Path | bytes | None:
        """The local file of object ``key``, fetched first if not kept; None: none upstream
        (the object itself where the cache could not keep it)."""
        parts = key.split("/")
        if key.startswith("/") or ".." in parts or "" in parts:
            # what a hostile zarr.json could name: never a path out of the cache
            raise OSError(errno.EINVAL, f"{self.name}/{key}: not an object's key in a store")
        self._where = await self._folder()
        path = self.root / self._where / key
        if path.is_file():
            self._touch(path)
            return path
        loop = asyncio.get_running_loop()
        with self._state_lock:
            pending = self._inflight.get(key)
            if pending is None or pending.get_loop() is not loop:
                pending = loop.create_future()
                self._inflight[key] = pending
                mine = True
            else:
                mine = False
        if not mine:
            return await asyncio.shield(pending)
        try:
            found = await self._bring(key, path)
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: no "never retrieved" warning when no one waits
            raise
        else:
            pending.set_result(found)
            return found
        finally:
            with self._state_lock:
                if self._inflight.get(key) is pending:
                    del self._inflight[key]

    def discard(self, key: str) -> str:
        """Throw away the kept copy of object ``key``, which failed a check (a crc32c):
        the next read fetches it again. What a message says when the copy fetched again
        fails too ("" where no copy was kept: the object came from the Hub as it is).

        Raises
        ------
        StoreWriteError
            The kept copy cannot be removed: the message names its file.
        """
        if self._through(key) or self._where is None:
            return ""
        path = self.root / self._where / key
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreWriteError(
                f"{self.name}/{key}: the copy kept in the object cache, {path}, fails its "
                f"check and cannot be removed ({exc.strerror or exc}); remove it (or set "
                f"{SIZE_ENV}=0 to read without the cache), then read again"
            ) from None
        self._touched.discard(str(path))
        log.info("%s/%s: the copy kept in %s failed its check; fetching it again",
                 self.name, key, path)  # fmt: skip
        return (
            "The copy kept in the object cache was thrown away and the object fetched "
            "again from the Hub: that copy fails the same check, so the Hub's copy is damaged"
        )

    def _touch(self, path: Path) -> None:
        """Mark ``path`` recently used (once per process: eviction goes by these times)."""
        name = str(path)
        if name in self._touched:
            return
        self._touched.add(name)
        with contextlib.suppress(OSError):
            os.utime(path)

    async def _bring(self, key: str, path: Path) -> Path | bytes | None:
        """Fetch ``key`` into ``path`` under its lock, unless another process did."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(str(path) + _LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            self._unwritable(exc)
            return await self._fetch(key)
        try:
            # another process fetches it: wait for its file, as long as one fetch may take
            # (a process stopped with the lock held is not waited for past that: the object
            # is fetched here too, and the rename keeps one whole copy either way)
            waited_until = time.monotonic() + _LOCK_WAIT
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if path.is_file():
                        return path
                    if time.monotonic() > waited_until:
                        log.debug("%s/%s: its lock is held too long; fetching it", self.name, key)
                        break
                    await asyncio.sleep(0.05)
            if path.is_file():
                return path
            data = await self._fetch(key)
            if data is None:
                return None
            self.fetched += 1
            return self._keep(key, path, data)
        finally:
            os.close(lock)  # releases the flock

    def _keep(self, key: str, path: Path, data: bytes) -> Path | bytes:
        if len(data) > self.bound * 9 // 10:
            # an object the next eviction pass would remove at once (the bound is below
            # one object): served from memory now, read through as ranges from then on
            self._unkept.add(key)
            log.info(
                "%s: an object of %d bytes is larger than %s=%d allows; reading it without "
                "keeping it",
                self.name,
                len(data),
                SIZE_ENV,
                self.bound,
            )
            return data
        try:
            write_whole(path, data)
        except OSError as exc:
            self._unwritable(exc)
            return data
        self._touched.add(str(path))
        self._account(len(data))
        return path

    def _unwritable(self, exc: OSError) -> None:
        if self.writable:
            self.writable = False
            warnings.warn(
                f"the object cache {self.root} cannot be written ({exc.strerror or exc}); "
                f"reading {self.name} on without it. Free space there, set "
                f"{SIZE_ENV} lower, or point ATARI_ZARR_HOME elsewhere",
                RuntimeWarning,
                stacklevel=2,
            )

    # -- the bound ------------------------------------------------------------------------
    _added = 0

    def _account(self, nbytes: int) -> None:
        with self._state_lock:
            self._added += nbytes
            due = self._added >= max(1, self.bound // 20) or self._added == nbytes
            if due:
                self._added = 0
        if due:
            evict(self.root, self.bound)


def evict(root: Path, bound: int) -> int:
    """Remove the least recently used objects under ``root`` down to 9/10 of ``bound``
    (and what killed downloads left); return the bytes kept. One process at a time: a
    pass finding another under way returns at once (-1)."""
    root.mkdir(parents=True, exist_ok=True)
    guard = os.open(root / _LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return -1
        now = time.time()
        kept: list[tuple[float, int, str]] = []
        total = 0
        for folder, _, files in os.walk(root):
            for name in files:
                full = os.path.join(folder, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                if name.startswith(PART_PREFIX) or name.endswith(_LOCK):
                    # a killed download's part; the lock of an object long gone or absent
                    if now - st.st_mtime > _STALE_PART and not (
                        name.endswith(_LOCK) and os.path.exists(full[: -len(_LOCK)])
                    ):
                        with contextlib.suppress(OSError):
                            os.unlink(full)
                    continue
                kept.append((st.st_mtime, st.st_size, full))
                total += st.st_size
        if total <= bound:
            return total
        target = bound * 9 // 10
        for _, size, full in sorted(kept):
            if total <= target:
                break
            with contextlib.suppress(OSError):
                os.unlink(full)
                total -= size
        log.debug("object cache %s: %d bytes kept under a bound of %d", root, total, bound)
        return total
    finally:
        os.close(guard)
