"""Fast row reads from Zarr v3 arrays whose chunks span whole rows.

zarr-python's generic indexing costs about 1 ms per chunk it touches, while
decoding a 16-frame Blosc chunk costs 20-50 µs (``docs/codec-choice.md``). This
module reads the same bytes a zarr client would, without the generic machinery:

* the shard index is read once per shard and kept;
* only the byte ranges of the needed chunks are fetched: from a memory map for a
  :class:`zarr.storage.LocalStore`, otherwise through the store's own asynchronous
  ``get`` with a byte range, all ranges of a batch gathered concurrently;
* over a network, ranges of one shard less than ``coalesce_gap`` bytes apart are
  merged into one request (a request costs far more than the few KB between two
  chunks), and :meth:`ChunkReader.prefetch` fetches the encoded chunks of rows
  that will be read next in the background, so their requests overlap with the
  decoding of the current batch;
* every chunk's crc32c is checked, then Blosc decodes it (with the GIL released)
  straight into its destination: a cache slot, or the output array when a
  request covers whole chunks in order;
* requested rows are grouped by chunk so each chunk is decoded once per batch;
* a bounded cache (CLOCK, an LRU approximation) keeps decoded chunks between
  batches in one slab, so a batch is gathered with a single fancy index;
* large batches are split into one task per core (one task per chunk costs more
  in scheduling than a 20 µs decode);
* sequential reads trigger read-ahead of the next chunks in the background.

Anything this module does not recognise (other codecs, chunks that split a row,
big-endian data: :func:`atari_zarr.codec_chain.row_chunks` decides) is read
through zarr-python, so every store zarr can read still reads correctly, only
slower.

The module is generic: any Zarr v3 array, no Atari names. The per-step columns of
a store are in :mod:`atari_zarr.read.columns`.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.errors import StoreCorruptError

__all__ = [
    "DEFAULT_COALESCE_GAP",
    "ChunkReader",
    "coalesce_ranges",
    "corrupt_chunk",
    "decode_chunk",
    "parse_shard_index",
]

log = logging.getLogger("atari_zarr")

# An absent inner chunk has offset and length 2**64 - 1 in the shard index (zarr v3 spec).
_MISSING = np.uint64(2**64 - 1)
# Below this many chunks to decode, one thread beats splitting the work.
_SPLIT_MIN_CHUNKS = 16
# Read-ahead never runs further than this many chunks ahead of the reader.
_MAX_READAHEAD = 64
#: Ranges of one object at most this many bytes apart are fetched with one request.
DEFAULT_COALESCE_GAP = 64 << 10
# A merged request never grows beyond this many bytes (unless one chunk is larger).
_MAX_COALESCED = 16 << 20
# Encoded chunks fetched ahead by prefetch() are kept (least recently used dropped
# first) up to this many bytes: chunks wanted by several batches of a prefetched group
# are fetched once, whatever the decoded-chunk cache evicts meanwhile.
_MAX_PREFETCHED = 64 << 20
# Threads that wait for prefetch requests (the requests themselves run concurrently).
_IO_THREADS = 4
#: What a damaged-chunk error tells the user to do, unless the caller knows better.
DEFAULT_REMEDY = "write it again, or copy the object again if it was transferred."


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _crc32c(data: Any) -> int:
    import google_crc32c

    return google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)


def parse_shard_index(raw: Any, size: int, *, where: str, name: str, key: str, remedy: str) -> Any:
    """The ``(chunks, 2)`` offset/length table of a shard from its index bytes, checked.

    Raises
    ------
    StoreCorruptError
        The index has the wrong size or fails its crc32c check.
    """
    raw = bytes(raw)
    if len(raw) != size:
        raise StoreCorruptError(
            f"{where}: shard {key!r} of array {name!r} is {len(raw)} bytes at its index, "
            f"expected a {size}-byte shard index. The store is damaged; {remedy}"
        )
    if _crc32c(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
        raise StoreCorruptError(
            f"{where}: the index of shard {key!r} of array {name!r} fails its crc32c check. "
            f"The store is damaged; {remedy}"
        )
    return np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)


def decode_chunk(src: Any, dest: np.ndarray, *, checksum: bool, chunk_nbytes: int) -> str | None:
    """Check one stored chunk (crc32c, Blosc header, size) and decode it into ``dest``.

    Returns None when it decoded, else what is wrong with it, for the caller's
    :func:`corrupt_chunk` message.

    Examples
    --------
    >>> import numpy as np
    >>> from numcodecs import Blosc
    >>> data = Blosc(cname="zstd").encode(np.arange(16, dtype=np.uint8))
    >>> out = np.empty(16, dtype=np.uint8)
    >>> decode_chunk(data, out, checksum=False, chunk_nbytes=16), int(out[-1])
    (None, 15)
    >>> decode_chunk(data, out, checksum=True, chunk_nbytes=16)
    'fails its crc32c check'
    """
    from numcodecs import blosc

    if checksum:
        if len(src) < 4 or _crc32c(src[:-4]) != int.from_bytes(bytes(src[-4:]), "little"):
            return "fails its crc32c check"
        src = src[:-4]
    # Blosc header: nbytes (decoded) at bytes 4-8, cbytes (encoded) at 12-16.
    head = bytes(src[:16])
    if len(head) < 16 or int.from_bytes(head[12:16], "little") != len(src):
        return "is not a whole Blosc buffer"
    nbytes = int.from_bytes(head[4:8], "little")
    if nbytes != chunk_nbytes:
        return f"decodes to {nbytes} bytes, expected {chunk_nbytes}"
    try:
        blosc.decompress(src, dest)
    except Exception as exc:
        return f"does not decode ({exc})"
    return None


def corrupt_chunk(
    where: str,
    name: str,
    chunk: int,
    rows: tuple[int, int],
    key: str,
    span: tuple[int, int] | None,
    what: str,
    remedy: str,
) -> StoreCorruptError:
    """The one message of a damaged chunk: store, array, chunk, rows, object, bytes, problem."""
    where_bytes = f" (bytes {span[0]}-{span[0] + span[1] - 1})" if span is not None else ""
    return StoreCorruptError(
        f"{where}: chunk {chunk} of array {name!r} (rows {rows[0]}-{rows[1]}), stored in "
        f"{key!r}{where_bytes}, {what}. The store is damaged; {remedy}"
    )


class _Plan:
    """What the fast path needs to know about an array, derived from its metadata.

    Raises :class:`~atari_zarr.codec_chain.UnsupportedChunks` for layouts it does not
    handle (the shared check of the shard encoder too).
    """

    def __init__(self, array: zarr.Array) -> None:
        chain = row_chunks(array)
        meta = array.metadata
        self.shape = tuple(array.shape)
        self.row_shape = self.shape[1:]
        self.dtype = np.dtype(array.dtype)
        self.sharded = chain.shard_rows is not None
        self.shard_rows = chain.shard_rows
        self.index_at_start = chain.index_at_start
        self.checksum = chain.checksum
        self.chunk_rows = chain.chunk_rows
        self.chunks_per_shard = (
            chain.shard_rows // chain.chunk_rows if chain.shard_rows is not None else 1
        )
        self.n_chunks = -(-self.shape[0] // self.chunk_rows)
        self.chunk_shape = (self.chunk_rows, *self.row_shape)
        self.chunk_nbytes = int(np.prod(self.chunk_shape)) * self.dtype.itemsize
        fill = meta.fill_value
        self.fill_value = np.asarray(fill if fill is not None else 0, dtype=self.dtype)
        self.path = array.store_path.path
        self.encode_key = meta.encode_chunk_key
        self._keys: dict[int, str] = {}

    def object_key(self, coord: int) -> str:
        key = self._keys.get(coord)
        if key is None:
            key = self.encode_key((coord, *([0] * len(self.row_shape))))
            key = self._keys[coord] = f"{self.path}/{key}" if self.path else key
        return key


class _LocalBytes:
    """Byte ranges of files under a LocalStore, through memory maps kept open."""

    def __init__(self, root: Path, max_maps: int = 512) -> None:
        self.root = Path(root)
        self.max_maps = max_maps
        self._maps: OrderedDict[str, mmap.mmap | bytes | None] = OrderedDict()
        self._lock = threading.Lock()

    def _map(self, key: str) -> mmap.mmap | bytes | None:
        with self._lock:
            if key in self._maps:
                self._maps.move_to_end(key)
                return self._maps[key]
        mm: mmap.mmap | bytes | None
        try:
            with open(self.root / key, "rb") as f:
                mm = (
                    mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    if os.fstat(f.fileno()).st_size
                    else None
                )
        except FileNotFoundError:
            mm = None
        else:
            if mm is None:
                mm = b""  # empty file: reported as too short by the caller
        with self._lock:
            self._maps[key] = mm
            while len(self._maps) > self.max_maps:
                # Dropping the reference is enough: slices handed out keep their map alive.
                self._maps.popitem(last=False)
        return mm

    def get(self, requests: Sequence[tuple[str, int | None, int | None]]) -> list[Any]:
        out: list[Any] = []
        for key, start, stop in requests:
            mm = self._map(key)
            if mm is None:
                out.append(None)
            elif start is None:
                out.append(memoryview(mm))
            else:
                out.append(memoryview(mm)[start:stop])
        return out


def coalesce_ranges(
    requests: Sequence[tuple[str, int, int]], gap: int, max_bytes: int = _MAX_COALESCED
) -> tuple[list[tuple[str, int, int]], list[tuple[int, int, int]]]:
    """Merge byte ranges of one object that are at most ``gap`` bytes apart.

    Parameters
    ----------
    requests : sequence of (key, start, stop)
        Byte ranges, in any order; overlapping and repeated ranges are allowed.
    gap : int
        Largest number of unrequested bytes a merged range may span between two
        requested ones (0: merge only touching or overlapping ranges; negative:
        merge nothing).
    max_bytes : int
        A merged range stops growing at this size (a single larger range is kept).

    Returns
    -------
    merged : list of (key, start, stop)
        The ranges to fetch, sorted by key and offset.
    parts : list of (merged index, offset, length)
        Where each of ``requests`` lies in the merged ranges, in the order given.

    Examples
    --------
    >>> merged, parts = coalesce_ranges(
    ...     [("s/0", 100, 200), ("s/0", 0, 90), ("s/1", 0, 10), ("s/0", 5000, 5100)], gap=64)
    >>> merged
    [('s/0', 0, 200), ('s/0', 5000, 5100), ('s/1', 0, 10)]
    >>> parts
    [(0, 100, 100), (0, 0, 90), (2, 0, 10), (1, 0, 100)]
    """
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], requests[i][1]))
    merged: list[tuple[str, int, int]] = []
    parts: list[tuple[int, int, int]] = [(0, 0, 0)] * len(requests)
    for i in order:
        key, start, stop = requests[i]
        if merged:
            mkey, mstart, mstop = merged[-1]
            if (
                gap >= 0
                and mkey == key
                and start - mstop <= gap
                and max(stop, mstop) - mstart <= max_bytes
            ):
                merged[-1] = (mkey, mstart, max(stop, mstop))
                parts[i] = (len(merged) - 1, start - mstart, stop - start)
                continue
        merged.append((key, start, stop))
        parts[i] = (len(merged) - 1, 0, stop - start)
    return merged, parts


class _StoreBytes:
    """Byte ranges through any zarr store's asynchronous API, gathered concurrently."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get(self, requests: Sequence[tuple[str, int | None, int | None]]) -> list[Any]:
        from zarr.abc.store import RangeByteRequest
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        proto = default_buffer_prototype()

        async def one(key: str, start: int | None, stop: int | None) -> Any:
            rng = None if start is None or stop is None else RangeByteRequest(start, stop)
            buf = await self.store.get(key, prototype=proto, byte_range=rng)
            return None if buf is None else buf.as_numpy_array()

        async def many() -> list[Any]:
            return await asyncio.gather(*(one(*r) for r in requests))

        return sync(many())


