"""Bytes that requests brought, kept in memory so that no byte is fetched twice.

Over a network, the engine (:mod:`atari_zarr.storage.engine`) merges the byte ranges of
nearby chunks into one request (:func:`~atari_zarr.storage.ranges.coalesce_ranges`); a
merged request brings the chunks between the ones asked for too. :class:`KeptBytes`
keeps what each request brought, up to a bound, so that a later batch needing those
chunks takes them from memory instead of fetching them again, and so that a merged
request never spans bytes already held (:meth:`KeptBytes.holds`).

Examples
--------
>>> kept = KeptBytes(max_bytes=1000)
>>> kept.add("s/0", 100, b"x" * 200)
>>> bytes(kept.get("s/0", 150, 160)), kept.get("s/0", 250, 350)
(b'xxxxxxxxxx', None)
>>> kept.holds("s/0", 0, 101), kept.holds("s/0", 300, 400)
(True, False)
"""

from __future__ import annotations

import bisect
import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any

from atari_zarr.forks import after_fork

__all__ = ["DEFAULT_KEPT_BYTES", "KeptBytes", "KeptView"]

#: Default bound on the bytes kept per array: a 1 M-transition Pong store's frames
#: are 48 MB, so its random reads fetch each byte once.
DEFAULT_KEPT_BYTES = 64 << 20


class KeptBytes:
    """Fetched byte ranges of objects, kept up to ``max_bytes`` (least recently used go first).

    Parameters
    ----------
    max_bytes : int
        Bound on the bytes held; 0 keeps nothing. A range larger than the bound is
        not kept.

    Notes
    -----
    Thread-safe: readers drawing batches ahead and fetching chunks ahead share one.
    """

    def __init__(self, max_bytes: int = DEFAULT_KEPT_BYTES) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.nbytes = 0
        # per object: sorted starts, and (start, stop, buffer) in the same order
        self._starts: dict[str, list[int]] = {}
        self._spans: dict[str, list[tuple[int, int, Any]]] = {}
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._lock = threading.Lock()
        # views collected by the garbage collector, left at the next add
        self._gone: list[tuple[str, int]] = []
        after_fork(self._renew_lock)

    def _renew_lock(self) -> None:
        """In a forked child: a lock a fetching thread of the parent held stays held."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._lru)

    def get(self, key: str, start: int, stop: int) -> Any:
        """Bytes ``[start, stop)`` of ``key`` if one kept range holds them all, else None."""
        with self._lock:
            starts = self._starts.get(key)
            if not starts:
                return None
            i = bisect.bisect_right(starts, start) - 1
            if i < 0:
                return None
            s, e, buf = self._spans[key][i]
            if stop > e:
                return None
            self._lru.move_to_end((key, s))
            return buf[start - s : stop - s]

    def holds(self, key: str, start: int, stop: int) -> bool:
        """True when any byte of ``[start, stop)`` of ``key`` is kept."""
        with self._lock:
            starts = self._starts.get(key)
            if not starts or stop <= start:
                return False
            i = bisect.bisect_left(starts, stop) - 1  # last span starting before stop
            return i >= 0 and self._spans[key][i][1] > start

    def add(self, key: str, start: int, data: Any) -> None:
        """Keep ``data``, the bytes of ``key`` from ``start``; kept ranges inside it are dropped."""
        n = len(data)
        if n == 0 or n > self.max_bytes:
            return
        stop = start + n
        with self._lock:
            while self._gone:
                self._leave_locked(*self._gone.pop())
            starts = self._starts.setdefault(key, [])
            spans = self._spans.setdefault(key, [])
            i = bisect.bisect_right(starts, start) - 1
            if i >= 0 and spans[i][1] >= stop:  # already held whole
                return
            lo = bisect.bisect_left(starts, start)
            hi = lo
            while hi < len(spans) and spans[hi][1] <= stop:
                hi += 1
            for s, e, _ in spans[lo:hi]:  # held inside the new range
                self.nbytes -= e - s
                del self._lru[(key, s)]
            starts[lo:hi] = [start]
            spans[lo:hi] = [(start, stop, data)]
            self._lru[(key, start)] = n
            self.nbytes += n
            self._within_bound()

    def forget(self, key: str) -> None:
        """Drop every kept range of ``key`` (its bytes are to be fetched again)."""
        with self._lock:
            self._drop(key)

    def _drop(self, key: str) -> None:
        """Every kept range of ``key`` goes (the lock held)."""
        for s, e, _ in self._spans.pop(key, []):
            self.nbytes -= e - s
            del self._lru[(key, s)]
        self._starts.pop(key, None)

    def _within_bound(self) -> None:
        """The least recently used ranges go until the bound holds (the lock held)."""
        while self.nbytes > self.max_bytes:
            (k, s), size = self._lru.popitem(last=False)
            j = bisect.bisect_left(self._starts[k], s)
            del self._starts[k][j]
            del self._spans[k][j]
            self.nbytes -= size

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._starts.clear()
            self._spans.clear()
            self._lru.clear()
            self.nbytes = 0

    def join(self, nbytes: int) -> KeptView:
        """A view for one more reader (its keys apart from the others'), adding
        ``nbytes`` to the bound; when the view goes, its bytes and its ranges go too."""
        view = KeptView(self, f"{next(_VIEWS)}:")
        with self._lock:
            self.max_bytes += max(0, int(nbytes))
        # a finalizer may run in the middle of any call (the garbage collector): it
        # takes no lock and only leaves a note for the next add
        weakref.finalize(view, self._gone.append, (view.prefix, max(0, int(nbytes))))
        return view

    def _leave_locked(self, prefix: str, nbytes: int) -> None:
        for key in [k for k in self._spans if k.startswith(prefix)]:
            self._drop(key)
        self.max_bytes -= nbytes
        self._within_bound()


_VIEWS = itertools.count()


class KeptView:
    """One reader's part of a :class:`KeptBytes` that several readers share (a
    mixture's stores): the same methods, its keys apart, the bound the sum of theirs.

    Examples
    --------
    >>> shared = KeptBytes(0)
    >>> a, b = shared.join(100), shared.join(100)
    >>> a.add("s/0", 0, b"x" * 150)  # one reader may use the others' room
    >>> bytes(a.get("s/0", 0, 3)), b.get("s/0", 0, 3), shared.max_bytes
    (b'xxx', None, 200)
    """

    def __init__(self, kept: KeptBytes, prefix: str) -> None:
        self.kept = kept
        self.prefix = prefix

    @property
    def max_bytes(self) -> int:
        return self.kept.max_bytes

    @property
    def nbytes(self) -> int:
        return self.kept.nbytes

    def get(self, key: str, start: int, stop: int) -> Any:
        return self.kept.get(self.prefix + key, start, stop)

    def holds(self, key: str, start: int, stop: int) -> bool:
        return self.kept.holds(self.prefix + key, start, stop)

    def add(self, key: str, start: int, data: Any) -> None:
        self.kept.add(self.prefix + key, start, data)

    def forget(self, key: str) -> None:
        self.kept.forget(self.prefix + key)
