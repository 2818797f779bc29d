"""Fast row reads from Zarr v3 arrays whose chunks span whole rows.

zarr-python's generic indexing costs about 1 ms per chunk it touches, while
decoding a 16-frame Blosc chunk costs 20-50 µs (``docs/codec-choice.md``). This
module reads the same bytes a zarr client would, without the generic machinery:

* the shard index is read once per shard and kept;
* only the byte ranges of the needed chunks are fetched: from a memory map for a
  :class:`zarr.storage.LocalStore`, otherwise through the store's own asynchronous
  ``get`` with a byte range, all ranges of a batch gathered concurrently;
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

__all__ = ["ChunkReader"]

log = logging.getLogger("atari_zarr")

# An absent inner chunk has offset and length 2**64 - 1 in the shard index (zarr v3 spec).
_MISSING = np.uint64(2**64 - 1)
# Below this many chunks to decode, one thread beats splitting the work.
_SPLIT_MIN_CHUNKS = 16
# Read-ahead never runs further than this many chunks ahead of the reader.
_MAX_READAHEAD = 64
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
    ) -> None:
        self.array = array
        self.where = where
        self.remedy = remedy or DEFAULT_REMEDY
        self.name = array.path or array.name
        self.cache_bytes = int(cache_bytes)
        self.threads = max(1, threads or _cpu_count())
        self.readahead = readahead
        self.stats = {"hits": 0, "decoded": 0, "fetched_bytes": 0, "readahead": 0}
        try:
            self.plan: _Plan | None = _Plan(array)
        except UnsupportedChunks as exc:
            log.info("%s/%s: generic zarr reads (%s)", where, self.name, exc)
            self.plan = None
        from zarr.storage import LocalStore

        store = array.store_path.store
        self._bytes = (
            _LocalBytes(Path(store.root)) if isinstance(store, LocalStore) else _StoreBytes(store)
        )
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

    def close(self) -> None:
        """Stop background read-ahead and drop cached chunks."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        with self._lock, self._ahead_lock:
            self._ahead.clear()
            self._pending.clear()
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
        p = self.plan
        assert p is not None
        if not p.sharded:
            keys = [p.object_key(c) for c in cids]
            data = self._bytes.get([(k, None, None) for k in keys])
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
        data = self._bytes.get(requests)
        return [(None if i is None else data[i], key, off) for i, key, off in where]

    def _load_shard_indexes(self, shards: list[int]) -> None:
        p = self.plan
        assert p is not None
        size = 16 * p.chunks_per_shard + 4
        keys = [p.object_key(s) for s in shards]
        if p.index_at_start:
            data = self._bytes.get([(k, 0, size) for k in keys])
        else:
            whole = self._bytes.get([(k, None, None) for k in keys])
            data = [None if w is None else w[len(w) - size :] for w in whole]
        for s, k, raw in zip(shards, keys, data, strict=True):
            if raw is None:
                self._shard_index[s] = None  # the whole shard is absent: fill value
                continue
            raw = bytes(raw)
            if len(raw) != size:
                raise StoreCorruptError(
                    f"{self.where}: shard {k!r} of array {self.name!r} is {len(raw)} bytes at its "
                    f"index, expected a {size}-byte shard index. The store is damaged; "
                    f"{self.remedy}"
                )
            stored = int.from_bytes(raw[-4:], "little")
            if _crc32c(raw[:-4]) != stored:
                raise StoreCorruptError(
                    f"{self.where}: the index of shard {k!r} of array {self.name!r} fails its "
                    f"crc32c check. The store is damaged; {self.remedy}"
                )
            self._shard_index[s] = np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)

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
        from numcodecs import blosc

        p = self.plan
        assert p is not None
        fetched = 0
        for c, (src, key, off), dest in zip(cids, sources, dests, strict=True):
            if src is None:
                dest[...] = p.fill_value
                continue
            fetched += len(src)
            if p.checksum:
                if len(src) < 4 or _crc32c(src[:-4]) != int.from_bytes(bytes(src[-4:]), "little"):
                    raise self._corrupt(c, key, off, len(src), "fails its crc32c check")
                src = src[:-4]
            # Blosc header: nbytes (decoded) at bytes 4-8, cbytes (encoded) at 12-16.
            head = bytes(src[:16])
            if len(head) < 16 or int.from_bytes(head[12:16], "little") != len(src):
                raise self._corrupt(c, key, off, len(src), "is not a whole Blosc buffer")
            nbytes = int.from_bytes(head[4:8], "little")
            if nbytes != p.chunk_nbytes:
                raise self._corrupt(
                    c, key, off, len(src), f"decodes to {nbytes} bytes, expected {p.chunk_nbytes}"
                )
            try:
                blosc.decompress(src, dest)
            except Exception as exc:
                raise self._corrupt(c, key, off, len(src), f"does not decode ({exc})") from exc
        self.stats["fetched_bytes"] += fetched

    def _corrupt(
        self, c: int, key: str, off: int | None, size: int, what: str
    ) -> StoreCorruptError:
        p = self.plan
        assert p is not None
        rows = f"rows {c * p.chunk_rows}-{min((c + 1) * p.chunk_rows, p.shape[0]) - 1}"
        span = f" (bytes {off}-{off + size - 1})" if off is not None else ""
        return StoreCorruptError(
            f"{self.where}: chunk {c} of array {self.name!r} ({rows}), stored in {key!r}{span}, "
            f"{what}. The store is damaged; {self.remedy}"
        )