class ChunkReader:
    """Rows of a Zarr v3 array read through its chunks' bytes, with a chunk cache.

    Parameters
    ----------
    array : zarr.Array
        Any array; rows are along axis 0. Layouts outside the fast path (see the
        module docstring) are read with ``array.oindex``.
    where : str
        URL or path of the store, for error messages.
    cache_bytes : int
        Bound on the decoded chunks kept between calls (0 disables the cache).
    threads : int, optional
        Decoding threads for large batches; default one per core.
    readahead : bool
        Decode the next chunks in the background when reads are sequential.
    remedy : str, optional
        What to do about a damaged chunk, ending the error message (default: write
        the store again, or copy it again if it was transferred).
    coalesce_gap : int
        Byte ranges of one shard at most this many bytes apart are fetched with one
        request (remote stores only, not through the local range cache; a negative
        value turns merging off). Default :data:`DEFAULT_COALESCE_GAP` (64 KiB).

    Attributes
    ----------
    stats : dict
        Counters: ``hits`` (chunks served by the cache), ``decoded``,
        ``fetched_bytes`` (encoded chunk bytes used), ``requests`` (byte ranges
        asked of a remote store, after merging), ``prefetched`` (chunks fetched
        ahead by :meth:`prefetch`) and ``readahead``.

    Examples
    --------
    >>> import numpy as np, zarr
    >>> from zarr.codecs import BloscCodec, Crc32cCodec
    >>> a = zarr.create_array({}, shape=(100, 3), chunks=(8, 3), shards=(32, 3), dtype="int16",
    ...                       compressors=[BloscCodec(cname="zstd"), Crc32cCodec()])
    >>> a[:] = np.arange(300).reshape(100, 3)
    >>> r = ChunkReader(a, where="memory")
    >>> r.fast
    True
    >>> r.read(np.array([99, 0, 0, 41]))[:, 0].tolist()
    [297, 0, 0, 123]
    """

    def __init__(
        self,
        array: zarr.Array,
        *,
        where: str,
        cache_bytes: int = 128 << 20,
        threads: int | None = None,
        readahead: bool = True,
        remedy: str | None = None,
        coalesce_gap: int = DEFAULT_COALESCE_GAP,
    ) -> None:
        self.array = array
        self.where = where
        self.remedy = remedy or DEFAULT_REMEDY
        self.name = array.path or array.name
        self.cache_bytes = int(cache_bytes)
        self.threads = max(1, threads or _cpu_count())
        self.readahead = readahead
        self.coalesce_gap = int(coalesce_gap)
        self.stats = {
            "hits": 0,
            "decoded": 0,
            "fetched_bytes": 0,
            "readahead": 0,
            "requests": 0,
            "prefetched": 0,
        }
        try:
            self.plan: _Plan | None = _Plan(array)
        except UnsupportedChunks as exc:
            log.info("%s/%s: generic zarr reads (%s)", where, self.name, exc)
            self.plan = None
        from zarr.storage import LocalStore

        from atari_zarr.storage.cache import RangeCacheStore

        store = array.store_path.store
        self._bytes = (
            _LocalBytes(Path(store.root)) if isinstance(store, LocalStore) else _StoreBytes(store)
        )
        # The range cache keeps each range asked for as one file: merged ranges differ
        # from batch to batch, so the next epoch would find none of them. Per-chunk
        # ranges there, which it serves again whatever the rows.
        self._merge = not isinstance(store, LocalStore | RangeCacheStore)
        self._shard_index: dict[int, np.ndarray | None] = {}
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = -1
        self._next_chunk: int | None = None
        # Read-ahead results live outside the cache until a range read takes them.
        self._ahead: dict[int, np.ndarray] = {}
        self._pending: dict[int, Future] = {}
        # Guards _ahead and _pending only: the read-ahead thread never takes _lock,
        # so a read holding _lock can wait for it.
        self._ahead_lock = threading.Lock()
        # Encoded chunks fetched by prefetch(), kept up to _MAX_PREFETCHED bytes, least
        # recently used dropped first (guarded by _ahead_lock):
        # chunk -> (bytes or None, object key, offset).
        self._raw: OrderedDict[int, tuple[Any, str, int | None]] = OrderedDict()
        self._raw_bytes = 0
        self._raw_pending: dict[int, Future] = {}
        self._io_pool: ThreadPoolExecutor | None = None
        self._io_pool_pid = -1
        self._init_cache()

    def _init_cache(self) -> None:
        """The cache is one slab of chunk slots, so a batch gathers with one fancy index.

        ``_slot_of[chunk] - 1`` is the slot holding a chunk (0: not cached; zeros
        come from untouched pages, so a 50M-row store costs no memory here). Slots are
        recycled with the CLOCK policy (an LRU approximation with one reference bit
        per slot); slots used by the batch being served are never recycled.
        """
        p = self.plan
        n_slots = self.cache_bytes // p.chunk_nbytes if p is not None else 0
        self._n_slots = int(n_slots) if n_slots >= 2 else 0
        self._slab: np.ndarray | None = None
        if self._n_slots:
            assert p is not None
            # np.empty of a large size maps pages lazily: memory grows with use.
            self._slab = np.empty((self._n_slots, *p.chunk_shape), dtype=p.dtype)
            self._slot_of = np.zeros(p.n_chunks, dtype=np.int32)
            self._owner = np.full(self._n_slots, -1, dtype=np.int64)
            self._ref = np.zeros(self._n_slots, dtype=bool)
            self._epoch = np.zeros(self._n_slots, dtype=np.int64)
        self._batch = 0
        self._hand = 0

    @property
    def fast(self) -> bool:
        """True when reads bypass zarr's generic indexing."""
        return self.plan is not None

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @property
    def cached_chunks(self) -> int:
        """Number of decoded chunks held in the cache."""
        return int((self._owner >= 0).sum()) if self._n_slots else 0

    # -- public -----------------------------------------------------------------------
    def read(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed) as one array.

        Parameters
        ----------
        rows : array-like of int
            Row numbers in ``[0, len(array))``.

        Returns
        -------
        numpy.ndarray
            ``(len(rows), *row_shape)`` of the array's dtype.
        """
        rows = np.asarray(rows, dtype=np.int64).ravel()
        p = self.plan
        if p is None:
            return self._read_generic(rows)
        if rows.size == 0:
            return np.empty((0, *p.row_shape), dtype=p.dtype)
        with self._lock:
            if (
                rows.size > 1
                and rows[-1] - rows[0] == rows.size - 1
                and bool((np.diff(rows) == 1).all())
            ):
                out = np.empty((len(rows), *p.row_shape), dtype=p.dtype)
                self._read_range(int(rows[0]), int(rows[-1]) + 1, out)
                return out
            cr = p.chunk_rows
            cids = rows // cr
            uniq, inverse = np.unique(cids, return_inverse=True)
            within = rows - cids * cr
            if self._n_slots and len(uniq) <= self._n_slots // 2:
                slots = self._cached_slots(uniq)
                flat = self._slab.reshape(-1, *p.row_shape)  # type: ignore[union-attr]
                return flat[slots[inverse] * cr + within]
            # More chunks than half the cache: decode into a buffer for this batch only.
            buf = np.empty((len(uniq), *p.chunk_shape), dtype=p.dtype)
            todo = list(range(len(uniq)))
            if self._n_slots:
                slot = self._slot_of[uniq].astype(np.int64) - 1
                for k in np.flatnonzero(slot >= 0).tolist():
                    buf[k] = self._slab[slot[k]]  # type: ignore[index]
                todo = np.flatnonzero(slot < 0).tolist()
                self.stats["hits"] += len(uniq) - len(todo)
            self._decode_into([int(uniq[k]) for k in todo], [buf[k] for k in todo])
            return buf.reshape(-1, *p.row_shape)[inverse * cr + within]

    def decode_chunks(self, cids: Sequence[int]) -> list[np.ndarray]:
        """Whole decoded chunks ``cids`` (not cached), each ``(chunk_rows, *row_shape)``."""
        p = self.plan
        if p is None:
            rows = self._generic_chunk_rows()
            return [np.asarray(self.array[int(c) * rows : (int(c) + 1) * rows]) for c in cids]
        dests = [np.empty(p.chunk_shape, dtype=p.dtype) for _ in cids]
        self._decode_into([int(c) for c in cids], dests)
        return dests

    def prefetch(self, rows: np.ndarray) -> Future | None:
        """Start fetching the encoded chunks of ``rows`` in the background.

        A later :meth:`read` of these rows takes the fetched bytes instead of asking
        the store again (waiting for a fetch still under way), so the requests of the
        next batches overlap with the work on the current one. Only remote stores are
        fetched ahead (a local store is a memory map); chunks already under way are
        skipped. Fetched chunks are kept up to a bound (64 MB of encoded bytes,
        least recently used dropped first), so a chunk that several of the next
        batches need is fetched once. A failed fetch is dropped silently: the read
        asks again and reports the error itself.

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
        >>> r.prefetch(np.array([1, 40])).result()
        >>> r.read(np.array([40, 1]))[:, 0].tolist(), r.stats["prefetched"]
        ([80, 2], 2)
        """
        p = self.plan
        if p is None or isinstance(self._bytes, _LocalBytes):
            return None
        # Cached chunks are fetched too: they may be evicted before their read, and
        # their bytes mostly come with a merged range of the same shard anyway.
        cids = np.unique(np.asarray(rows, dtype=np.int64).ravel() // p.chunk_rows)
        with self._ahead_lock:
            todo = [c for c in cids.tolist() if c not in self._raw and c not in self._raw_pending]
            if not todo:
                return None
            fut = self._io_executor().submit(self._fetch_ahead, todo)
            for c in todo:
                self._raw_pending[c] = fut
        return fut

    def close(self) -> None:
        """Stop background read-ahead and drop cached chunks."""
        with self._lock:
            pool, self._pool = self._pool, None
            io_pool, self._io_pool = self._io_pool, None
        for p in (pool, io_pool):
            if p is not None:
                p.shutdown(wait=True)
        with self._lock, self._ahead_lock:
            self._ahead.clear()
            self._pending.clear()
            self._raw.clear()
            self._raw_bytes = 0
            self._raw_pending.clear()
            self._init_cache()

    # -- internals --------------------------------------------------------------------
    def _generic_chunk_rows(self) -> int:
        return int(self.array.chunks[0])

    def _read_generic(self, rows: np.ndarray) -> np.ndarray:
        if rows.size == 0:
            return np.zeros((0, *self.array.shape[1:]), dtype=self.array.dtype)
        uniq, inverse = np.unique(rows, return_inverse=True)
        return np.asarray(self.array.get_orthogonal_selection((uniq,)))[inverse]

    def _executor(self) -> ThreadPoolExecutor:
        # A pool inherited through fork has no threads behind it: make a new one.
        if self._pool is None or self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="atari_zarr-read")
            self._pool_pid = os.getpid()
            self._pending = {}
        return self._pool

    def _io_executor(self) -> ThreadPoolExecutor:
        if self._io_pool is None or self._io_pool_pid != os.getpid():
            self._io_pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="atari_zarr-fetch")
            self._io_pool_pid = os.getpid()
            self._raw_pending = {}
        return self._io_pool

    def _fetch_ahead(self, cids: list[int]) -> None:
        try:
            sources = self._fetch(cids)
        except Exception:  # the read fetches these again and reports the error itself
            log.debug("prefetch of %s chunks %s failed", self.name, cids, exc_info=True)
            sources = None
        with self._ahead_lock:
            if sources is not None:
                for c, src in zip(cids, sources, strict=True):
                    old = self._raw.pop(c, None)
                    if old is not None:
                        self._raw_bytes -= 0 if old[0] is None else len(old[0])
                    if src[0] is not None:
                        # a copy: a slice would keep its whole merged range alive
                        src = (np.array(src[0], dtype=np.uint8, copy=True), src[1], src[2])
                    self._raw[c] = src
                    self._raw_bytes += 0 if src[0] is None else len(src[0])
                self.stats["prefetched"] += len(cids)
                while self._raw_bytes > _MAX_PREFETCHED and self._raw:
                    _, (old, _, _) = self._raw.popitem(last=False)
                    self._raw_bytes -= 0 if old is None else len(old)
            for c in cids:
                if self._raw_pending.get(c) is not None:
                    del self._raw_pending[c]

    def _take_prefetched(self, cids: list[int]) -> list[tuple[Any, str, int | None] | None]:
        """The prefetched sources of ``cids`` (waiting for fetches under way), or None each."""
        if not self._raw and not self._raw_pending:
            return [None] * len(cids)
        with self._ahead_lock:
            futs = {id(f): f for c in cids if (f := self._raw_pending.get(c)) is not None}
        for fut in futs.values():
            try:
                fut.result()
            except Exception:  # pragma: no cover - _fetch_ahead catches its errors
                pass
        out: list[tuple[Any, str, int | None] | None] = []
        with self._ahead_lock:
            for c in cids:
                src = self._raw.get(c)
                if src is not None:
                    self._raw.move_to_end(c)
                out.append(src)
        return out

    def _cached_slots(self, uniq: np.ndarray) -> np.ndarray:
        """Cache slots of chunks ``uniq`` (sorted, unique), decoding the missing ones."""
        self._batch += 1
        slots = self._slot_of[uniq].astype(np.int64) - 1
        hit = slots >= 0
        self._ref[slots[hit]] = True
        self._epoch[slots[hit]] = self._batch
        self.stats["hits"] += int(hit.sum())
        miss = np.flatnonzero(~hit)
        if miss.size:
            new = np.array([self._alloc_slot() for _ in range(miss.size)], dtype=np.int64)
            cids = uniq[miss]
            try:
                self._decode_into(cids.tolist(), [self._slab[s] for s in new.tolist()])  # type: ignore[index]
            except BaseException:
                self._owner[new] = -1  # never serve a half-decoded slot
                raise
            self._slot_of[cids] = new + 1
            self._owner[new] = cids
            slots[miss] = new
        return slots

    def _alloc_slot(self) -> int:
        n = self._n_slots
        while True:
            s = self._hand
            self._hand = (s + 1) % n
            if self._epoch[s] == self._batch:
                continue  # in use by this batch
            if self._ref[s]:
                self._ref[s] = False  # second chance
                continue
            old = self._owner[s]
            if old >= 0:
                self._slot_of[old] = 0
                self._owner[s] = -1
            self._epoch[s] = self._batch
            return s

    def _read_range(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)``: whole chunks decode straight into ``out``."""
        p = self.plan
        assert p is not None
        cr = p.chunk_rows
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
                self.stats["hits"] += 1
            elif lo < start or hi > stop:
                edge.append(c)
            else:
                direct.append(c)
                direct_dest.append(out[lo - start : hi - start])
        if direct:
            self._decode_into(direct, direct_dest)
        for c in edge:
            a, b = max(c * cr, start), min((c + 1) * cr, stop)
            out[a - start : b - start] = self._edge(c, a, b)
        sequential = self._next_chunk is not None and c0 in (self._next_chunk - 1, self._next_chunk)
        self._next_chunk = c1 + 1
        if sequential and self.readahead:
            span = min(max(c1 - c0 + 1, 1), _MAX_READAHEAD)
            self._schedule_readahead(range(c1 + 1, min(c1 + 1 + span, p.n_chunks)))

    def _edge(self, c: int, a: int, b: int) -> np.ndarray:
        """Rows ``[a, b)`` of chunk ``c`` (a partly requested chunk), through the cache."""
        p = self.plan
        assert p is not None
        lo = c * p.chunk_rows
        if self._n_slots:
            slot = int(self._cached_slots(np.array([c], dtype=np.int64))[0])
            return self._slab[slot, a - lo : b - lo]  # type: ignore[index]
        [chunk] = self.decode_chunks([c])
        return chunk[a - lo : b - lo]

    def _schedule_readahead(self, cids: range) -> None:
        with self._ahead_lock:
            todo = [c for c in cids if c not in self._ahead and c not in self._pending]
            # Drop read-ahead the reader skipped past: a reader that stops scanning
            # must not pin memory without bound.
            for c in [c for c in self._ahead if c < cids.start or c >= cids.stop]:
                del self._ahead[c]
            if not todo:
                return
            fut = self._executor().submit(self._prefetch, todo)
            for c in todo:
                self._pending[c] = fut

    def _prefetch(self, cids: list[int]) -> None:
        p = self.plan
        assert p is not None
        try:
            dests = [np.empty(p.chunk_shape, dtype=p.dtype) for _ in cids]
            self._decode_into(cids, dests, split=False)
            with self._ahead_lock:
                self._ahead.update(zip(cids, dests, strict=True))
                self.stats["readahead"] += len(cids)
        except Exception:  # the reader decodes these again and reports the error itself
            log.debug("read-ahead of %s chunks %s failed", self.name, cids, exc_info=True)
        finally:
            with self._ahead_lock:
                for c in cids:
                    self._pending.pop(c, None)

    # -- bytes -> arrays ----------------------------------------------------------------
    def _sources(self, cids: list[int]) -> list[tuple[Any, str, int | None]]:
        """``(encoded bytes or None, object key, offset)`` of every chunk in ``cids``."""
        ahead = self._take_prefetched(cids)
        missing = [i for i, src in enumerate(ahead) if src is None]
        if len(missing) == len(cids):
            return self._fetch(cids)
        fetched = self._fetch([cids[i] for i in missing]) if missing else []
        for i, src in zip(missing, fetched, strict=True):
            ahead[i] = src
        return ahead  # type: ignore[return-value]

    def _get(self, requests: list[tuple[str, int | None, int | None]]) -> list[Any]:
        """Byte ranges, ranges of one object close together fetched with one request."""
        if not self._merge or len(requests) < 2 or self.coalesce_gap < 0:
            self.stats["requests"] += 0 if isinstance(self._bytes, _LocalBytes) else len(requests)
            return self._bytes.get(requests)
        whole = [i for i, (_, start, stop) in enumerate(requests) if start is None or stop is None]
        if whole:  # whole objects: nothing to merge
            self.stats["requests"] += len(requests)
            return self._bytes.get(requests)
        ranged = [(k, int(a), int(b)) for k, a, b in requests]  # type: ignore[arg-type]
        merged, parts = coalesce_ranges(ranged, self.coalesce_gap)
        self.stats["requests"] += len(merged)
        data = self._bytes.get(list(merged))
        out: list[Any] = []
        for m, off, length in parts:
            d = data[m]
            out.append(None if d is None else d[off : off + length])
        return out

    def _fetch(self, cids: list[int]) -> list[tuple[Any, str, int | None]]:
        """Fetch the encoded bytes of ``cids`` from the store (see :meth:`_sources`)."""
        p = self.plan
        assert p is not None
        if not p.sharded:
            keys = [p.object_key(c) for c in cids]
            data = self._get([(k, None, None) for k in keys])
            return [(d, k, None) for d, k in zip(data, keys, strict=True)]
        cps = p.chunks_per_shard
        shards = sorted({c // cps for c in cids} - self._shard_index.keys())
        if shards:
            self._load_shard_indexes(shards)
        requests: list[tuple[str, int | None, int | None]] = []
        where: list[tuple[int | None, str, int | None]] = []
        for c in cids:
            index = self._shard_index[c // cps]
            key = p.object_key(c // cps)
            if index is None or index[c % cps, 0] == _MISSING:
                where.append((None, key, None))
            else:
                off, nb = int(index[c % cps, 0]), int(index[c % cps, 1])
                where.append((len(requests), key, off))
                requests.append((key, off, off + nb))
        data = self._get(requests)
        return [(None if i is None else data[i], key, off) for i, key, off in where]

    def _load_shard_indexes(self, shards: list[int]) -> None:
        p = self.plan
        assert p is not None
        size = 16 * p.chunks_per_shard + 4
        keys = [p.object_key(s) for s in shards]
        if p.index_at_start:
            data = self._get([(k, 0, size) for k in keys])
        else:
            whole = self._get([(k, None, None) for k in keys])
            data = [None if w is None else w[len(w) - size :] for w in whole]
        for s, k, raw in zip(shards, keys, data, strict=True):
            if raw is None:
                self._shard_index[s] = None  # the whole shard is absent: fill value
                continue
            self._shard_index[s] = parse_shard_index(
                raw, size, where=self.where, name=self.name, key=k, remedy=self.remedy
            )

    def _decode_into(self, cids: list[int], dests: list[np.ndarray], *, split: bool = True) -> None:
        sources = self._sources(cids)
        self.stats["decoded"] += len(cids)
        n = len(cids)
        if split and self.threads > 1 and n >= _SPLIT_MIN_CHUNKS:
            pool = self._executor()
            step = -(-n // self.threads)
            futs = [
                pool.submit(
                    self._decode_some,
                    cids[i : i + step],
                    sources[i : i + step],
                    dests[i : i + step],
                )
                for i in range(step, n, step)
            ]
            self._decode_some(cids[:step], sources[:step], dests[:step])
            for f in futs:
                f.result()
        else:
            self._decode_some(cids, sources, dests)

    def _decode_some(
        self, cids: list[int], sources: list[tuple[Any, str, int | None]], dests: list[np.ndarray]
    ) -> None:
        p = self.plan
        assert p is not None
        fetched = 0
        for c, (src, key, off), dest in zip(cids, sources, dests, strict=True):
            if src is None:
                dest[...] = p.fill_value
                continue
            fetched += len(src)
            problem = decode_chunk(src, dest, checksum=p.checksum, chunk_nbytes=p.chunk_nbytes)
            if problem is not None:
                raise self._corrupt(c, key, off, len(src), problem)
        self.stats["fetched_bytes"] += fetched

    def _corrupt(
        self, c: int, key: str, off: int | None, size: int, what: str
    ) -> StoreCorruptError:
        p = self.plan
        assert p is not None
        rows = (c * p.chunk_rows, min((c + 1) * p.chunk_rows, p.shape[0]) - 1)
        span = (off, size) if off is not None else None
        return corrupt_chunk(self.where, self.name, c, rows, key, span, what, self.remedy)
