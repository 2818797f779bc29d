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
from typing import Any, Protocol, TypeVar

import numpy as np

from atari_zarr.errors import TooManyOpenFilesError
from atari_zarr.forks import after_fork
from atari_zarr.storage.filesystem import not_regular_error, path_kind
from atari_zarr.storage.ranges import ByteRange

T = TypeVar("T")

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
    """Descriptors the process's maps hold at most (one a map): :data:`MAX_MAPS`, or
    the soft limit of open files (``RLIMIT_NOFILE``) less a quarter of it (at least 64)
    where that is lower, so the maps of a 50M-transition store (12,207 frame shards)
    or of hundreds of stores never exhaust the descriptors of a process under ``ulimit
    -n 1024`` (768 maps; fewer maps open more files again, which costs: keep the limit
    above the shards read).

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


class _Descriptors:
    """The descriptors the maps of this process hold, counted as the kernel counts them.

    A map holds one (CPython before 3.13 keeps a duplicate of its file's descriptor for
    as long as the map lives, whoever holds it: the process's list, a batch being
    decoded, a slice handed out), and a file being mapped holds two. Every change is
    made with ``_MAPS_LOCK`` held; a map's finalizer gives its descriptor back to the
    count that took it.
    """

    def __init__(self) -> None:
        self.held = 0

    def release(self, n: int = 1) -> None:
        with _MAPS_LOCK:
            self.held -= n


_DESCRIPTORS = _Descriptors()
#: What :meth:`LocalBytes._entry` answers for an object it read without keeping a map:
#: the descriptors the maps hold reached :func:`map_limit` (the caller reads it by
#: ranges, :func:`_read_range`).
_UNMAPPED: tuple[None, int] = (None, 0)


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
    """A reader is gone (or let its maps go): its maps go too."""
    with _MAPS_LOCK:
        for name in list(names):
            _MAPS.pop((reader, name), None)
            _left((reader, name))
        names.clear()


def _make_room(limit: int, need: int) -> bool:
    """Let maps go, least recently used first, until ``need`` more descriptors fit under
    ``limit`` (called with ``_MAPS_LOCK`` held). False where they still do not: the
    maps left are held by reads under way, which let them go when done."""
    while _DESCRIPTORS.held + need > limit and _MAPS:
        # the map's finalizer runs here where nothing else holds it (reentrant lock)
        _left(_MAPS.popitem(last=False)[0])
    return _DESCRIPTORS.held + need <= limit


def _open_limit() -> str:
    """The soft limit of open files, for messages."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return "its limit"
    return "no limit" if soft == resource.RLIM_INFINITY else f"its limit of {soft}"


def _too_many_files(path: Path) -> TooManyOpenFilesError:
    """The one-line error of a file that cannot be opened: the process has no descriptor
    left, although the maps let theirs go."""
    return TooManyOpenFilesError(
        f"{path}: cannot be opened: this process has {_open_limit()} open files in use "
        f"(ulimit -n), the maps of store shards holding {_DESCRIPTORS.held} of them (at "
        f"most {map_limit()}). Raise the limit (`ulimit -n 4096` in the shell that starts "
        f"the job, or resource.setrlimit(resource.RLIMIT_NOFILE, ...)), or close other files"
    )


def _with_room(path: Path, call: Callable[[], T]) -> T:
    """``call()``; where the process has no descriptor left (EMFILE, ENFILE), the maps are
    let go and it is tried once more, then one line (:func:`_too_many_files`)."""
    for attempt in range(2):
        try:
            return call()
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            if attempt:
                raise _too_many_files(path) from None
            with _MAPS_LOCK:  # the rest of the process took descriptors: maps give way
                _make_room(0, 0)
    raise AssertionError("unreachable")  # pragma: no cover


