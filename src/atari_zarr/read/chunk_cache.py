"""Decoded chunks kept between batches: :class:`ChunkCache`, one slab of chunk slots.

A :class:`~atari_zarr.read.chunks.ChunkReader` keeps the chunks it decoded here, so a
random batch whose chunks are cached is one fancy index over one slab. The cache of a
store read by itself is its own. The stores of one mixture share one cache per
process, sized by the mixture's one budget (:func:`shared_cache`): whichever store a
batch draws from uses the room it needs, a store no batch touches holds nothing, and
the cache grows as misses pay for its pages whatever the number of stores.

* Readers **register** the bytes they bring (a mixture's stores their share of its
  budget): the cache's bound is their sum, and a reader that goes gives its share and
  its chunks back.
* Slots are recycled with the CLOCK policy (an LRU approximation with one reference
  bit per slot); the slots of the batch being served are never recycled.
* Slots are **taken into use as misses pay for them**: a fresh slot's first write
  costs its pages' faults (about 240 µs for a 113 KB chunk here, nine decodes), so the
  cache starts with 128 MB of slots and takes one more per 8 chunks decoded, and a
  short job or a first pass over a store larger than the cache runs as with a small
  cache.

Every method is called with :attr:`ChunkCache.lock` held.

Examples
--------
>>> import numpy as np
>>> cache = ChunkCache((2, 3), np.dtype("uint8"))
>>> token = cache.register(4 * 6, n_chunks=10)
>>> def decode(cids, dests):
...     for c, d in zip(cids, dests):
...         d[...] = c
>>> with cache.lock:
...     slots = cache.slots(token, np.array([3, 7]), decode)
...     [int(cache.slab[s][0, 0]) for s in slots], cache.held(token)
([3, 7], 2)
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["ChunkCache", "shared_cache"]

# The cache starts with this many bytes of slots in use, and takes one more slot per
# _MISSES_PER_SLOT chunks decoded into it (see the module's docstring).
FIRST_ACTIVE_BYTES = 128 << 20
MISSES_PER_SLOT = 8

Decode = Callable[[list[int], list[np.ndarray]], None]


class ChunkCache:
    """Decoded chunks of one shape and dtype, of any number of readers, in one slab.

    Parameters
    ----------
    chunk_shape : tuple of int
        Shape of one decoded chunk.
    dtype : numpy.dtype
        Its dtype.
    """

    def __init__(self, chunk_shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.chunk_shape = tuple(chunk_shape)
        self.dtype = np.dtype(dtype)
        self.chunk_nbytes = int(np.prod(self.chunk_shape)) * self.dtype.itemsize
        #: Held while the cache is used; a reader's own lock is always taken first.
        self.lock = threading.RLock()
        self.slab: np.ndarray | None = None
        #: Bound on the slots, from the readers' registered bytes.
        self.n_slots = 0
        #: Slots in use so far (grows to ``n_slots`` as misses pay for them).
        self.active = 0
        self._limits: dict[int, int] = {}
        #: Per reader, ``table[chunk] - 1`` is the slot holding the chunk (0: none);
        #: zeros come from untouched pages, so a 50M-row store costs no memory here.
        self._tables: dict[int, np.ndarray] = {}
        self._next_token = 0
        self._reader = np.full(0, -1, dtype=np.int64)  # owner of each slot, or -1
        self._chunk = np.full(0, -1, dtype=np.int64)
        self._ref = np.zeros(0, dtype=bool)
        self._epoch = np.zeros(0, dtype=np.int64)
        self._batch = 0
        self._hand = 0
        self._misses = 0
        #: Chunks the last :meth:`slots` decoded.
        self.last_misses = 0

    # -- readers --------------------------------------------------------------------
    def register(self, nbytes: int, n_chunks: int) -> int:
        """A reader of ``n_chunks`` chunks joins, bringing ``nbytes`` of bound; its token."""
        with self.lock:
            token = self._next_token
            self._next_token += 1
            self._limits[token] = int(nbytes)
            self._tables[token] = np.zeros(n_chunks, dtype=np.int32)
            self._resize()
            return token

    def unregister(self, token: int) -> None:
        """A reader goes: its chunks leave the cache and its bytes leave the bound."""
        with self.lock:
            if self._limits.pop(token, None) is None:
                return
            mine = np.flatnonzero(self._reader == token)
            self._reader[mine] = -1
            self._chunk[mine] = -1
            self._ref[mine] = False
            del self._tables[token]
            self._resize()

    def table(self, token: int) -> np.ndarray:
        """Reader ``token``'s chunk-to-slot table (``table[chunk] - 1``; 0: not cached)."""
        return self._tables[token]

    def held(self, token: int) -> int:
        """Chunks of reader ``token`` in the cache."""
        return int((self._reader == token).sum())

    # -- slots ----------------------------------------------------------------------
    def slots(self, token: int, uniq: np.ndarray, decode: Decode) -> np.ndarray:
        """Slots of reader ``token``'s chunks ``uniq`` (unique), decoding the missing ones
        with ``decode(cids, dests)`` straight into their slots."""
        self._batch += 1
        table = self._tables[token]
        slots = table[uniq].astype(np.int64) - 1
        hit = slots >= 0
        self._ref[slots[hit]] = True
        self._epoch[slots[hit]] = self._batch
        miss = np.flatnonzero(~hit)
        self.last_misses = int(miss.size)
        if miss.size:
            self._grow(int(miss.size), len(uniq))
            new = np.array([self._take_slot() for _ in range(miss.size)], dtype=np.int64)
            cids = uniq[miss]
            assert self.slab is not None
            decode(cids.tolist(), [self.slab[s] for s in new.tolist()])
            # only now owned: a decode that failed leaves no half-decoded slot served
            table[cids] = new + 1
            self._reader[new] = token
            self._chunk[new] = cids
            slots[miss] = new
        return slots

    def _grow(self, misses: int, batch_chunks: int) -> None:
        """Take more slots into use: as misses pay for them, and always twice a batch."""
        self._misses += misses
        want = self.active + self._misses // MISSES_PER_SLOT
        self._misses %= MISSES_PER_SLOT
        self.active = min(self.n_slots, max(want, 2 * batch_chunks))

    def _take_slot(self) -> int:
        n = self.active
        while True:
            s = self._hand
            self._hand = (s + 1) % n
            if self._epoch[s] == self._batch:
                continue  # in use by this batch
            if self._ref[s]:
                self._ref[s] = False  # second chance
                continue
            self._evict(np.array([s]))
            self._epoch[s] = self._batch
            return s

    def _evict(self, slots: np.ndarray) -> None:
        for s in slots.tolist():
            owner = int(self._reader[s])
            if owner >= 0:
                self._tables[owner][self._chunk[s]] = 0
        self._reader[slots] = -1
        self._chunk[slots] = -1
        self._ref[slots] = False

    def _resize(self) -> None:
        """Bring the slab to the registered bound, keeping the chunks that still fit."""
        n = sum(self._limits.values()) // self.chunk_nbytes
        n = int(n) if n >= 2 else 0
        if n == self.n_slots:
            return
        keep = min(self.active, n)
        if self.active > n:
            self._evict(np.arange(n, self.active))
        slab: np.ndarray | None = None
        while n:
            try:
                # np.empty of a large size maps pages lazily: memory grows with use.
                slab = np.empty((n, *self.chunk_shape), dtype=self.dtype)
                break
            except MemoryError:  # no room for the address space asked: a smaller cache
                n = n // 2 if n >= 4 else 0
                if keep > n:
                    self._evict(np.arange(n, keep))
                    keep = n
        if keep and slab is not None and self.slab is not None:
            slab[:keep] = self.slab[:keep]
        self.slab = slab
        self._reader = _resized(self._reader[:keep], n, -1)
        self._chunk = _resized(self._chunk[:keep], n, -1)
        self._ref = _resized(self._ref[:keep], n, False)
        self._epoch = _resized(self._epoch[:keep], n, 0)
        first = FIRST_ACTIVE_BYTES // self.chunk_nbytes
        self.n_slots = n
        self.active = min(n, max(2, first, keep))
        self._hand = self._hand % self.active if self.active else 0


def _resized(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    out = np.full(n, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


# One cache per (group, chunk shape, dtype) in this process; a forked child starts
# with none (its readers register again, see ChunkReader).
_SHARED: weakref.WeakValueDictionary[tuple[Any, ...], ChunkCache] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()
_SHARED_PID = os.getpid()


def shared_cache(group: str, chunk_shape: Sequence[int], dtype: np.dtype) -> ChunkCache:
    """The cache this process's readers of ``group`` (one mixture) share for chunks of
    ``chunk_shape`` and ``dtype``; it lives while a reader holds it."""
    global _SHARED, _SHARED_LOCK, _SHARED_PID
    if _SHARED_PID != os.getpid():  # forked: the parent's caches and lock are not ours
        _SHARED, _SHARED_LOCK, _SHARED_PID = weakref.WeakValueDictionary(), threading.Lock(), os.getpid()
    key = (group, tuple(int(x) for x in chunk_shape), np.dtype(dtype).str)
    with _SHARED_LOCK:
        cache = _SHARED.get(key)
        if cache is None:
            cache = ChunkCache(tuple(chunk_shape), np.dtype(dtype))
            _SHARED[key] = cache
        return cache
