"""An epoch stream over a store: whole units read in shuffled order, batches out.

:meth:`AtariZarrDataset.stream <atari_zarr.AtariZarrDataset.stream>` returns an
:class:`AtariZarrStream`: an iterable of TED batches (the keys, shapes and frame
stacks of ``ds[idx]``, with ``index``) that yields every transition of the store
exactly once per epoch, across all ranks and DataLoader workers together, and a
``torch.utils.data.IterableDataset`` with ``state_dict()``/``load_state_dict()``.

How a consumer (one rank's worker) reads (``docs/streaming.md`` has the figures):

* The epoch's order of read units, their split across consumers and the order
  in which their rows leave are arithmetic (:mod:`atari_zarr.read.epoch`).
* A unit (a frame shard, 4096 frames) is fetched with one request for the whole
  shard object (or, for a unit smaller than a shard, one byte range after the
  shard's index), ``prefetch`` units in flight on a thread pool. Every chunk's
  crc32c is checked and Blosc decodes it (GIL released) straight into a slot of
  one preallocated slab of ``window + 1 + prefetch`` units.
* The frames just outside a unit (the ``frame_stack - 1`` before it, the one
  after it) are fetched with it, so ``next.observation`` and stacks are exact at
  unit boundaries; per-step values come from the dataset's lazily cached columns.
* Batches are gathered from the slab with one fancy index: the shuffle buffer is
  row numbers into decoded units, never a second copy of the frames.

Layouts the fast path does not understand (unsharded arrays, other codecs) are
read unit by unit through zarr: the same batches, only slower.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.errors import InvalidArgumentError, StoreCorruptError
from atari_zarr.layout import OBSERVATION
from atari_zarr.read.chunks import (
    _MISSING,
    DEFAULT_REMEDY,
    _cpu_count,
    corrupt_chunk,
    decode_chunk,
    parse_shard_index,
)
from atari_zarr.read.epoch import EpochPlan, unit_bounds

if TYPE_CHECKING:
    from atari_zarr.read.dataset import AtariZarrDataset

__all__ = ["DEFAULT_PREFETCH", "DEFAULT_SHUFFLE_BUFFER", "AtariZarrStream", "stream_memory_bound"]

log = logging.getLogger("atari_zarr")

#: Transitions whose units are held decoded for mixing (4 shards of 4096 frames).
DEFAULT_SHUFFLE_BUFFER = 16384
#: Units fetched ahead of the one being read.
DEFAULT_PREFETCH = 4
# Shard indexes kept for units smaller than a shard and for the frames around units.
_INDEX_CACHE = 256
_STATE_VERSION = 1
# Batch buffers kept for reuse once their batch is dropped (per consumer).
_BUFFERS = 4


def _positive_int(value: Any, name: str, where: str, *, zero: bool = False) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or value < (0 if zero else 1)
    ):
        kind = "non-negative" if zero else "positive"
        raise InvalidArgumentError(f"{name} must be a {kind} integer; got {value!r} for {where}")
    return int(value)


class _Frames:
    """Units of the frame array: whole shards (or ranges) fetched with one request, decoded."""

    def __init__(self, ds: AtariZarrDataset) -> None:
        array = ds._obs
        self.array = array
        self.where = ds.url
        self.remedy = _dataset_remedy(ds)
        self.n = len(ds)
        self.row_shape = tuple(array.shape[1:])
        try:
            chain = row_chunks(array)
            if chain.shard_rows is None:
                raise UnsupportedChunks("not sharded")
        except UnsupportedChunks as exc:
            log.info("%s: the stream reads units through zarr (%s)", self.where, exc)
            self.fast = False
            chunks = int(array.chunks[0])
            self.chunk_rows = chunks
            self.shard_rows = max(chunks, -(-4096 // chunks) * chunks)
            return
        self.fast = True
        self.chunk_rows = chain.chunk_rows
        self.shard_rows = int(chain.shard_rows)
        self.cps = self.shard_rows // self.chunk_rows
        self.index_at_start = chain.index_at_start
        self.checksum = chain.checksum
        self.chunk_nbytes = self.chunk_rows * int(np.prod(self.row_shape)) * array.dtype.itemsize
        self.index_size = 16 * self.cps + 4
        self.store = array.store_path.store
        self.path = array.store_path.path
        self.encode_key = array.metadata.encode_chunk_key
        self._indexes: OrderedDict[int, np.ndarray | None] = OrderedDict()
        self._decoders = threading.BoundedSemaphore(max(1, _cpu_count() - 1))

    # -- keys and indexes -------------------------------------------------------------
    def key(self, shard: int) -> str:
        key = self.encode_key((shard, *([0] * len(self.row_shape))))
        return f"{self.path}/{key}" if self.path else key

    def _parse_index(self, raw: np.ndarray, shard: int) -> np.ndarray:
        return parse_shard_index(  # type: ignore[no-any-return]
            raw,
            self.index_size,
            where=self.where,
            name=OBSERVATION,
            key=self.key(shard),
            remedy=self.remedy,
        )

    async def _get(self, key: str, start: int | None, stop: int | None) -> np.ndarray | None:
        from zarr.abc.store import RangeByteRequest
        from zarr.core.buffer import default_buffer_prototype

        rng = None if start is None or stop is None else RangeByteRequest(start, stop)
        buf = await self.store.get(key, prototype=default_buffer_prototype(), byte_range=rng)
        return None if buf is None else buf.as_numpy_array()

    async def _index(self, shard: int) -> np.ndarray | None:
        if shard in self._indexes:  # coroutines run on one event loop: no lock needed
            self._indexes.move_to_end(shard)
            return self._indexes[shard]
        key = self.key(shard)
        if self.index_at_start:
            raw = await self._get(key, 0, self.index_size)
        else:
            from zarr.abc.store import SuffixByteRequest
            from zarr.core.buffer import default_buffer_prototype

            buf = await self.store.get(
                key,
                prototype=default_buffer_prototype(),
                byte_range=SuffixByteRequest(self.index_size),
            )
            raw = None if buf is None else buf.as_numpy_array()
        index = None if raw is None else self._parse_index(raw, shard)
        self._indexes[shard] = index
        while len(self._indexes) > _INDEX_CACHE:
            self._indexes.popitem(last=False)
        return index

    # -- fetching -----------------------------------------------------------------------
    def read(self, lo: int, hi: int, out: np.ndarray, halo: np.ndarray) -> np.ndarray:
        """Decode rows ``[lo, hi)`` into ``out`` and return the frames of rows ``halo``."""
        if not self.fast:
            out[:] = np.asarray(self.array[lo:hi])
            if not len(halo):
                return np.zeros((0, *self.row_shape), dtype=out.dtype)
            return np.asarray(self.array.get_orthogonal_selection((halo,)))
        from zarr.core.sync import sync

        cr = self.chunk_rows
        c0, c1 = lo // cr, -(-hi // cr)
        halo_chunks = sorted({int(r) // cr for r in halo.tolist()})
        main, *extra = sync(self._fetch(lo, hi, c0, c1, halo_chunks))
        # all units' requests fly at once; decoding takes the cores but one, which
        # is left to the loop that gathers batches
        with self._decoders:
            return self._decode_unit(lo, hi, out, halo, c0, c1, halo_chunks, main, extra)

    def _decode_unit(
        self,
        lo: int,
        hi: int,
        out: np.ndarray,
        halo: np.ndarray,
        c0: int,
        c1: int,
        halo_chunks: list[int],
        main: Any,
        extra: list[Any],
    ) -> np.ndarray:
        cr = self.chunk_rows
        shard = lo // self.shard_rows
        buf, base, index = main
        for c in range(c0, c1):
            a, b = max(c * cr, lo), min((c + 1) * cr, hi)
            dest = out[a - lo : b - lo]
            self._decode(c, buf, base, index, shard, dest, a - c * cr)
        frames = np.empty((len(halo), *self.row_shape), dtype=out.dtype)
        chunk = np.empty((cr, *self.row_shape), dtype=out.dtype)
        for c, (hbuf, hbase, hindex) in zip(halo_chunks, extra, strict=True):
            self._decode(c, hbuf, hbase, hindex, c // self.cps, chunk, 0)
            sel = np.flatnonzero(halo // cr == c)
            frames[sel] = chunk[halo[sel] - c * cr]
        return frames

    async def _fetch(self, lo: int, hi: int, c0: int, c1: int, halo_chunks: list[int]) -> list:
        shard = lo // self.shard_rows

        async def main() -> tuple[Any, int, Any]:
            start = shard * self.shard_rows
            if lo == start and hi == min(start + self.shard_rows, self.n):
                buf = await self._get(self.key(shard), None, None)  # the whole shard: one request
                if buf is None:
                    return None, 0, None
                raw = buf[: self.index_size] if self.index_at_start else buf[-self.index_size :]
                parsed = self._indexes[shard] = self._parse_index(raw, shard)
                # kept: the units on either side read one chunk of this shard
                while len(self._indexes) > _INDEX_CACHE:
                    self._indexes.popitem(last=False)
                return buf, 0, parsed
            index = await self._index(shard)
            if index is None:
                return None, 0, None
            rows = index[c0 % self.cps : (c1 - 1) % self.cps + 1]
            present = rows[rows[:, 0] != _MISSING]
            if not len(present):
                return None, 0, index
            a, b = int(present[:, 0].min()), int((present[:, 0] + present[:, 1]).max())
            return await self._get(self.key(shard), a, b), a, index

        async def one(c: int) -> tuple[Any, int, Any]:
            index = await self._index(c // self.cps)
            if index is None or index[c % self.cps, 0] == _MISSING:
                return None, 0, index
            off, nb = int(index[c % self.cps, 0]), int(index[c % self.cps, 1])
            return await self._get(self.key(c // self.cps), off, off + nb), off, index

        return list(await asyncio.gather(main(), *(one(c) for c in halo_chunks)))

    def _decode(
        self, c: int, buf: Any, base: int, index: Any, shard: int, dest: np.ndarray, skip: int
    ) -> None:
        """Chunk ``c`` into ``dest`` (its rows from ``skip`` on); checks as ChunkReader does."""
        cr = self.chunk_rows
        entry = None if index is None else index[c % self.cps]
        if buf is None or entry is None or int(entry[0]) == _MISSING:
            dest[...] = self.array.fill_value or 0
            return
        off, nb = int(entry[0]) - base, int(entry[1])
        src = buf[off : off + nb]
        key = self.key(shard)
        if len(src) != nb:
            raise self._corrupt(c, key, int(entry[0]), nb, "is cut short")
        whole = skip == 0 and len(dest) == cr and dest.flags.c_contiguous
        target = dest if whole else np.empty((cr, *self.row_shape), dtype=dest.dtype)
        problem = decode_chunk(src, target, checksum=self.checksum, chunk_nbytes=self.chunk_nbytes)
        if problem is not None:
            raise self._corrupt(c, key, int(entry[0]), nb, problem)
        if not whole:
            dest[...] = target[skip : skip + len(dest)]

    def _corrupt(self, c: int, key: str, off: int, size: int, what: str) -> StoreCorruptError:
        rows = (c * self.chunk_rows, min((c + 1) * self.chunk_rows, self.n) - 1)
        return corrupt_chunk(self.where, OBSERVATION, c, rows, key, (off, size), what, self.remedy)


def _dataset_remedy(ds: AtariZarrDataset) -> str:
    from atari_zarr.read.dataset import _remedy

    return _remedy(ds.metadata) or DEFAULT_REMEDY


class _UnitStream:
    """One consumer's rows of one store, taken ``n`` at a time as TED batches."""

    def __init__(
        self,
        ds: AtariZarrDataset,
        frames: _Frames,
        plan: EpochPlan,
        *,
        start: int,
        stop: int,
        prefetch: int,
        unit_rows: int,
    ) -> None:
        self.ds, self.frames, self.plan = ds, frames, plan
        self.k = ds.frame_stack
        self.n = len(ds)
        self.remaining = max(0, stop - start)
        self.prefetch = prefetch
        m = len(plan.units)
        self.halo_front = self.k - 1
        self.ext = self.halo_front + unit_rows + 1
        self.unit_rows = unit_rows
        # window units mixed, one more whose last rows wait in a partly taken batch,
        # prefetch units on their way (a batch larger than a unit may need more: _grow)
        self.n_slots = 0
        self.slab: np.ndarray
        self.col_action: np.ndarray
        self.col_reward: np.ndarray
        self.col_term: np.ndarray
        self.col_trunc: np.ndarray
        self.col_episode: np.ndarray
        self.col_first: np.ndarray
        self.slot_lo: np.ndarray
        self._allocate(min(m, plan.window + 1 + prefetch) if m else 0)
        self.finals: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.free = list(range(self.n_slots))[::-1]
        self.slot_of: dict[int, int] = {}
        self.slot_by_pos = np.full(m, -1, dtype=np.int64)
        self.futures: dict[int, Future] = {}
        self.segs: dict[int, np.ndarray] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.buffers: list[np.ndarray] = []
        seg, skip = plan.locate(start)
        self.next_seg = seg
        self.next_fetch = plan.needed(seg).start if seg < m else m
        self.pending: deque[list[Any]] = deque()  # [segment, positions, rows, head]
        self.skip = skip

    # -- units --------------------------------------------------------------------------
    def _allocate(self, n_slots: int) -> None:
        """The slab and per-step columns for ``n_slots`` units, keeping what they hold."""
        rows = self.unit_rows

        def grown(old: np.ndarray | None, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            # np.empty maps pages lazily: memory grows with the slots used, never beyond.
            new = np.empty((n_slots, *shape), dtype=dtype)
            if old is not None and len(old):
                new[: len(old)] = old
            return new

        first = self.n_slots == 0
        self.slab = grown(
            None if first else self.slab, (self.ext, *self.frames.row_shape), np.uint8
        )
        self.col_action = grown(None if first else self.col_action, (rows,), np.int64)
        self.col_reward = grown(None if first else self.col_reward, (rows,), np.float32)
        self.col_term = grown(None if first else self.col_term, (rows,), bool)
        self.col_trunc = grown(None if first else self.col_trunc, (rows,), bool)
        self.col_episode = grown(None if first else self.col_episode, (rows,), np.int64)
        self.col_first = grown(None if first else self.col_first, (rows,), np.int64)
        self.slot_lo = grown(None if first else self.slot_lo, (), np.int64)
        self.n_slots = n_slots

    def _grow(self) -> None:
        """One more slot: a batch spans more segments than the slots were sized for."""
        for fut in list(self.futures.values()):  # nothing may write into the old slab
            fut.result()
        log.debug("stream: growing the slab to %d units", self.n_slots + 1)
        self._allocate(self.n_slots + 1)
        self.free.append(self.n_slots - 1)

    def _submit(self) -> None:
        m = len(self.plan.units)
        horizon = min(m, self.next_seg + 1 + self.prefetch)
        while self.next_fetch < horizon:
            if not self.free:
                if self.next_fetch > self.next_seg:
                    break  # read ahead later, when a slot is free
                self._grow()  # the unit the next segment needs must have a slot
            j = self.next_fetch
            slot = self.free.pop()
            if self.pool is None:
                self.pool = ThreadPoolExecutor(
                    max(1, self.prefetch), thread_name_prefix="atari_zarr-stream"
                )
            self.slot_of[j] = slot
            self.slot_by_pos[j] = slot
            self.futures[j] = self.pool.submit(self._load, j, slot)
            self.next_fetch += 1

    def _load(self, j: int, slot: int) -> None:
        ds, k = self.ds, self.k
        lo, hi = (int(x) for x in self.plan.bounds[self.plan.units[j]])
        n = hi - lo
        ext = self.slab[slot]
        halo = np.r_[np.arange(max(0, lo - k + 1), lo), [hi] if hi < self.n else []]
        halo = halo.astype(np.int64)
        got = self.frames.read(lo, hi, ext[self.halo_front : self.halo_front + n], halo)
        for r, frame in zip(halo.tolist(), got, strict=True):
            ext[r - lo + self.halo_front] = frame
        rows = np.arange(lo, hi, dtype=np.int64)
        self.col_action[slot, :n] = ds._action[rows]
        self.col_reward[slot, :n] = ds._reward[rows]
        term, trunc = ds._terminated[rows], ds._truncated[rows]
        self.col_term[slot, :n], self.col_trunc[slot, :n] = term, trunc
        self.col_episode[slot, :n] = ds._episode[rows]
        if k > 1:
            self.col_first[slot, :n] = ds._episode_first_row(rows)
        self.slot_lo[slot] = lo
        done = np.flatnonzero(term | trunc)
        self.finals.pop(slot, None)
        if ds._final_obs is not None and len(done):
            eps = self.col_episode[slot, done]
            self.finals[slot] = (done, np.asarray(ds._final_obs.get_orthogonal_selection((eps,))))
        self.segs[j] = self.plan.row_segments(j)

    def _wait(self, positions: range) -> None:
        self._submit()
        for j in positions:
            fut = self.futures.pop(j, None)
            if fut is not None:
                fut.result()

    def _release(self) -> None:
        oldest = self.pending[0][0] if self.pending else self.next_seg
        last = len(self.plan.units) - 1
        for j in [j for j in self.slot_of if j not in self.futures]:
            if min(j + self.plan.window - 1, last) < oldest:
                self.free.append(self.slot_of.pop(j))
                self.segs.pop(j, None)

    # -- rows -----------------------------------------------------------------------------
    def _fill(self, n: int) -> int:
        have = sum(len(p[1]) - p[3] for p in self.pending)
        while have < n and self.next_seg < len(self.plan.units):
            s = self.next_seg
            self._wait(self.plan.needed(s))
            pos, rows = self.plan.segment(s, self.segs.__getitem__)
            entry = [s, pos, rows, self.skip]
            have += len(pos) - self.skip
            self.skip = 0
            self.pending.append(entry)
            self.next_seg += 1
            self._submit()
        return have

    def take(self, n: int) -> TensorDict | None:
        """Up to ``n`` rows (fewer at the end), or None when this consumer is done."""
        n = min(n, self.remaining)
        if n <= 0:
            return None
        n = min(n, self._fill(n))
        if n <= 0:
            return None
        slots, local, got = [], [], 0
        while got < n:
            _, pos, rows, head = self.pending[0]
            step = min(n - got, len(pos) - head)
            slots.append(self.slot_by_pos[pos[head : head + step]])
            local.append(rows[head : head + step])
            got += step
            if head + step == len(pos):
                self.pending.popleft()
            else:
                self.pending[0][3] = head + step
        batch = self._assemble(np.concatenate(slots), np.concatenate(local))
        self.remaining -= n
        self._release()
        self._submit()
        return batch

    def _buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """Frames of a new batch: a buffer of an earlier batch nobody holds any more, if any.

        A batch's tensors are views of its buffer; while any of them (or of their
        views) lives, the buffer's reference count shows it and it is not reused.
        Reuse spares the page faults of fresh memory, which cost more than the gather.
        """
        for buf in self.buffers:
            # references: the list, the loop variable, getrefcount's argument
            if buf.shape == shape and sys.getrefcount(buf) <= 3:
                return buf
        buf = np.empty(shape, dtype=np.uint8)
        if len(self.buffers) < _BUFFERS:
            self.buffers.append(buf)
        return buf

    def _assemble(self, slots: np.ndarray, local: np.ndarray) -> TensorDict:
        k, b = self.k, len(slots)
        rows = self.slot_lo[slots] + local
        term, trunc = self.col_term[slots, local], self.col_trunc[slots, local]
        done = term | trunc
        has_next = ~done & (rows + 1 < self.n)
        row_shape = self.frames.row_shape
        flat = self.slab.reshape(-1, *row_shape)
        base = slots * self.ext + local  # ext row of the oldest frame of the stack
        # One new array per batch, gathered into with np.take (a fresh array per
        # key, and fancy-index temporaries, cost page faults that dominate).
        # Every index stays inside its unit's slot; rows that are padding are
        # zeroed after the gather.
        if k == 1:
            both = self._buffer((2, b, *row_shape))
            np.take(flat, base, axis=0, out=both[0])
            np.take(flat, base + 1, axis=0, out=both[1])
            both[1][~has_next] = 0
            obs, nxt = both[0], both[1]
        else:
            first = self.col_first[slots, local]
            window = rows[:, None] + np.arange(1 - k, 2, dtype=np.int64)[None, :]
            valid = window >= first[:, None]
            valid[:, -1] &= has_next
            idx = base[:, None] + np.arange(k + 1, dtype=np.int64)[None, :]
            out = self._buffer((b, k + 1, *row_shape))
            np.take(flat, idx, axis=0, out=out)
            out[~valid] = 0
            obs, nxt = out[:, :k], out[:, 1:]
        if self.finals and done.any():
            for s in np.unique(slots[done]).tolist():
                if s in self.finals:
                    at, frames = self.finals[s]
                    sel = np.flatnonzero(done & (slots == s))
                    which = np.searchsorted(at, local[sel])
                    if k == 1:
                        nxt[sel] = frames[which]
                    else:
                        nxt[sel, -1] = frames[which]
        false = torch.zeros((b, 1), dtype=torch.bool)
        term_t = torch.from_numpy(term.reshape(b, 1))
        trunc_t = torch.from_numpy(trunc.reshape(b, 1))
        return TensorDict(
            {
                "observation": torch.from_numpy(obs),
                "action": torch.from_numpy(self.col_action[slots, local]),
                "episode": torch.from_numpy(self.col_episode[slots, local]),
                "index": torch.from_numpy(rows),
                "done": false,
                "terminated": false.clone(),
                "truncated": false.clone(),
                "next": TensorDict(
                    {
                        "observation": torch.from_numpy(nxt),
                        "reward": torch.from_numpy(self.col_reward[slots, local].reshape(b, 1)),
                        "terminated": term_t,
                        "truncated": trunc_t,
                        "done": term_t | trunc_t,
                    },
                    batch_size=[b],
                ),
            },
            batch_size=[b],
        )

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            # in-flight requests end on their own deadline; nothing waits for them
            pool.shutdown(wait=False, cancel_futures=True)


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return (
            int(dist.get_rank()) if rank is None else int(rank),
            int(dist.get_world_size()) if world_size is None else int(world_size),
        )
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


def _worker() -> tuple[int, int]:
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


def stream_memory_bound(
    frame_stack: int = 1,
    *,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    prefetch: int = DEFAULT_PREFETCH,
    unit_rows: int = 4096,
    frame_bytes: int = 84 * 84,
) -> int:
    """Bytes a stream holds for frames, per consumer (each DataLoader worker).

    ``(window + 1 + prefetch) * (unit_rows + frame_stack) * frame_bytes`` decoded,
    plus up to ``prefetch`` fetched units before decoding (at most as large again),
    with ``window = max(1, shuffle_buffer // unit_rows)``. Batches handed out and
    the dataset's per-step columns (about 2 bytes per transition once read) come
    on top.

    Examples
    --------
    >>> round(stream_memory_bound() / 2**20)
    358
    """
    window = max(1, shuffle_buffer // unit_rows)
    unit = (unit_rows + frame_stack) * frame_bytes
    return (window + 1 + prefetch) * unit + prefetch * unit


class AtariZarrStream(torch.utils.data.IterableDataset):
    """One epoch of a store as TED batches, each transition once: an ``IterableDataset``.

    Made by :meth:`AtariZarrDataset.stream <atari_zarr.AtariZarrDataset.stream>`
    (see there for the parameters). Iterating it yields this process's part of
    the epoch: with ``torch.distributed`` initialised (or ``rank``/``world_size``
    given), this rank's; in a DataLoader worker, this worker's part of it. Together
    the parts are the store, each transition once.

    Progress is one number per consumer (``rank * num_workers + worker``): the
    transitions it has emitted. :meth:`state_dict` holds them with the seed and
    epoch; a stream given that state by :meth:`load_state_dict` yields exactly the
    transitions not yet emitted. Iterating the stream itself counts what it yields;
    through a DataLoader with workers, use :meth:`loader` (which counts the batches
    it hands out) or call :meth:`record` on every batch.

    Examples
    --------
    >>> from atari_zarr import AtariZarrDataset
    >>> ds = AtariZarrDataset(store_url)
    >>> stream = ds.stream(64, seed=1, unit_rows=64)
    >>> rows = torch.cat([b["index"] for b in stream])
    >>> sorted(rows.tolist()) == list(range(len(ds)))
    True
    >>> stream.state_dict()["positions"] == {0: len(ds)}  # consumer 0 emitted everything
    True
    >>> stream.set_epoch(1)  # the next epoch: another order
    """

    def __init__(
        self,
        dataset: AtariZarrDataset,
        batch_size: int,
        *,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        unit_rows: int | None = None,
    ) -> None:
        where = dataset.where
        self.dataset = dataset
        self.batch_size = _positive_int(batch_size, "batch_size", where)
        self.seed = _positive_int(seed, "seed", where, zero=True)
        self.epoch = _positive_int(epoch, "epoch", where, zero=True)
        self.shuffle = bool(shuffle)
        self.shuffle_buffer = _positive_int(shuffle_buffer, "shuffle_buffer", where, zero=True)
        self.prefetch = _positive_int(prefetch, "prefetch", where)
        self.drop_last = bool(drop_last)
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise InvalidArgumentError(
                f"rank must be in [0, world_size); got rank={rank}, world_size={world_size} "
                f"for {where}"
            )
        self.rank, self.world_size = rank, world_size
        self._frames = _Frames(dataset)
        chunk = self._frames.chunk_rows
        if unit_rows is None:
            unit_rows = self._frames.shard_rows
        unit_rows = _positive_int(unit_rows, "unit_rows", where)
        if unit_rows % chunk or unit_rows > self._frames.shard_rows:
            raise InvalidArgumentError(
                f"unit_rows must be a multiple of the {chunk}-frame chunks of {where}, at most "
                f"a shard ({self._frames.shard_rows}); got {unit_rows}"
            )
        self.unit_rows = unit_rows
        self.window = max(1, self.shuffle_buffer // unit_rows)
        self.bounds = unit_bounds(
            len(dataset), shard_rows=self._frames.shard_rows, unit_rows=unit_rows
        )
        #: Transitions emitted per consumer in the current epoch (consumer -> rows).
        self.positions: dict[int, int] = {}
        self._consumers: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # the frame reader holds stores, caches and locks: rebuilt where unpickled
        state = dict(self.__dict__)
        del state["_frames"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._frames = _Frames(self.dataset)

    # -- the plan ---------------------------------------------------------------------
    def _plan(self, consumer: int, consumers: int) -> EpochPlan:
        return EpochPlan(
            self.bounds,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            window=self.window,
            consumer=consumer,
            consumers=consumers,
        )

    def _consumer_rows(self, consumers: int) -> list[int]:
        """Transitions each of ``consumers`` consumers reads in this epoch."""
        order = self._plan(0, consumers).order
        sizes = self.bounds[:, 1] - self.bounds[:, 0]
        return [int(sizes[order[c::consumers]].sum()) for c in range(consumers)]

    def _stop(self, plan: EpochPlan, consumers: int) -> int:
        """Rows this consumer emits: all, or with ``drop_last`` the whole batches all have."""
        if not self.drop_last:
            return plan.rows
        least = min(self._consumer_rows(consumers))
        return (least // self.batch_size) * self.batch_size

    def _check_consumers(self, consumers: int) -> None:
        if self._consumers is not None and self._consumers != consumers and self.positions:
            raise InvalidArgumentError(
                f"the stream of {self.dataset.where} was saved with {self._consumers} consumers "
                f"(world_size x num_workers) and is read with {consumers}; resume with the same "
                f"number of ranks and DataLoader workers"
            )
        self._consumers = consumers

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[TensorDict]:
        rank, world = _distributed(self.rank, self.world_size)
        worker, workers = _worker()
        consumers = world * workers
        consumer = rank * workers + worker
        self._check_consumers(consumers)
        yield from self._consume(consumer, consumers)

    def _consume(self, consumer: int, consumers: int) -> Iterator[TensorDict]:
        plan = self._plan(consumer, consumers)
        start = self.positions.get(consumer, 0)
        stop = self._stop(plan, consumers)
        engine = _UnitStream(
            self.dataset,
            self._frames,
            plan,
            start=start,
            stop=stop,
            prefetch=self.prefetch,
            unit_rows=self.unit_rows,
        )
        try:
            while True:
                want = self.batch_size
                batch = engine.take(want)
                if batch is None:
                    break
                if len(batch) < want and self.drop_last:
                    break
                self.positions[consumer] = self.positions.get(consumer, 0) + len(batch)
                yield batch
        finally:
            engine.close()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a new permutation); progress is reset."""
        self.epoch = _positive_int(epoch, "epoch", self.dataset.where, zero=True)
        self.positions = {}

    # -- progress ---------------------------------------------------------------------
    def record(self, batch: TensorDict, num_workers: int) -> None:
        """Count ``batch`` as seen: for a DataLoader with ``num_workers`` workers.

        The batch's consumer is found from its ``index`` (the plan is arithmetic).
        """
        rows = batch["index"]
        if not len(rows):
            return
        _, world = _distributed(self.rank, self.world_size)
        consumers = world * max(1, int(num_workers))
        self._check_consumers(consumers)
        unit = int(np.searchsorted(self.bounds[:, 1], int(rows[0]), side="right"))
        plan = self._plan(0, consumers)
        consumer = plan.position_of_unit(unit) % consumers
        self.positions[consumer] = self.positions.get(consumer, 0) + len(rows)

    def loader(self, **kwargs: Any) -> StreamLoader:
        """A DataLoader over this stream (``batch_size=None``) that records progress.

        Parameters
        ----------
        **kwargs
            For ``torch.utils.data.DataLoader`` (``num_workers``, ``pin_memory``,
            ``multiprocessing_context`` ...).
        """
        return StreamLoader(self, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """What resumes this epoch: seed, epoch, layout, and rows emitted per consumer.

        ``positions`` maps each consumer that has started (``rank * num_workers +
        worker``) to the transitions it has emitted in this epoch; a consumer
        missing from it starts at 0. A rank only knows its own consumers: each rank
        saves and loads its own state.
        """
        return {
            "version": _STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "window": self.window,
            "unit_rows": self.unit_rows,
            "transitions": len(self.dataset),
            "consumers": self._consumers,
            "positions": {int(c): int(p) for c, p in self.positions.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next iteration yields what was not yet seen."""
        expected = {
            "transitions": len(self.dataset),
            "unit_rows": self.unit_rows,
            "window": self.window,
            "shuffle": self.shuffle,
            # where each consumer stops depends on it
            "drop_last": self.drop_last,
        }
        found = {k: state.get(k) for k in expected}
        if state.get("version") != _STATE_VERSION or found != expected:
            raise InvalidArgumentError(
                f"this state does not belong to this stream of {self.dataset.where}: expected "
                f"{expected} (state version {_STATE_VERSION}), found {found} (version "
                f"{state.get('version')}); open the stream with the options it was saved with"
            )
        self.seed, self.epoch = int(state["seed"]), int(state["epoch"])
        self._consumers = state.get("consumers")
        self.positions = {int(c): int(p) for c, p in state["positions"].items()}

    def __repr__(self) -> str:
        return (
            f"AtariZarrStream({self.dataset.where!r}, batch_size={self.batch_size}, "
            f"seed={self.seed}, epoch={self.epoch}, shuffle_buffer={self.shuffle_buffer}, "
            f"units={len(self.bounds)})"
        )


class StreamLoader:
    """``DataLoader(stream, batch_size=None, **kwargs)`` that records the batches it yields."""

    def __init__(self, stream: Any, **kwargs: Any) -> None:
        from atari_zarr.read.dataset import collate_batch

        kwargs.setdefault("batch_size", None)
        # batches are TensorDicts already: the default conversion would take them apart
        kwargs.setdefault("collate_fn", collate_batch)
        self.stream = stream
        self.kwargs = kwargs

    def __iter__(self) -> Iterator[TensorDict]:
        loader = torch.utils.data.DataLoader(self.stream, **self.kwargs)
        workers = loader.num_workers
        for batch in loader:
            if workers:
                self.stream.record(batch, workers)
            yield batch


class MultiGameStream(torch.utils.data.IterableDataset):
    """One epoch of several stores, interleaved by their weights: an ``IterableDataset``.

    Made by :meth:`MultiGameDataset.stream <atari_zarr.MultiGameDataset.stream>`.
    Each store is read as by :class:`AtariZarrStream` (its own units, order and
    shuffle buffer, the same split across consumers). Each batch takes from every
    store a number of transitions drawn from a multinomial with the stores'
    weights, among the stores that have transitions left: an epoch yields every
    transition of every store once, and a store that runs out leaves the mix (with
    the default weights, proportional to the stores' lengths, all run out
    together). Batches carry ``game_id``, ``row`` and the global ``index`` of
    ``MultiGameDataset[idx]``, grouped by store.

    Examples
    --------
    >>> from atari_zarr import MultiGameDataset
    >>> mix = MultiGameDataset([store_url, store_url])
    >>> batches = list(mix.stream(100, seed=0, unit_rows=64))
    >>> sorted(torch.cat([b["index"] for b in batches]).tolist()) == list(range(len(mix)))
    True
    >>> sorted(set(batches[0]["game_id"].tolist()))
    [0, 1]
    """

    def __init__(
        self,
        mix: Any,
        batch_size: int,
        *,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        unit_rows: int | None = None,
    ) -> None:
        where = f"MultiGameDataset of {len(mix.datasets)} stores"
        self.mix = mix
        self.batch_size = _positive_int(batch_size, "batch_size", where)
        self.seed = _positive_int(seed, "seed", where, zero=True)
        self.epoch = _positive_int(epoch, "epoch", where, zero=True)
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = rank, world_size
        self.weights = np.asarray(mix.weights, dtype=np.float64)
        self.offsets = np.asarray(mix.offsets, dtype=np.int64)
        self.streams = [
            AtariZarrStream(
                d,
                batch_size,
                seed=seed,
                epoch=epoch,
                shuffle=shuffle,
                shuffle_buffer=shuffle_buffer,
                rank=rank,
                world_size=world_size,
                prefetch=prefetch,
                unit_rows=unit_rows,
            )
            for d in mix.datasets
        ]
        #: Batches emitted per consumer in the current epoch.
        self.batches: dict[int, int] = {}

    def _counts(self, left: np.ndarray, t: int, consumer: int, consumers: int) -> np.ndarray:
        """Transitions of each store in batch ``t``: multinomial by weight among stores left."""
        want = min(self.batch_size, int(left.sum()))
        rng = np.random.default_rng(
            [self.seed, self.epoch, consumers, consumer, t, 3]  # a stream of its own
        )
        counts = np.zeros(len(left), dtype=np.int64)
        while want > 0:
            p = np.where(left > counts, self.weights, 0.0)
            if p.sum() <= 0:  # only stores of weight 0 are left: take them evenly
                p = (left > counts).astype(np.float64)
            counts += rng.multinomial(want, p / p.sum())
            over = np.maximum(counts - left, 0)
            counts -= over
            want = int(over.sum())
        return counts

    def __iter__(self) -> Iterator[TensorDict]:
        rank, world = _distributed(self.rank, self.world_size)
        worker, workers = _worker()
        consumers, consumer = world * workers, rank * workers + worker
        engines, left = [], []
        try:
            stops = []
            for s in self.streams:
                s._check_consumers(consumers)
                plan = s._plan(consumer, consumers)
                start = s.positions.get(consumer, 0)
                engines.append(
                    _UnitStream(
                        s.dataset,
                        s._frames,
                        plan,
                        start=start,
                        stop=plan.rows,
                        prefetch=s.prefetch,
                        unit_rows=s.unit_rows,
                    )
                )
                left.append(plan.rows - start)
                stops.append(plan.rows)
            remaining = np.asarray(left, dtype=np.int64)
            limit = None
            if self.drop_last:
                per_store = [st._consumer_rows(consumers) for st in self.streams]
                totals = [sum(rows) for rows in zip(*per_store, strict=True)]
                limit = min(totals) // self.batch_size
            while remaining.sum() > 0:
                t = self.batches.get(consumer, 0)
                if limit is not None and t >= limit:
                    break
                counts = self._counts(remaining, t, consumer, consumers)
                if self.drop_last and counts.sum() < self.batch_size:
                    break
                parts = []
                for g in np.flatnonzero(counts).tolist():
                    td = engines[g].take(int(counts[g]))
                    assert td is not None and len(td) == counts[g]
                    td["row"] = td["index"]
                    td["index"] = td["index"] + int(self.offsets[g])
                    td["game_id"] = torch.full((len(td),), g, dtype=torch.int64)
                    parts.append(td)
                    s = self.streams[g]
                    s.positions[consumer] = s.positions.get(consumer, 0) + int(counts[g])
                remaining -= counts
                self.batches[consumer] = t + 1
                yield torch.cat(parts) if len(parts) > 1 else parts[0]
        finally:
            for e in engines:
                e.close()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` in every store; progress is reset."""
        self.epoch = int(epoch)
        self.batches = {}
        for s in self.streams:
            s.set_epoch(epoch)

    def record(self, batch: TensorDict, num_workers: int) -> None:
        """Count ``batch`` as seen: for a DataLoader with ``num_workers`` workers."""
        game = batch["game_id"].numpy()
        consumer = None
        for g in np.unique(game).tolist():
            part = batch[torch.from_numpy(game == g)]
            part = part.select("index").clone()
            part["index"] = part["index"] - int(self.offsets[g])
            self.streams[g].record(part, num_workers)
            if consumer is None:
                s = self.streams[g]
                consumers = s._consumers or 1
                unit = int(np.searchsorted(s.bounds[:, 1], int(part["index"][0]), side="right"))
                consumer = s._plan(0, consumers).position_of_unit(unit) % consumers
        if consumer is not None:
            self.batches[consumer] = self.batches.get(consumer, 0) + 1

    def loader(self, **kwargs: Any) -> StreamLoader:
        """A DataLoader over this stream (``batch_size=None``) that records progress."""
        return StreamLoader(self, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """Every store's stream state and the batches emitted per consumer."""
        return {
            "version": _STATE_VERSION,
            "batches": {int(c): int(n) for c, n in self.batches.items()},
            "stores": [s.state_dict() for s in self.streams],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        if state.get("version") != _STATE_VERSION or len(state.get("stores", [])) != len(
            self.streams
        ):
            raise InvalidArgumentError(
                f"this state does not belong to this stream of {len(self.streams)} stores "
                f"(found {len(state.get('stores', []))} stores, version {state.get('version')}); "
                f"open the stream with the stores and options it was saved with"
            )
        for s, sub in zip(self.streams, state["stores"], strict=True):
            s.load_state_dict(sub)
        self.seed, self.epoch = self.streams[0].seed, self.streams[0].epoch
        self.batches = {int(c): int(n) for c, n in state["batches"].items()}
