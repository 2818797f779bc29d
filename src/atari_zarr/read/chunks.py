"""Random access to rows: :class:`ChunkReader`, a decoded-chunk cache on the engine.

The engine (:mod:`atari_zarr.storage.engine`) locates, fetches, verifies and decodes
chunks; this module decides which chunks a batch of rows needs and keeps them:

* requested rows are grouped by chunk, so each chunk is decoded once per batch;
* a bounded cache (:class:`~atari_zarr.read.chunk_cache.ChunkCache`) keeps decoded
  chunks between batches in one slab, so a batch is gathered with a single fancy
  index; the stores of one mixture share one;
* large batches of large chunks are split into one decoding task per core, each
  decoding with the GIL released (:func:`~atari_zarr.storage.engine.background_decoder`).
  Chunks that decode in under about 20 µs (a 16-frame chunk of Atari frames takes 8)
  are decoded on the calling thread: each decoding call hands the GIL over twice, and
  two threads making calls that short read fewer chunks than one
  (``docs/benchmarks/cores.md``);
* a batch whose chunks do not fit the cache (or whose misses it does not admit) has
  the compiled chunk loop copy each chunk's rows wanted straight into the batch as it
  decodes the chunk, into a buffer of its thread that stays in the processor's cache
  (:class:`~atari_zarr.storage.chunk_loop.RowCopies`); a chunk read another way (no
  loop, or the careful way) goes to its thread's scratch buffer, reused from batch to
  batch, and is gathered from there;
* **decode ahead**: sequential reads decode the next chunks in the background;
* **fetch ahead** (:meth:`ChunkReader.fetch_ahead`): the encoded bytes of rows
  that will be read soon are fetched in the background (over a network, ranges of
  one shard merged into one request), so their requests overlap with the work on
  the current batch. They wait in the engine's one encoded-byte cache
  (:class:`~atari_zarr.storage.kept.KeptBytes`); this module keeps decoded chunks only.

Like the engine, it reads any Zarr v3 array (no Atari names), layouts the engine
does not recognise through zarr-python.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import zarr

from atari_zarr.forks import after_fork
from atari_zarr.read.chunk_cache import (
    TOKEN_SHIFT,
    ChunkCache,
    chunk_keys,
    split_keys,
)
from atari_zarr.read.options import ReadOptions
from atari_zarr.resources import cpu_count
from atari_zarr.storage.blosc import libblosc2_decoder
from atari_zarr.storage.chunk_loop import Destinations, RowCopies, chunk_loop
from atari_zarr.storage.chunk_tables import ChunkTables, Located
from atari_zarr.storage.engine import (
    ChunkEngine,
    EncodedChunk,
    background_decoder,
    blosc_decoder,
)

__all__ = ["ChunkReader", "ReaderSet", "decode_across", "read_rows_of"]

log = logging.getLogger("atari_zarr")

# Below this many chunks to decode, one thread beats splitting the work.
_SPLIT_MIN_CHUNKS = 16
# Below this many chunks, the compiled loop runs on the calling thread alone.
_LOOP_SPLIT_MIN_CHUNKS = 8
# Below this many decoded bytes a chunk, one thread beats splitting the work: a call
# that short costs less than handing the GIL to another thread and back.
_SPLIT_MIN_CHUNK_BYTES = 256 << 10
# Decode-ahead never runs further than this many chunks ahead of the reader.
_MAX_DECODE_AHEAD = 64
# Threads that wait for fetch-ahead requests (the requests themselves run concurrently).
_IO_THREADS = 4
# A thread keeps its batch scratch buffer up to this size (a batch of 256 transitions
# at frame stack 4 needs about 36 MB); a larger batch gets memory of its own.
_SCRATCH_KEPT = 64 << 20
_scratch_local = threading.local()


def read_passing(
    cache: ChunkCache | None,
    keys: np.ndarray,
    inverse: np.ndarray,
    within: np.ndarray,
    decode: Callable[[list[int], Sequence[np.ndarray]], None],
    out: np.ndarray,
    chunk_shape: tuple[int, ...],
) -> int:
    """Rows of chunks ``keys`` into ``out``, none of them taken into the cache.

    Row ``i`` is row ``within[i]`` of chunk ``keys[inverse[i]]``. The chunks ``cache``
    holds are copied from it, the others decoded by ``decode(keys, dests)``: where
    the compiled loop decodes them, each into a buffer that stays in the processor's
    cache, whose rows wanted are copied straight to ``out``
    (:attr:`~atari_zarr.storage.chunk_loop.Destinations.copies`); otherwise into this
    thread's scratch buffer, for this batch only, and gathered from there. The recent
    hit rate of the cache is told of the hits
    (:meth:`~atari_zarr.read.chunk_cache.ChunkCache.note_hits`), which are returned.
    """
    buf = _scratch((len(keys), *chunk_shape), out.dtype)
    todo = np.arange(len(keys))
    if cache is not None:
        with cache.lock:
            slot = cache.lookup(keys)
            for k in np.flatnonzero(slot >= 0).tolist():
                buf[k] = cache.slab[slot[k]]  # type: ignore[index]
            todo = np.flatnonzero(slot < 0)
            cache.note_hits(len(keys) - len(todo), len(keys))
    rows = chunk_shape[0]
    dests = Destinations.slots(buf, todo)
    done = None
    if len(todo) and out.flags.c_contiguous and out.dtype == buf.dtype:
        done = np.zeros(len(keys), dtype=bool)
        dests.copies = RowCopies.of(inverse, within, todo, out, done=done)
    decode(keys[todo].tolist(), dests)
    flat = buf.reshape(-1, *chunk_shape[1:])
    if done is None or not done.any():
        np.take(flat, inverse * rows + within, axis=0, out=out, mode="clip")
    else:  # the rows of chunks the loop did not copy out: cache hits, chunks read again
        rest = np.flatnonzero(~done[inverse])
        if rest.size:
            out[rest] = flat[inverse[rest] * rows + within[rest]]
    return len(keys) - len(todo)


def _scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised ``shape`` array in this thread's reused scratch memory.

    Valid until the thread's next call: the caller copies out of it before
    returning.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > _SCRATCH_KEPT:
        return np.empty(shape, dtype=dtype)
    buf = getattr(_scratch_local, "buf", None)
    if buf is None or buf.size < nbytes:
        # grown with room to spare, and its pages left to fault in where written: the
        # chunk loop copies most rows straight out, so most of it is never written
        size = nbytes if buf is None else max(nbytes, min(_SCRATCH_KEPT, buf.size * 5 // 4))
        buf = np.empty(size, dtype=np.uint8)
        _scratch_local.buf = buf
    return buf[:nbytes].view(dtype).reshape(shape)


class ChunkReader:
    """Rows of a Zarr v3 array read through its chunks' bytes, with a chunk cache.

    Parameters
    ----------
    array : zarr.Array
        Any array; rows are along axis 0. Layouts outside the engine's fast path are
        read with zarr-python.
    where : str
        URL or path of the store, for error messages.
    cache_bytes : int or callable, optional
        Bound on the decoded chunks kept between calls (0 disables the cache);
        default ``options.frame_cache_bytes``. A callable is asked in each process
        that reads (a forked DataLoader worker sizes its own cache).
    threads : int, optional
        Decoding threads for large batches; default ``options.threads``, else one
        per core.
    decode_ahead : bool
        Decode the next chunks in the background when reads are sequential.
    remedy : str, optional
        What to do about a damaged chunk, ending the error message.
    options : ReadOptions, optional
        How the store is read (the engine's coalescing and encoded-byte bound too).
    engine : ChunkEngine, optional
        The engine of ``array`` to share (its shard indexes and counters); default a
        new one.

    Attributes
    ----------
    stats : dict
        Counters: ``hits`` (chunks served by the cache), ``decoded``,
        ``fetched_bytes`` (encoded chunk bytes used), ``requests`` (byte ranges
        asked of a remote store, after merging), ``fetched_ahead`` (chunks fetched
        by :meth:`fetch_ahead`) and ``decoded_ahead``.

    Examples
    --------
    >>> import numpy as np, zarr
    >>> frames = zarr.open_group(store_url, mode="r")["observation"]  # a converted store
    >>> r = ChunkReader(frames, where=store_url)
    >>> r.fast
    True
    >>> got = r.read(np.array([299, 0, 0, 41]))
    >>> got.shape, bool((got[1] == got[2]).all()), bool((got[0] == frames[299]).all())
    ((4, 84, 84), True, True)
    """

    def __init__(
        self,
        array: zarr.Array,
        *,
        where: str,
        cache_bytes: int | Callable[[], int] | None = None,
        threads: int | None = None,
        decode_ahead: bool = True,
        remedy: str | None = None,
        options: ReadOptions | None = None,
        engine: ChunkEngine | None = None,
    ) -> None:
        options = options or ReadOptions()
        self.array = array
        self.engine = engine or ChunkEngine(
            array,
            where=where,
            remedy=remedy,
            coalesce_gap=options.coalesce_gap,
            kept_bytes=options.kept_bytes,
            shared=None if options.budget is None else options.budget.kept(),
            tables=None if options.budget is None else options.budget.tables(),
        )
        self.where = where
        self.name = self.engine.name
        self.grid = self.engine.grid
        if cache_bytes is None:
            cache_bytes = options.frame_cache_limit()
        self._cache_limit = cache_bytes if callable(cache_bytes) else (lambda: int(cache_bytes))
        self._budget = options.budget
        self._cache: ChunkCache | None = None
        self.threads = max(1, threads or options.threads or cpu_count())
        self.decode_ahead = decode_ahead
        self._stats = {"hits": 0, "fetched_ahead": 0, "decoded_ahead": 0}
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._next_chunk: int | None = None
        # Decode-ahead results live outside the cache until a range read takes them.
        self._ahead: dict[int, np.ndarray] = {}
        self._pending: dict[int, Future] = {}
        # Guards _ahead, _pending and the fetch-ahead state only: background threads
        # never take _lock, so a read holding _lock can wait for them.
        self._ahead_lock = threading.Lock()
        # Chunks being fetched ahead; their bytes land in the engine's KeptBytes.
        self._fetching: dict[int, Future] = {}
        self._io_pool: ThreadPoolExecutor | None = None
        self._forked = False
        self._init_cache()
        after_fork(self._after_fork)

    @property
    def stats(self) -> dict[str, int]:
        return {**self._stats, **self.engine.stats}

    @property
    def cache_bytes(self) -> int:
        """Bound on the decoded chunks this process keeps."""
        return int(self._cache_limit())

    def _init_cache(self) -> None:
        """Join this process's cache of decoded chunks: the reader's own, or its
        group's (:class:`~atari_zarr.read.chunk_cache.ChunkCache`), with its bound."""
        self._leave_cache()
        g = self.grid
        limit = self.cache_bytes if g is not None else 0
        # a group's readers pool their shares, however small; alone, two chunks at least
        least = 1 if self._budget is not None else 2 * (g.chunk_nbytes if g else 0)
        if g is not None and limit >= least:
            cache = (
                ChunkCache(g.chunk_shape, g.dtype)
                if self._budget is None
                else self._budget.frame_cache(g.chunk_shape, g.dtype)
            )
            self._token = cache.register(limit, g.n_chunks)
            self._cache = cache
            self._leave = weakref.finalize(self, cache.release, self._token)

    def _leave_cache(self) -> None:
        cache, self._cache = self._cache, None
        if cache is not None:
            self._leave.detach()
            cache.unregister(self._token)

    def _after_fork(self) -> None:
        """In a forked child: the parent's pools have no threads, its locks may be held,
        and its cache is its share, not the child's (the child makes its own on use)."""
        self._lock, self._pool_lock, self._ahead_lock = (
            threading.RLock(),
            threading.Lock(),
            threading.Lock(),
        )
        self._pool = self._io_pool = None
        self._ahead, self._pending, self._fetching = {}, {}, {}
        if self._cache is not None:
            self._leave.detach()
        self._cache, self._forked = None, True

    def _own_cache(self) -> None:
        """A process forked from the one that made the cache sizes and fills its own."""
        if self._forked:
            self._forked = False
            self._init_cache()

    @property
    def fast(self) -> bool:
        """True when reads bypass zarr's generic indexing."""
        return self.grid is not None

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @property
    def cached_chunks(self) -> int:
        """Number of decoded chunks held in the cache."""
        self._own_cache()
        if self._cache is None:
            return 0
        with self._cache.lock:
            return self._cache.held(self._token)

    # -- public -----------------------------------------------------------------------
    def read(self, rows: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed) as one array.

        Parameters
        ----------
        rows : array-like of int
            Row numbers in ``[0, len(array))``.
        out : numpy.ndarray, optional
            ``(len(rows), *row_shape)`` array of the array's dtype to fill (a reused
            buffer); default a new one.

        Returns
        -------
        numpy.ndarray
            ``(len(rows), *row_shape)`` of the array's dtype (``out`` when given).
        """
        rows = np.asarray(rows, dtype=np.int64).ravel()
        g = self.grid
        if g is None:
            got = self.engine.read_generic(rows)
            if out is None:
                return got
            out[...] = got
            return out
        if out is None:
            out = np.empty((len(rows), *g.row_shape), dtype=g.dtype)
        if rows.size == 0:
            return out
        with self._lock:
            self._own_cache()
            if (
                rows.size > 1
                and rows[-1] - rows[0] == rows.size - 1
                and bool((np.diff(rows) == 1).all())
            ):
                self._read_range(int(rows[0]), int(rows[-1]) + 1, out)
                return out
            cr = g.chunk_rows
            cids = rows // cr
            uniq, inverse = np.unique(cids, return_inverse=True)
            within = rows - cids * cr
            cache = self._cache
            if cache is None:
                keys = uniq
            else:
                keys = chunk_keys(self._token, uniq)
                with cache.lock:
                    slots = cache.admitted_slots(keys, self.decode_keys)
                    if slots is not None:
                        self._stats["hits"] += len(uniq) - cache.last_misses
                        assert cache.slab is not None
                        flat = cache.slab.reshape(-1, *g.row_shape)
                        # mode='clip': numpy buffers ``out`` with the default mode
                        np.take(flat, slots[inverse] * cr + within, axis=0, out=out, mode="clip")
                        return out
            # More chunks than half the cache, or misses the cache does not admit.
            self._stats["hits"] += read_passing(
                cache, keys, inverse, within, self.decode_keys, out, g.chunk_shape
            )
            return out

    def iter_chunks(self, cids: Sequence[int]) -> Iterator[np.ndarray]:
        """Whole decoded chunks ``cids`` (not cached), one at a time.

        Their bytes are fetched in one round (a remote store answers them
        concurrently), but each is decoded only when its turn comes, so a caller
        going through hundreds of chunks never holds hundreds of decoded ones.
        """
        g = self.grid
        if g is None:
            rows = int(self.array.chunks[0])
            for c in cids:
                yield np.asarray(self.array[int(c) * rows : (int(c) + 1) * rows])
            return
        if not self.engine.bytes.remote:
            # through the chunk loop where it decodes this array, else with c-blosc2's own
            # call: both loaded with the loop, where python-blosc2's module (the default
            # decoder of a thread alone) costs about 80 ms to import, which a stream's
            # first batch would wait for. These chunks are few: a chunk is 1 µs slower.
            decoder = libblosc2_decoder()
            for c in cids:
                dest = np.empty(g.chunk_shape, dtype=g.dtype)
                at = Destinations(dest, [0], g.chunk_rows)
                self._decode_into([int(c)], at, split=False, decoder=decoder)
                yield dest
            return
        chunks: list[EncodedChunk | None] = list(self._sources([int(c) for c in cids]))
        for i, chunk in enumerate(chunks):
            assert chunk is not None
            dest = np.empty(g.chunk_shape, dtype=g.dtype)
            chunks[i] = None  # its encoded bytes go once it is decoded
            self.engine.decode_all([chunk], [dest])
            yield dest

    def fetch_ahead(self, rows: np.ndarray) -> Future | None:
        """Start fetching the encoded chunks of ``rows`` in the background.

        A later :meth:`read` of these rows takes the fetched bytes instead of asking
        the store again (waiting for a fetch still under way), so the requests of the
        next batches overlap with the work on the current one. Only remote stores are
        fetched ahead (a local store is a memory map); chunks already under way are
        skipped. The bytes wait in the engine's encoded-byte cache (bounded by
        ``ReadOptions.kept_bytes``, least recently used dropped first), so a chunk
        that several of the next batches need is fetched once. A failed fetch is
        dropped silently: the read asks again and reports the error itself.

        Parameters
        ----------
        rows : array-like of int
            Rows that will be read soon.

        Returns
        -------
        concurrent.futures.Future or None
            Done when the bytes are in; None when there is nothing to fetch.

        Examples
        --------
        >>> import numpy as np, zarr
        >>> from zarr.codecs import BloscCodec, Crc32cCodec
        >>> from atari_zarr.storage.remote import RemoteStore
        >>> store = RemoteStore("memory://doc/prefetch.zarr", read_only=False)
        >>> a = zarr.create_array(store, shape=(64, 2), chunks=(8, 2), shards=(32, 2),
        ...                       dtype="int16", compressors=[BloscCodec(), Crc32cCodec()])
        >>> a[:] = np.arange(128).reshape(64, 2)
        >>> r = ChunkReader(a, where="memory://doc/prefetch.zarr")
        >>> r.fetch_ahead(np.array([1, 40])).result()
        >>> r.read(np.array([40, 1]))[:, 0].tolist(), r.stats["fetched_ahead"]
        ([80, 2], 2)
        """
        g = self.grid
        if g is None or not self.engine.bytes.remote:
            return None
        cids = np.unique(np.asarray(rows, dtype=np.int64).ravel() // g.chunk_rows)
        self._own_cache()
        if self._cache is not None and self._cache.active >= 8 * len(cids):
            # chunks decoded in a cache this much larger than what is drawn ahead are
            # still there when read: not fetched again (in a small cache they may be
            # evicted first, and are fetched too)
            with self._cache.lock:
                cids = cids[self._cache.lookup(chunk_keys(self._token, cids)) < 0]
        with self._ahead_lock:
            todo = [c for c in cids.tolist() if c not in self._fetching]
            if not todo:
                return None
            fut = self._io_executor().submit(self._fetch_ahead, todo)
            for c in todo:
                self._fetching[c] = fut
        return fut

    def read_unit(
        self,
        lo: int,
        hi: int,
        out: np.ndarray,
        halo: np.ndarray,
        *,
        decoding: Any = None,
        background: Callable[[], bool] = lambda: False,
    ) -> np.ndarray:
        """Rows ``[lo, hi)`` (inside one shard) decoded into ``out``, and the rows
        ``halo`` (just outside them) returned: what a stream's unit reads.

        The span is one request (a whole shard: the shard object), the halo's chunks
        fly in the same round where their shards' indexes are known, and nothing goes
        through the cache. ``decoding`` is held while decoding (requests fly without
        it); ``background()`` says whether a Python loop runs beside the decoding (then
        :func:`~atari_zarr.storage.engine.background_decoder` decodes, which releases the
        GIL; else :func:`~atari_zarr.storage.blosc.blosc_decoder`'s default).
        """
        engine = self.engine
        if not self.fast or not engine.grid.sharded:  # type: ignore[union-attr]
            out[:] = np.asarray(self.array[lo:hi])
            return engine.read_generic(halo)

        def decode(src: Any, dest: np.ndarray) -> Any:
            # asked for only where a chunk is decoded one by one: the chunk loop decodes
            # a unit's chunks, and loading a decoder's module costs about 80 ms once
            return (background_decoder() if background() else blosc_decoder())(src, dest)

        cr = self.grid.chunk_rows  # type: ignore[union-attr]
        span, around = engine.fetch_span(lo, hi, sorted({int(r) // cr for r in halo.tolist()}))
        with decoding or contextlib.nullcontext():
            return engine.decode_span(lo, hi, out, span, halo, around, decode, chunk_loop())

    def close(self) -> None:
        """Stop background work, drop cached chunks and let the store's files go."""
        with self._lock:
            pool, self._pool = self._pool, None
            io_pool, self._io_pool = self._io_pool, None
        for p in (pool, io_pool):
            if p is not None:
                p.shutdown(wait=True)
        with self._lock, self._ahead_lock:
            self._ahead.clear()
            self._pending.clear()
            self._fetching.clear()
        with self._lock:  # not under _ahead_lock: a read holds the cache's lock, then it
            self._init_cache()  # its chunks leave the cache
        forget = getattr(self.engine.bytes, "forget_all", None)
        if forget is not None:  # a local store's maps: their descriptors close
            forget()

    # -- internals --------------------------------------------------------------------
    def _executor(self) -> ThreadPoolExecutor:
        # A pool inherited through fork has no threads behind it: make a new one.
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="atari_zarr-read")
                self._pending = {}
        return self._pool

    def _io_executor(self) -> ThreadPoolExecutor:
        if self._io_pool is None:
            self._io_pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="atari_zarr-fetch")
            self._fetching = {}
        return self._io_pool

    def _background(
        self, what: str, cids: list[int], work: Callable[[], None], under_way: dict[int, Future]
    ) -> None:
        """Run ``work`` for ``cids`` off the reader's path: a failure is only logged (the
        read does it again and reports the error itself); ``cids`` leave ``under_way``."""
        try:
            work()
        except Exception:
            log.debug("%s of %s chunks %s failed", what, self.name, cids, exc_info=True)
        finally:
            with self._ahead_lock:
                for c in cids:
                    under_way.pop(c, None)

    def _fetch_ahead(self, cids: list[int]) -> None:
        def fetch() -> None:
            self.engine.fetch(cids)  # the bytes wait in the engine's KeptBytes
            with self._ahead_lock:
                self._stats["fetched_ahead"] += len(cids)

        self._background("fetch-ahead", cids, fetch, self._fetching)

    def _sources(self, cids: list[int]) -> list[EncodedChunk]:
        """The encoded chunks ``cids``, once the fetches ahead of them are in."""
        if self._fetching:
            with self._ahead_lock:
                futs = {id(f): f for c in cids if (f := self._fetching.get(c)) is not None}
            for fut in futs.values():
                fut.result()  # _fetch_ahead catches its own errors
        return self.engine.fetch(cids)

    def _cached_slots(self, uniq: np.ndarray) -> np.ndarray:
        """Cache slots of chunks ``uniq`` (sorted, unique), decoding the missing ones
        (the cache's lock held)."""
        assert self._cache is not None
        slots = self._cache.slots(chunk_keys(self._token, uniq), self.decode_keys)
        self._stats["hits"] += len(uniq) - self._cache.last_misses
        return slots

    def decode_keys(self, keys: list[int], dests: Sequence[np.ndarray]) -> None:
        """Decode this reader's chunks of cache keys ``keys`` into ``dests``."""
        self._decode_into(split_keys(keys)[1].tolist(), dests)

    def _read_range(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)``: whole chunks decode straight into ``out``."""
        g = self.grid
        assert g is not None
        cr = g.chunk_rows
        c0, c1 = start // cr, (stop - 1) // cr
        direct, direct_dest, edge = [], [], []
        for c in range(c0, c1 + 1):
            lo, hi = c * cr, (c + 1) * cr
            with self._ahead_lock:
                fut = self._pending.get(c)
            if fut is not None:
                fut.result()
            with self._ahead_lock:
                ahead = self._ahead.pop(c, None)
            if ahead is not None:
                a, b = max(lo, start), min(hi, stop)
                out[a - start : b - start] = ahead[a - lo : b - lo]
                self._stats["hits"] += 1
            elif lo < start or hi > stop:
                edge.append(c)
            else:
                direct.append(c)
                direct_dest.append(lo - start)
        if direct:
            dests: Sequence[np.ndarray] = (
                Destinations(out, direct_dest, cr)
                if out.flags.c_contiguous
                else [out[a : a + cr] for a in direct_dest]
            )
            self._decode_into(direct, dests)
        for c in edge:
            a, b = max(c * cr, start), min((c + 1) * cr, stop)
            out[a - start : b - start] = self._edge(c, a, b)
        sequential = self._next_chunk is not None and c0 in (self._next_chunk - 1, self._next_chunk)
        self._next_chunk = c1 + 1
        if sequential and self.decode_ahead:
            span = min(max(c1 - c0 + 1, 1), _MAX_DECODE_AHEAD)
            self._schedule_decode_ahead(range(c1 + 1, min(c1 + 1 + span, g.n_chunks)))

    def _edge(self, c: int, a: int, b: int) -> np.ndarray:
        """Rows ``[a, b)`` of chunk ``c`` (a partly requested chunk), through the cache."""
        g = self.grid
        assert g is not None
        lo = c * g.chunk_rows
        cache = self._cache
        if cache is not None:
            with cache.lock:
                if cache.room() >= 1:
                    slot = int(self._cached_slots(np.array([c], dtype=np.int64))[0])
                    return cache.slab[slot, a - lo : b - lo].copy()  # type: ignore[index]
        chunk = next(self.iter_chunks([c]))
        return chunk[a - lo : b - lo]

    def _schedule_decode_ahead(self, cids: range) -> None:
        with self._ahead_lock:
            todo = [c for c in cids if c not in self._ahead and c not in self._pending]
            # Drop decode-ahead the reader skipped past: a reader that stops scanning
            # must not pin memory without bound.
            for c in [c for c in self._ahead if c < cids.start or c >= cids.stop]:
                del self._ahead[c]
            if not todo:
                return
            fut = self._executor().submit(self._decode_ahead, todo)
            for c in todo:
                self._pending[c] = fut

    def _decode_ahead(self, cids: list[int]) -> None:
        g = self.grid
        assert g is not None

        def decode() -> None:
            dests = Destinations.slots(
                np.empty((len(cids), *g.chunk_shape), dtype=g.dtype), np.arange(len(cids))
            )
            # beside the reader's thread: a decoder that releases the GIL
            self._decode_into(cids, dests, split=False, decoder=background_decoder())
            with self._ahead_lock:
                self._ahead.update(zip(cids, dests, strict=True))
                self._stats["decoded_ahead"] += len(cids)

        self._background("decode-ahead", cids, decode, self._pending)

    def _decode_into(
        self,
        cids: list[int],
        dests: Sequence[np.ndarray],
        *,
        split: bool = True,
        decoder: Callable[[Any, np.ndarray], Any] | None = None,
    ) -> None:
        """Decode chunks ``cids`` into ``dests``, split between the pool's threads where
        that pays (``split``).

        A local store's chunks going to :class:`~atari_zarr.storage.chunk_loop.Destinations`
        are checked and decoded by the compiled loop, a share of them on each thread
        (:func:`~atari_zarr.storage.chunk_loop.chunk_loop`). Otherwise each chunk is one
        call of ``decoder``, the engine's default unless given (a thread beside the
        reader's passes :func:`~atari_zarr.storage.engine.background_decoder`)."""
        if not cids:
            return
        n = len(cids)
        if decode_across({0: self}, np.zeros(n, dtype=np.int64), cids, dests, split=split):
            return
        # a local store: the engine reads each chunk from its memory map as it decodes it
        chunks = self._sources(cids) if self.engine.bytes.remote else None

        split = (
            split
            and self.threads > 1
            and n >= _SPLIT_MIN_CHUNKS
            and self.grid is not None
            and self.grid.chunk_nbytes >= _SPLIT_MIN_CHUNK_BYTES
        )
        if split:
            decoder = background_decoder()

        def work(a: int, b: int) -> None:
            if chunks is None:
                self.engine.decode_into(cids[a:b], dests[a:b], decoder)
            else:
                self.engine.decode_all(chunks[a:b], dests[a:b], decoder)

        if split:
            pool = self._executor()
            step = -(-n // self.threads)
            futs = [pool.submit(work, i, i + step) for i in range(step, n, step)]
            work(0, step)
            for f in futs:
                f.result()
        else:
            work(0, n)


class _Tokens(NamedTuple):
    """What a batch read across readers asks of each, as arrays: taken when a reader
    first takes part (:func:`_taken`), valid while its cache loses no reader."""

    #: The decoded-chunk cache the readers share (None: none seen yet).
    cache: ChunkCache | None
    #: The cache's :attr:`~atari_zarr.read.chunk_cache.ChunkCache.departures` then.
    departures: int
    #: By reader number: its token in ``cache``; -1 not asked yet, -2 read by itself.
    token: np.ndarray
    #: The readers by token.
    readers: dict[int, ChunkReader]
    #: The chunk tables the locatable readers share, and their loop kind.
    tables: ChunkTables | None
    kind: Any
    #: By token: the reader's :class:`~atari_zarr.storage.chunk_tables.Rows` in
    #: ``tables``, -1 where its chunks are not located there.
    rows: np.ndarray

    def current(self) -> bool:
        """True while every token taken is still its reader's."""
        return self.cache is not None and self.cache.departures == self.departures

    def of(self, which: np.ndarray) -> tuple[_Tokens, np.ndarray] | None:
        """These tokens and the token of each of ``which``, or None where a reader of
        ``which`` reads by itself."""
        tok = self.token[which]
        return (self, tok) if tok.size and int(tok.min()) >= 0 else None


def _taken(
    held: _Tokens | None, n: int, numbers: list[int], reader_of: Callable[[int], ChunkReader]
) -> _Tokens:
    """``held`` (of ``n`` readers) with readers ``numbers`` taken in too: those that
    share its cache by their tokens, those whose chunks are also located in its chunk
    tables by their rows there."""
    if held is None or (held.cache is not None and not held.current()):
        held = _Tokens(None, 0, np.full(n, -1, np.int64), {}, None, None, np.full((0, 4), -1))
    cache, departures, tables, kind = held.cache, held.departures, held.tables, held.kind
    token, readers, found = held.token.copy(), dict(held.readers), {}
    for g in numbers:
        if token[g] != -1:
            continue
        r = reader_of(g)
        if r._forked:
            with r._lock:
                r._own_cache()
        if cache is None and r._cache is not None:
            cache = r._cache
            departures = cache.departures  # before the first token is taken
        if r._cache is None or r._cache is not cache:
            token[g] = -2
            continue
        t = token[g] = r._token
        readers[t] = r
        e = r.engine
        if e.loop_kind is not None and kind in (None, e.loop_kind):
            at_tables, at = e.rows()
            if tables is None:
                tables, kind = at_tables, e.loop_kind
            if at_tables is tables:
                found[t] = at
    rows = held.rows
    if found:
        rows = np.full((max(len(rows), max(found) + 1), 4), -1, dtype=np.int64)
        rows[: len(held.rows)] = held.rows
        rows[list(found)] = list(found.values())
    return _Tokens(cache, departures, token, readers, tables, kind, rows)


class ReaderSet:
    """Chunk readers by number (a mixture's stores' frame readers) read together by
    :func:`read_rows_of`, with what a batch across them asks of each kept as arrays.

    A reader is asked for (``reader_of(number)``) the first time a batch touches it;
    its cache token and where its chunks lie are kept, so a batch touching hundreds of
    readers does no step per reader. What is kept is taken again after the shared
    cache loses a reader (a reader closed: its token changes) and in a forked child.

    Parameters
    ----------
    n : int
        Number of readers.
    reader_of : callable
        ``reader_of(number)``: that reader.

    Examples
    --------
    :func:`read_rows_of`'s example reads two arrays through one.
    """

    def __init__(self, n: int, reader_of: Callable[[int], ChunkReader]) -> None:
        self.n = int(n)
        self.reader_of = reader_of
        self._lock = threading.Lock()
        self._held: _Tokens | None = None
        after_fork(self._forget)

    def _forget(self) -> None:
        """In a forked child: the readers make their own caches, with new tokens."""
        self._lock = threading.Lock()
        self._held = None

    def tokens(self, which: np.ndarray) -> tuple[_Tokens, np.ndarray] | None:
        """What is kept, and the token of each reader of ``which`` (numbers), readers
        asked for where they are new; None where one of them reads by itself."""
        held = self._held
        if held is not None and held.current():
            got = held.of(which)
            if got is not None:
                return got
        with self._lock:
            held = self._held
            new = which if held is None or not held.current() else which[held.token[which] == -1]
            if new.size:
                held = self._held = _taken(held, self.n, np.unique(new).tolist(), self.reader_of)
        assert held is not None  # taken above where there was nothing
        return held.of(which)


def read_rows_of(
    readers: ReaderSet | Sequence[ChunkReader], which: np.ndarray, rows: np.ndarray, out: np.ndarray
) -> np.ndarray:
    """``out[i] = readers[which[i]].read(rows[i])``: rows of many arrays in one call.

    Where the readers touched share one cache (a mixture's stores), the chunks are
    looked up with one search and the rows gathered with one ``np.take`` (or copied
    out by the chunk loop as it decodes, :func:`read_passing`), and the chunks to
    decode are decoded together (:func:`decode_across`), so a batch's cost
    beyond its decodes is a few array operations whatever the number of readers it
    touches. ``readers`` is a :class:`ReaderSet` (what it keeps of each reader is
    taken once) or a sequence (taken at each call). Otherwise each reader touched
    reads its own rows.

    Examples
    --------
    >>> import zarr
    >>> from zarr.codecs import BloscCodec
    >>> from atari_zarr.read.options import ReadOptions
    >>> opts = ReadOptions(frame_cache_bytes=1 << 20).divided(2)  # one cache group
    >>> arrays = []
    >>> for k in range(2):
    ...     a = zarr.create_array({}, shape=(64,), chunks=(8,), dtype="int16",
    ...                           compressors=[BloscCodec()])
    ...     a[:] = np.arange(64) + 100 * k
    ...     arrays.append(a)
    >>> readers = [ChunkReader(a, where=f"memory://{k}", options=opts)
    ...            for k, a in enumerate(arrays)]
    >>> out = np.empty(3, dtype="int16")
    >>> read_rows_of(readers, np.array([1, 0, 1]), np.array([5, 9, 63]), out).tolist()
    [105, 9, 163]
    >>> both = ReaderSet(2, readers.__getitem__)  # what it asks of each reader, kept
    >>> read_rows_of(both, np.array([0, 1]), np.array([63, 0]), out[:2]).tolist()
    [63, 100]
    """
    which = np.asarray(which, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    if which.size == 0:
        return out
    if isinstance(readers, ReaderSet):
        got, reader_of = readers.tokens(which), readers.reader_of
    else:
        reader_of = readers.__getitem__
        got = _taken(None, len(readers), np.unique(which).tolist(), reader_of).of(which)
    if got is not None:
        held, tok = got
        cache = held.cache
        assert cache is not None
        shape = cache.chunk_shape
        cr = shape[0]
        keys = (tok << np.int64(TOKEN_SHIFT)) | (rows // cr)
        uniq, inverse = np.unique(keys, return_inverse=True)

        def decode(keys: list[int], dests: Sequence[np.ndarray]) -> None:
            toks, cids = split_keys(keys)
            if decode_across(held, toks, cids, dests):
                return
            for t in np.unique(toks).tolist():
                sel = np.flatnonzero(toks == t).tolist()
                part = (
                    dests.take(sel) if isinstance(dests, Destinations) else [dests[i] for i in sel]
                )
                held.readers[t]._decode_into(cids[sel].tolist(), part)

        with cache.lock:
            slots = cache.admitted_slots(uniq, decode)
            if slots is not None:
                assert cache.slab is not None
                flat = cache.slab.reshape(-1, *shape[1:])
                np.take(flat, slots[inverse] * cr + rows % cr, axis=0, out=out, mode="clip")
                return out
        # more chunks than half the cache, or misses the cache does not admit
        read_passing(cache, uniq, inverse, rows % cr, decode, out, shape)
        return out
    for k in np.unique(which).tolist():
        sel = np.flatnonzero(which == k)
        out[sel] = reader_of(k).read(rows[sel])
    return out


def decode_across(
    readers: dict[int, ChunkReader] | _Tokens,
    tokens: np.ndarray,
    cids: Any,
    dests: Any,
    *,
    split: bool = True,
) -> bool:
    """Chunks of many readers (reader ``readers[tokens[i]]``'s chunk ``cids[i]``; by
    token, or what :func:`read_rows_of` keeps of them by token) decoded
    into ``dests`` by one compiled-loop run, split between the first reader's threads
    (from 8 chunks up, where ``split``).

    A mixture's batch touches a chunk or two of each of hundreds of stores: one call a
    store would cost more than its decoding. The stores share their chunk tables
    (:class:`~atari_zarr.storage.chunk_tables.ChunkTables`, a mixture's), so the chunks
    of all of them are located with a few array steps and counted in one. All are
    decoded together, and each engine reads what did not decode the careful way.
    Returns False, having decoded nothing, where that does not apply (no loop, a remote
    store, destinations that are not
    :class:`~atari_zarr.storage.chunk_loop.Destinations`, stores whose chunks differ in
    size or checksum, stores that do not share their chunk tables).
    """
    loop = chunk_loop()
    n = len(cids)
    if loop is None or not isinstance(dests, Destinations) or n == 0:
        return False
    tokens = np.asarray(tokens, dtype=np.int64)
    cids = np.asarray(cids, dtype=np.int64)
    if n > 1 and not bool((tokens[1:] >= tokens[:-1]).all()):
        order = np.argsort(tokens, kind="stable")
        tokens, cids, dests = tokens[order], cids[order], dests.take(order)
    starts = np.flatnonzero(np.concatenate(([True], tokens[1:] != tokens[:-1])))
    bounds = [*starts.tolist(), n]
    at = tokens[starts]
    if isinstance(readers, _Tokens):  # kept as arrays: no step per reader
        by_token, tables = readers.readers, readers.tables
        if tables is None or int(at.max()) >= len(readers.rows):
            return False
        rows = readers.rows[at]
        if bool((rows[:, 0] < 0).any()):
            return False
    else:
        by_token = readers
        engines = [readers[t].engine for t in at.tolist()]
        kind = engines[0].loop_kind
        if kind is None or not all(e.loop_kind == kind for e in engines):
            return False
        joined = [e.rows() for e in engines]
        tables = joined[0][0]
        if any(j[0] is not tables for j in joined):
            return False  # stores of no one mixture: each decodes its own
        # (chunk base, shard base, member, chunks per shard) of each store, one array
        rows = np.array([j[1] for j in joined], dtype=np.int64).reshape(-1, 4)
    first = by_token[int(at[0])]
    g = first.grid
    if g is None:
        return False

    def engine(k: int) -> ChunkEngine:
        return by_token[int(at[k])].engine

    if len(at) == 1:
        located = engine(0).locate(cids)
        assert located is not None  # the engine is locatable
    else:
        located = _locate_across(tables, engine, rows, cids, starts, bounds)
    threads = first.threads if split and n >= _LOOP_SPLIT_MIN_CHUNKS else 1
    status = loop.run_parts(
        located.src,
        located.srclen,
        dests,
        g.chunk_nbytes,
        checksum=g.checksum,
        executor=first._executor() if threads > 1 else None,
        parts=threads,
    )
    ok = status == 0
    failed = np.add.reduceat(~ok, starts)
    nbytes = np.add.reduceat(np.where(ok, located.srclen, 0), starts)
    whole = failed == 0  # every store's count in one step
    tables.count(rows[whole, 2], np.diff(bounds)[whole], nbytes[whole])
    for k in np.flatnonzero(failed).tolist():
        a, b = bounds[k], bounds[k + 1]
        part = Located(located.src[a:b], located.srclen[a:b], located.keep)
        engine(k).settle(cids[a:b], dests[a:b], part, status[a:b])
    return True


def _locate_across(
    tables: ChunkTables,
    engine: Callable[[int], ChunkEngine],
    rows: np.ndarray,
    cids: np.ndarray,
    starts: np.ndarray,
    bounds: list[int],
) -> Located:
    """Where chunks ``cids`` lie, those of ``bounds[k]:bounds[k + 1]`` engine ``k``'s, in
    the ``tables`` they share (``rows[k]``: engine ``k``'s
    :class:`~atari_zarr.storage.chunk_tables.Rows` there)."""
    counts = np.diff(bounds)
    chunk_base, shard_base, _, cps = (np.repeat(rows[:, i], counts) for i in range(4))
    shard_rows = shard_base + cids // cps
    unknown = np.flatnonzero(~tables.known[shard_rows])
    if unknown.size:  # shards read for the first time: each engine learns its own
        part = np.searchsorted(starts, unknown, side="right") - 1
        for k in np.unique(part).tolist():
            engine(k).learn(shard_rows[unknown[part == k]] - rows[k, 1])
    return tables.locate(chunk_base + cids, shard_rows)
