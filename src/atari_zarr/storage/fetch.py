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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from atari_zarr.forks import after_fork
from atari_zarr.storage.filesystem import not_regular_error, path_kind
from atari_zarr.storage.ranges import ByteRange

__all__ = ["ByteSource", "LocalBytes", "StoreBytes", "byte_source"]


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
_MAPS_LOCK = threading.Lock()
_READERS = itertools.count()


_UNSEEN = object()


def _address(mm: Any) -> int:
    """The address of the first byte of map ``mm`` (0: none); a map never moves."""
    return int(np.frombuffer(mm, dtype=np.uint8).ctypes.data) if mm else 0


def _drop_maps(reader: int, names: set[str]) -> None:
    """A reader is gone: its maps go too."""
    with _MAPS_LOCK:
        for name in names:
            _MAPS.pop((reader, name), None)


def _new_lock_after_fork() -> None:
    """A child forked while a thread held the lock gets one nobody holds."""
    global _MAPS_LOCK
    _MAPS_LOCK = threading.Lock()


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

    def _entry(self, key: str) -> tuple[mmap.mmap | bytes | None, int]:
        """Object ``key``'s map and the address of its first byte, opened if need be."""
        name = (self._id, key)  # no path built per read: a hit costs a dict lookup
        with _MAPS_LOCK:
            if name in self._maps:
                self._maps.move_to_end(name)
                return self._maps[name]
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
            self._maps[name] = entry
            self._names.add(key)
            while len(self._maps) > limit:
                # Dropping the reference is enough: slices handed out keep their map alive.
                self._maps.popitem(last=False)
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

    def get(self, ranges: Sequence[ByteRange]) -> list[Any]:
        out: list[Any] = []
        for key, start, stop in ranges:
            mm = self._map(key)
            if mm is None:
                out.append(None)
            else:
                out.append(memoryview(mm)[start:stop])
        return out


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
                rng = RangeByteRequest(r.start, r.stop)
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
