"""Decoded chunks kept between batches: :class:`ChunkCache`, one slab of chunk slots.

A :class:`~atari_zarr.read.chunks.ChunkReader` keeps the chunks it decoded here, so a
random batch whose chunks are cached is one fancy index over one slab. The cache of a
store read by itself is its own. The stores of one mixture share one cache per
process, held by the mixture's one :class:`~atari_zarr.read.budget.Budget`: whichever
store a batch draws from uses the room it needs, a store no batch touches holds
nothing, and the cache grows as misses pay for its pages whatever the number of stores.

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

* An **admission policy** (:meth:`ChunkCache.admits`): a cache that can hold at most
  an eighth of the chunks of its readers' arrays, and whose lookups have lately hit
  under one in ten, stops taking misses in (they are decoded for their batch only),
  except in a probe batch: the 16th batch after it stopped, then the 32nd after that,
  and so on up to one in 256 while the hit rate stays low. A run far larger than the
  cache, read at random, hits it about as often as the share it holds (2% for a whole
  run on a 24 GB machine): admitting would only cost the cache's upkeep and its slots'
  page faults (an admitted batch there takes twice as long as one decoded in passing).
  Reads that come back to the same rows raise the hit rate, even between probes (the
  rows the cache holds are hit), and the cache fills again, the probes back at one in
  16. The evidence is the cache's, so a mixture's stores, which share one, are judged
  together.

Every method is called with :attr:`ChunkCache.lock` held, and a batch asks
:meth:`ChunkCache.room` before :meth:`ChunkCache.slots`.

Examples
--------
>>> import numpy as np
>>> cache = ChunkCache((2, 3), np.dtype("uint8"))
>>> token = cache.register(4 * 6)
>>> def decode(keys, dests):
...     for k, d in zip(keys, dests):
...         d[...] = k % 100
>>> with cache.lock:
...     cache.room()
...     slots = cache.slots(chunk_keys(token, [3, 7]), decode)
...     [int(cache.slab[s][0, 0]) for s in slots], cache.held(token)
2
([3, 7], 2)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from atari_zarr.storage.chunk_loop import Destinations

__all__ = ["ChunkCache", "chunk_keys", "split_keys"]

# The cache starts with this many bytes of slots in use, and takes one more slot per
# _MISSES_PER_SLOT chunks decoded into it (see the module's docstring).
FIRST_ACTIVE_BYTES = 128 << 20
MISSES_PER_SLOT = 8
# The admission policy (ChunkCache.admits): a cache of at most 1/ADMIT_SHARE of its
# readers' chunks stops admitting while its recent hit rate (an exponential average of
# batches, weight HIT_RATE_WEIGHT) is under ADMIT_HIT_RATE, except in probe batches:
# ADMIT_EVERY batches after it stopped, then twice as many each time, at most
# ADMIT_EVERY_MAX.
ADMIT_SHARE = 8
ADMIT_HIT_RATE = 0.1
HIT_RATE_WEIGHT = 0.1
ADMIT_EVERY = 16
ADMIT_EVERY_MAX = 256

Decode = Callable[[list[int], Sequence[np.ndarray]], None]


#: A cached chunk's key: its reader's token in the high bits, its chunk number below.
TOKEN_SHIFT = 40


def chunk_keys(token: int, cids: np.ndarray) -> np.ndarray:
    """The cache keys of reader ``token``'s chunks ``cids`` (sorted as ``cids`` are)."""
    return (np.int64(token) << TOKEN_SHIFT) | np.asarray(cids, dtype=np.int64)


