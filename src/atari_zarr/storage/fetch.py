"""Where chunk bytes come from: memory maps of a local store, or a zarr store's ``get``.

:func:`byte_source` gives the one object the engine (:mod:`atari_zarr.storage.engine`)
asks for bytes: ``get(ranges)`` takes a batch of :class:`~atari_zarr.storage.ranges.ByteRange`
and returns, in the same order, the bytes of each (a read-only buffer) or None where
the object does not exist.

* :class:`LocalBytes` serves a :class:`zarr.storage.LocalStore` from memory maps
  kept open: a range costs a slice, no system call.
* :class:`StoreBytes` serves any other zarr store (remote ones through
  :class:`~atari_zarr.storage.remote.RemoteStore`) through the store's asynchronous
  ``get``: a batch of ranges is one round of concurrent requests.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import mmap
import os
import stat
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from atari_zarr.forks import after_fork
from atari_zarr.storage.filesystem import not_regular_error, path_kind
from atari_zarr.storage.ranges import ByteRange

__all__ = ["MAX_OBJECT_BYTES", "ByteSource", "LocalBytes", "MapTable", "StoreBytes", "byte_source"]


class ByteSource(Protocol):
    """What the engine needs of a store: byte ranges, a batch at a time."""

    #: True when a request costs a round trip (merging ranges pays).
    remote: bool

    def get(self, ranges: Sequence[ByteRange]) -> list[Any]:
        """The bytes of each range (None where the object is absent), in order."""


#: Memory maps kept open by the process at most, whatever the number of stores it reads.
MAX_MAPS = 16384
#: Open files left to the rest of the process (at least 64): CPython before 3.13 keeps a
#: duplicate of a mapped file's descriptor for as long as the map lives.
FD_RESERVE_SHARE = 4


def map_limit() -> int:
    """Maps the process keeps: :data:`MAX_MAPS`, or the soft limit of open files
    (``RLIMIT_NOFILE``) less a quarter of it (at least 64) where that is lower, so the
    maps of a 50M-transition store (12,207 frame shards) or of hundreds of stores never
    exhaust the descriptors of a process under ``ulimit -n 1024`` (768 maps; fewer maps
    open more files again, which costs: keep the limit above the shards read).

    Examples
    --------
    >>> 16 <= map_limit() <= MAX_MAPS
    True
    """
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return MAX_MAPS
    if soft == resource.RLIM_INFINITY:
        return MAX_MAPS
    reserve = max(64, int(soft) // FD_RESERVE_SHARE)
    return max(16, min(MAX_MAPS, int(soft) - reserve))


#: Every reader's maps, least recently used first, by (reader, key in its store): a
#: reader opened after a store was written again never sees the maps of the files it
#: replaced.
#: Each entry is the map (None: the object is absent) and the address of its first byte
#: (0 where there is none), for a compiled loop that reads it.
_MAPS: OrderedDict[tuple[int, str], tuple[mmap.mmap | bytes | None, int]] = OrderedDict()
# Reentrant: a reader's finalizer (_drop_maps) may run in the middle of any call that
# holds it, when an allocation there sets off the garbage collector.
_MAPS_LOCK = threading.RLock()
_READERS = itertools.count()
#: The map tables (:class:`MapTable`) that hold a row of each entry of ``_MAPS``: an
#: entry that leaves ``_MAPS`` empties those rows (:func:`_left`), so no table keeps a
#: map, or its descriptor, the process has let go.
_WATCHERS: dict[tuple[int, str], list[tuple[weakref.ref[MapTable], int]]] = {}


_UNSEEN = object()


def _address(mm: Any) -> int:
    """The address of the first byte of map ``mm`` (0: none); a map never moves."""
    return int(np.frombuffer(mm, dtype=np.uint8).ctypes.data) if mm else 0


def _left(name: tuple[int, str]) -> None:
    """Entry ``name`` has left ``_MAPS``: the table rows that held it are emptied
    (called with ``_MAPS_LOCK`` held)."""
    for ref, number in _WATCHERS.pop(name, ()):
        table = ref()
        if table is not None:
            table._empty(number)


def _drop_maps(reader: int, names: set[str]) -> None:
    """A reader is gone: its maps go too."""
    with _MAPS_LOCK:
        for name in names:
            _MAPS.pop((reader, name), None)
            _left((reader, name))


def _new_lock_after_fork() -> None:
    """A child forked while a thread held the lock gets one nobody holds."""
    global _MAPS_LOCK
    _MAPS_LOCK = threading.RLock()


after_fork(_new_lock_after_fork)


class LocalBytes:
    """Byte ranges of files under a LocalStore, through memory maps kept open.

    The maps of every store this process reads are kept in one place, up to
    :func:`map_limit` in all (least recently used dropped first): where the limit of
    open files allows, every frame shard of a 50M-transition store (12,207) stays
    mapped, so random reads never reopen a file (about 20 µs each), and a mixture of
    hundreds of stores stays well under the kernel's 65,530 maps per process. On
    CPython before 3.13 a map also holds a duplicate of its file's descriptor, so the
    maps leave a quarter of the process's open files (at least 64) to the rest of it.
    """

    remote = False

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._maps = _MAPS
        self._id = next(_READERS)
        self._names: set[str] = set()
        weakref.finalize(self, _drop_maps, self._id, self._names)
        #: Directories inside the store found to be directories, not links.
        self._plain_dirs: set[str] = set()

    def _check_dirs(self, key: str) -> None:
        """Refuse a key under a directory of the store that is a symbolic link (``c/``)."""
        parts = key.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if prefix in self._plain_dirs:
                continue
            path = self.root / prefix
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return  # the object is absent: the caller says so
            if stat.S_ISLNK(mode):
                raise not_regular_error(path, "a symbolic link (a directory of the store)")
            self._plain_dirs.add(prefix)

    def _map(self, key: str) -> mmap.mmap | bytes | None:
        return self._entry(key)[0]

    def _entry(
        self, key: str, table: MapTable | None = None, number: int = 0
    ) -> tuple[mmap.mmap | bytes | None, int]:
        """Object ``key``'s map and the address of its first byte, opened if need be;
        row ``number`` of ``table`` holds them as long as the process keeps the map."""
        name = (self._id, key)  # no path built per read: a hit costs a dict lookup
        with _MAPS_LOCK:
            if name in self._maps:
                self._maps.move_to_end(name)
                entry = self._maps[name]
                if table is not None:
                    table._hold(name, number, entry)
                return entry
        mm: mmap.mmap | bytes | None
        path = self.root / key
        self._check_dirs(key)
        try:
            # never a symlink, never blocking: a FIFO would hang the read for ever and
            # a device (/dev/zero) would read without end
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            mm = None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise not_regular_error(path, "a symbolic link") from None
            raise
        else:
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise not_regular_error(path, path_kind(st.st_mode))
                mm = (
                    mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                    if st.st_size
                    else b""  # empty file: reported as too short by the caller
                )
            finally:
                os.close(fd)
        limit = map_limit()
        entry = (mm, _address(mm))
        with _MAPS_LOCK:
            if name in self._maps:  # another thread opened it meanwhile: one map kept
                _left(name)
            self._maps[name] = entry
            self._names.add(key)
            if table is not None:
                table._hold(name, number, entry)
            while len(self._maps) > limit:
                # Dropping the reference is enough: slices handed out keep their map alive.
                _left(self._maps.popitem(last=False)[0])
        return entry

    def mapped(self, key: str) -> mmap.mmap | bytes | None:
        """The whole object ``key``, memory-mapped (None: absent): slice it for a range."""
        return self._map(key)

    def mapped_at(self, keys: Sequence[str]) -> tuple[list[Any], list[int]]:
        """The maps of objects ``keys`` and the address of each map's first byte (0 where
        the object is absent or empty), for a compiled loop that reads them: the caller
        holds the maps until it is done with the addresses."""
        names = [(self._id, key) for key in keys]
        kept = self._maps
        with _MAPS_LOCK:  # once for all: the maps already open, each moved to the end
            found: list[Any] = [kept.get(name, _UNSEEN) for name in names]
            for name, entry in zip(names, found, strict=True):
                if entry is not _UNSEEN:
                    kept.move_to_end(name)
        for i, entry in enumerate(found):
            if entry is _UNSEEN:
                found[i] = self._entry(keys[i])
        return [e[0] for e in found], [e[1] for e in found]

    def forget(self, key: str) -> None:
        """Drop the map of ``key`` (the object was replaced): the next read opens it again."""
        with _MAPS_LOCK:
            self._maps.pop((self._id, key), None)
            _left((self._id, key))

    def get(self, ranges: Sequence[ByteRange]) -> list[Any]:
        out: list[Any] = []
        for key, start, stop in ranges:
            mm = self._map(key)
            if mm is None:
                out.append(None)
            else:
                out.append(memoryview(mm)[start:stop])
        return out


class MapTable:
    """The maps of numbered objects (shards) of any number of stores, as arrays.

    Each store's objects take consecutive rows (:meth:`add`). :meth:`at` answers for
    any number of rows with a few array steps and one lock: no key built and no
    dictionary entry touched per object, whatever the number of stores. The rows
    follow the process's maps (:func:`map_limit`): an object is opened the first time
    its row is asked for, through its store's :class:`LocalBytes`, and its row is
    emptied when the process lets its map go, so the table never keeps a map, or a
    descriptor, beyond the limit. Maps found through the table are not moved to the
    recent end of the process's list: under the limit that order is never used, and
    beyond it a map let go early is opened again (about 20 µs).

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / "s0").write_bytes(b"abc")
    >>> table = MapTable()
    >>> table.add(LocalBytes(root), lambda i: f"s{i}", 2)
    0
    >>> maps, addrs, sizes = table.at(np.array([0, 1]))
    >>> bytes(maps[0]), sizes.tolist(), bool(addrs[0]), int(addrs[1])
    (b'abc', [3, 0], True, 0)
    """

    def __init__(self) -> None:
        self._me = weakref.ref(self)
        #: Whether each row is filled (its map kept by the process, or its object absent).
        self.known = np.zeros(0, dtype=bool)
        #: Address of each object's first byte, and its length (0: absent or empty).
        self.addr = np.zeros(0, dtype=np.uint64)
        self.size = np.zeros(0, dtype=np.uint64)
        self._maps = np.full(0, None, dtype=object)
        self._rows = 0
        # each store's first row, and the store with the key of each of its objects
        self._firsts: list[int] = []
        self._stores: list[tuple[LocalBytes, Callable[[int], str]]] = []

    def add(self, source: LocalBytes, key_of: Callable[[int], str], n: int) -> int:
        """Objects ``key_of(0) .. key_of(n - 1)`` of store ``source`` take the next ``n``
        rows: the first of them."""
        with _MAPS_LOCK:
            first = self._rows
            self._rows += n
            if self._rows > len(self.known):
                size = max(self._rows, 2 * len(self.known))
                self.known = _grown(self.known, size, False)
                self.addr = _grown(self.addr, size, 0)
                self.size = _grown(self.size, size, 0)
                self._maps = _grown(self._maps, size, None)
            self._firsts.append(first)
            self._stores.append((source, key_of))
            return first

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(maps, addresses, sizes)`` of the objects of ``rows``, opened as need be.

        The maps are held by the returned array: keep it until done with the
        addresses. An address is 0 where the object is absent or empty, or where its
        map was let go between opening and answering (the caller reads it another way).
        """
        rows = np.asarray(rows, dtype=np.int64)
        with _MAPS_LOCK:
            unknown = rows[~self.known[rows]]
        if unknown.size:
            which = np.searchsorted(self._firsts, unknown, side="right") - 1
            for row, k in zip(unknown.tolist(), which.tolist(), strict=True):
                source, key_of = self._stores[k]
                source._entry(key_of(row - self._firsts[k]), self, row)
        with _MAPS_LOCK:
            return self._maps[rows], self.addr[rows], self.size[rows]

    def _hold(self, name: tuple[int, str], row: int, entry: tuple[Any, int]) -> None:
        """Row ``row`` holds ``entry``, the process's map ``name`` (lock held)."""
        if not self.known[row]:
            _WATCHERS.setdefault(name, []).append((self._me, row))
        mm, addr = entry
        self._maps[row] = mm
        self.addr[row] = addr
        self.size[row] = len(mm) if mm else 0
        self.known[row] = True

    def _empty(self, row: int) -> None:
        """Row ``row``'s map was let go (lock held)."""
        self.known[row] = False
        self.addr[row] = 0
        self.size[row] = 0
        self._maps[row] = None