def _opened(path: Path) -> tuple[int, os.stat_result] | None:
    """A descriptor of regular file ``path`` and its status (None: absent), never
    following a link nor blocking (a FIFO would hang the read for ever, a device such as
    /dev/zero read without end); anything but a regular file is one line. The caller
    closes the descriptor."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = _with_room(path, lambda: os.open(path, flags))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise not_regular_error(path, "a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular_error(path, path_kind(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_range(path: Path, start: int | None, stop: int | None) -> bytes | None:
    """Bytes ``[start:stop]`` of the file at ``path`` (slice rules, a negative start from
    its end), read with a descriptor closed at once (None: absent)."""
    opened = _opened(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        a, b, _ = slice(start, stop).indices(st.st_size)
        return os.pread(fd, max(0, b - a), a)
    finally:
        os.close(fd)


def _new_lock_after_fork() -> None:
    """A child forked while a thread held the lock gets one nobody holds."""
    global _MAPS_LOCK
    _MAPS_LOCK = threading.RLock()


after_fork(_new_lock_after_fork)


class LocalBytes:
    """Byte ranges of files under a LocalStore, through memory maps kept open.

    The maps of every store this process reads are kept in one place, their
    descriptors up to :func:`map_limit` in all (least recently used dropped first):
    where the limit of open files allows, every frame shard of a 50M-transition store
    (12,207) stays mapped, so random reads never reopen a file (about 20 µs each), and
    a mixture of hundreds of stores stays well under the kernel's 65,530 maps per
    process. On CPython before 3.13 a map also holds a duplicate of its file's
    descriptor for as long as anything holds the map (a batch being decoded, a slice
    handed out), so the descriptors are counted as the kernel counts them: one per
    live map, two while a file is mapped. Maps are let go before one more would pass
    the bound; where the maps still held by reads under way leave no room, an object
    is read by ranges (a descriptor closed at once) instead. Where the rest of the
    process took the descriptors the maps leave it (a quarter of the open files, at
    least 64) and the kernel says so, maps are let go and the open tried once more,
    else :class:`~atari_zarr.errors.TooManyOpenFilesError` names the file, the limit
    and what to do.
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

    def _entry(
        self, key: str, table: MapTable | None = None, number: int = 0
    ) -> tuple[mmap.mmap | bytes | None, int]:
        """Object ``key``'s map and the address of its first byte, opened if need be;
        row ``number`` of ``table`` holds them as long as the process keeps the map.

        :data:`_UNMAPPED` where the descriptors the maps hold, counted as the kernel
        counts them, leave none for another map although every map the process keeps
        was let go (the others are held by reads under way): the caller reads the
        object by ranges."""
        name = (self._id, key)  # no path built per read: a hit costs a dict lookup
        with _MAPS_LOCK:
            if name in self._maps:
                self._maps.move_to_end(name)
                entry = self._maps[name]
                if table is not None:
                    table._hold(name, number, entry)
                return entry
        path = self.root / key
        self._check_dirs(key)
        limit = map_limit()
        with _MAPS_LOCK:  # the descriptors of the file and of its map, taken beforehand
            room = _make_room(limit, 2)
            if room:
                _DESCRIPTORS.held += 2
        if not room:
            return _UNMAPPED
        mm: mmap.mmap | bytes | None = None
        try:
            mm = self._mapped(path)
        finally:
            # the file's descriptor is closed; the map's is held until the map goes
            if isinstance(mm, mmap.mmap):
                weakref.finalize(mm, _DESCRIPTORS.release)
                _DESCRIPTORS.release(1)
            else:
                _DESCRIPTORS.release(2)
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

    @staticmethod
    def _mapped(path: Path) -> mmap.mmap | bytes | None:
        """The map of regular file ``path`` (``b""``: empty; None: absent). Where the
        process has no descriptor left, maps are let go and it is tried once more."""
        opened = _opened(path)
        if opened is None:
            return None
        fd, st = opened
        try:
            if not st.st_size:
                return b""  # empty file: reported as too short by the caller
            return _with_room(path, lambda: mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
        finally:
            os.close(fd)

    def mapped(self, key: str) -> mmap.mmap | bytes | None:
        """The whole object ``key``, memory-mapped (None: absent, or not mapped because the
        maps hold every descriptor they may: read it with :meth:`get`): slice it for a
        range."""
        return self._entry(key)[0]

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

    def forget_all(self) -> None:
        """Drop every map of this reader (its store is closed): their descriptors close
        once no read under way holds them, and the next read opens them again."""
        _drop_maps(self._id, self._names)

    def get(self, ranges: Sequence[ByteRange]) -> list[Any]:
        out: list[Any] = []
        for key, start, stop in ranges:
            entry = self._entry(key)
            if entry is _UNMAPPED:  # no descriptor to spare for a map: the range alone
                out.append(_read_range(self.root / key, start, stop))
            elif entry[0] is None:
                out.append(None)
            else:
                out.append(memoryview(entry[0])[start:stop])
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

    def discard(self, key: str) -> str:
        """Throw away what the store keeps of object ``key`` on local disk (it failed a
        check): a local cache of whole objects (``discard``) fetches it anew at the next
        read. What a message of the same failure then adds ("" where nothing was kept)."""
        discard = getattr(self.store, "discard", None)
        return str(discard(key)) if discard is not None else ""

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