def split_keys(keys: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, cids)`` of cache keys (:func:`chunk_keys`)."""
    keys = np.asarray(keys, dtype=np.int64)
    return keys >> TOKEN_SHIFT, keys & ((1 << TOKEN_SHIFT) - 1)


class ChunkCache:
    """Decoded chunks of one shape and dtype, of any number of readers, in one slab.

    A chunk is found by its key (:func:`chunk_keys`: reader and chunk number) in one
    sorted array of the keys cached, so a batch of any number of readers looks its
    chunks up with one search, and the cache's bookkeeping is a few arrays of its
    slots whatever the size of the stores.

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
        #: Chunks the last :meth:`slots` decoded.
        self.last_misses = 0
        self._limits: dict[int, int] = {}
        #: Chunks of each reader's array: the cache is a share of their sum.
        self._chunks: dict[int, int] = {}
        #: The admission policy's evidence: batches asked about, the recent hit rate
        #: (optimistic at first, so a fresh cache fills until its lookups say otherwise).
        self.hit_rate = 1.0
        #: Batches between probes while the policy refuses (doubles with each probe),
        #: and batches refused since the last probe.
        self.probe_every = ADMIT_EVERY
        self._refused = 0
        self._next_token = 0
        #: Readers gone so far (:meth:`unregister`): a token taken before it changed
        #: may no longer be its reader's. Tokens are never given twice.
        self.departures = 0
        # tokens of readers collected by the garbage collector, left at the next call
        self._gone: list[int] = []
        self._keys = np.zeros(0, dtype=np.int64)  # sorted keys of the cached chunks
        self._key_slot = np.zeros(0, dtype=np.int64)  # and their slots
        self._key_of = np.full(0, -1, dtype=np.int64)  # key held by each slot, or -1
        self._ref = np.zeros(0, dtype=bool)
        self._epoch = np.zeros(0, dtype=np.int64)
        self._batch = 0
        self._hand = 0
        self._misses = 0

    # -- readers --------------------------------------------------------------------
    def register(self, nbytes: int, chunks: int = 0) -> int:
        """A reader joins, bringing ``nbytes`` of bound and an array of ``chunks``
        chunks; its token."""
        with self.lock:
            self._drain()
            token = self._next_token
            self._next_token += 1
            self._limits[token] = int(nbytes)
            self._chunks[token] = int(chunks)
            self._resize()
            return token

    def unregister(self, token: int) -> None:
        """A reader goes: its chunks leave the cache and its bytes leave the bound."""
        with self.lock:
            if self._limits.pop(token, None) is None:
                return
            self._chunks.pop(token, None)
            self.departures += 1
            self._evict(np.flatnonzero((self._key_of >> TOKEN_SHIFT) == token))
            self._resize()

    def release(self, token: int) -> None:
        """:meth:`unregister` at the next call, from a garbage collector's finalizer: it
        may run in the middle of any call, so it takes no lock and changes nothing."""
        self._gone.append(token)

    def room(self) -> int:
        """How many chunks one call of :meth:`slots` may ask for (half the bound); the
        readers collected since the last call leave first, so the bound is not
        lowered between this answer and that call."""
        self._drain()
        return self.n_slots // 2

    def _drain(self) -> None:
        while self._gone:
            self.unregister(self._gone.pop())

    @property
    def chunks_behind(self) -> int:
        """Chunks of all its readers' arrays together."""
        return sum(self._chunks.values())

    def admitted_slots(self, keys: np.ndarray, decode: Decode) -> np.ndarray | None:
        """:meth:`slots` of the chunks ``keys`` when they fit (:meth:`room`) and the
        admission policy takes this batch's misses in (:meth:`admits`), the hits then
        noted (:meth:`note_hits`); None otherwise, for the caller to decode them in
        passing."""
        if len(keys) > self.room() or not self.admits():
            return None
        slots = self.slots(keys, decode)
        self.note_hits(len(keys) - self.last_misses, len(keys))
        return slots

    def admits(self) -> bool:
        """Whether this batch's misses enter the cache (the admission policy).

        True while the cache holds more than an eighth of its readers' chunks, or its
        recent hit rate (:meth:`note_hits`) is at least one in ten. Otherwise True only
        for a probe: after :attr:`probe_every` batches refused, which then doubles (at
        most :data:`ADMIT_EVERY_MAX`); it is back at :data:`ADMIT_EVERY` once the cache
        admits again.
        """
        if self.n_slots * ADMIT_SHARE > self.chunks_behind or self.hit_rate >= ADMIT_HIT_RATE:
            self.probe_every, self._refused = ADMIT_EVERY, 0
            return True
        self._refused += 1
        if self._refused < self.probe_every:
            return False
        self.probe_every = min(2 * self.probe_every, ADMIT_EVERY_MAX)
        self._refused = 0
        return True

    def note_hits(self, hits: int, looked_up: int) -> None:
        """Fold one batch's hits into the recent hit rate (an exponential average)."""
        if looked_up:
            self.hit_rate += HIT_RATE_WEIGHT * (hits / looked_up - self.hit_rate)

    def held(self, token: int) -> int:
        """Chunks of reader ``token`` in the cache."""
        return int(((self._key_of >> TOKEN_SHIFT) == token).sum())

    # -- slots ----------------------------------------------------------------------
    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key (:func:`chunk_keys`), -1 where it is not cached."""
        keys = np.asarray(keys, dtype=np.int64)
        at = np.searchsorted(self._keys, keys)
        found = at < len(self._keys)
        found[found] = self._keys[at[found]] == keys[found]
        out = np.full(len(keys), -1, dtype=np.int64)
        out[found] = self._key_slot[at[found]]
        return out

    def slots(self, keys: np.ndarray, decode: Decode) -> np.ndarray:
        """Slots of the chunks ``keys`` (unique, at most :meth:`room`), decoding the
        missing ones with ``decode(keys, dests)`` straight into their slots."""
        keys = np.asarray(keys, dtype=np.int64)
        if len(keys) > self.n_slots // 2:
            raise ValueError(f"{len(keys)} chunks asked of a cache with room for {self.room()}")
        self._batch += 1
        slots = self.lookup(keys)
        hit = slots >= 0
        self._ref[slots[hit]] = True
        self._epoch[slots[hit]] = self._batch
        miss = np.flatnonzero(~hit)
        self.last_misses = int(miss.size)
        if miss.size:
            self._grow(int(miss.size), len(keys))
            new = self._take_slots(int(miss.size))
            assert self.slab is not None
            decode(keys[miss].tolist(), Destinations.slots(self.slab, new))
            # only now cached: a decode that failed leaves no half-decoded slot served
            self._add(keys[miss], new)
            slots[miss] = new
        return slots

    def _grow(self, misses: int, batch_chunks: int) -> None:
        """Take more slots into use: as misses pay for them, and always twice a batch."""
        self._misses += misses
        want = self.active + self._misses // MISSES_PER_SLOT
        self._misses %= MISSES_PER_SLOT
        self.active = min(self.n_slots, max(want, 2 * batch_chunks))

    def _take_slots(self, n: int) -> np.ndarray:
        """``n`` slots for this batch's misses (CLOCK), emptied of what they held."""
        out = np.empty(n, dtype=np.int64)
        active = self.active
        for i in range(n):
            while True:
                s = self._hand
                self._hand = (s + 1) % active
                if self._epoch[s] == self._batch:
                    continue  # in use by this batch
                if self._ref[s]:
                    self._ref[s] = False  # second chance
                    continue
                break
            self._epoch[s] = self._batch
            out[i] = s
        self._evict(out)
        return out

    def _add(self, keys: np.ndarray, slots: np.ndarray) -> None:
        order = np.argsort(keys)
        keys, slots = keys[order], slots[order]
        at = np.searchsorted(self._keys, keys)
        self._keys = np.insert(self._keys, at, keys)
        self._key_slot = np.insert(self._key_slot, at, slots)
        self._key_of[slots] = keys

    def _evict(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        held = slots[self._key_of[slots] >= 0]
        if held.size:
            at = np.searchsorted(self._keys, self._key_of[held])
            self._keys = np.delete(self._keys, at)
            self._key_slot = np.delete(self._key_slot, at)
        self._key_of[slots] = -1
        self._ref[slots] = False

    def _resize(self) -> None:
        """Bring the bound to the registered bytes, keeping the chunks that still fit.

        The slab is address space until slots are written: it grows to twice its size
        (readers joining one by one reallocate it a few times, not once each), and a
        reallocation copies only the slots that hold a chunk.
        """
        n = sum(self._limits.values()) // self.chunk_nbytes
        n = int(n) if n >= 2 else 0
        if n == self.n_slots:
            return
        keep = min(self.active, n)
        if self.active > n:
            self._evict(np.arange(n, self.active))
        cap = 0 if self.slab is None else len(self.slab)
        if n > cap or n < cap // 4:
            size = max(n, 2 * cap) if n > cap else n
            slab: np.ndarray | None = None
            while size:
                try:
                    # np.empty of a large size maps pages lazily: memory grows with use.
                    slab = np.empty((size, *self.chunk_shape), dtype=self.dtype)
                    break
                except MemoryError:  # no room for the address space asked: a smaller cache
                    size = n = n // 2 if n >= 4 else 0
                    if keep > n:
                        self._evict(np.arange(n, keep))
                        keep = n
            held = np.flatnonzero(self._key_of[:keep] >= 0)
            if held.size and slab is not None and self.slab is not None:
                slab[held] = self.slab[held]
            self.slab = slab
            self._key_of = _resized(self._key_of[:keep], size, -1)
            self._ref = _resized(self._ref[:keep], size, False)
            self._epoch = _resized(self._epoch[:keep], size, 0)
        first = FIRST_ACTIVE_BYTES // self.chunk_nbytes
        self.n_slots = n
        self.active = min(n, max(2, first, keep))
        self._hand = self._hand % self.active if self.active else 0


def _resized(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    out = np.full(n, fill, dtype=a.dtype)
    out[: len(a)] = a
    return out