def _grown(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    """``a`` followed by ``fill`` up to ``n`` rows."""
    out = np.full((n, *a.shape[1:]), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


#: The most bytes an object can have: the largest file offset (``off_t``), far above any
#: bucket's limit.
MAX_OBJECT_BYTES = 2**63 - 1


class StoreBytes:
    """Byte ranges through any zarr store's asynchronous API, gathered concurrently."""

    remote = True

    def __init__(self, store: Any) -> None:
        self.store = store

    def forget(self, key: str) -> None:
        """Nothing is kept per object here."""

    async def aget(self, ranges: Sequence[ByteRange]) -> list[Any]:
        """:meth:`get`, on the caller's event loop."""
        from zarr.abc.store import RangeByteRequest, SuffixByteRequest
        from zarr.core.buffer import default_buffer_prototype

        proto = default_buffer_prototype()

        async def one(r: ByteRange) -> Any:
            rng: RangeByteRequest | SuffixByteRequest | None
            if r.start is None:
                rng = None
            elif r.start < 0:
                rng = SuffixByteRequest(-r.start)
            else:
                assert r.stop is not None
                # a crafted shard index may ask for any range: none lies past the largest
                # file offset, so no request asks for such bytes (a server ignores the
                # header and sends the whole object, a file's pread overflows); nothing
                # is there, as nothing is in an empty range, so the caller sees it cut short
                stop = min(r.stop, MAX_OBJECT_BYTES)
                if stop <= r.start:
                    return np.empty(0, dtype=np.uint8)
                rng = RangeByteRequest(r.start, stop)
            buf = await self.store.get(r.key, prototype=proto, byte_range=rng)
            return None if buf is None else buf.as_numpy_array()

        return list(await asyncio.gather(*(one(r) for r in ranges)))

    def get(self, ranges: Sequence[ByteRange]) -> list[Any]:
        from zarr.core.sync import sync

        if not ranges:
            return []
        return sync(self.aget(ranges))


def byte_source(store: Any) -> LocalBytes | StoreBytes:
    """The byte source of a zarr store: memory maps for a local one, its ``get`` otherwise."""
    from zarr.storage import LocalStore

    if isinstance(store, LocalStore):
        return LocalBytes(Path(store.root))
    return StoreBytes(store)
