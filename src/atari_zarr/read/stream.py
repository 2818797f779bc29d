"""An epoch stream over one store or several: whole units read in shuffled order, batches out.

:class:`EpochStream` is an iterable of TED batches that yields every item of its
stores (every transition, or every window of ``K`` rows) exactly once per epoch,
across all ranks and DataLoader workers together, and a
``torch.utils.data.IterableDataset`` with ``state_dict()``/``load_state_dict()``.
It is made by :meth:`AtariZarrDataset.stream <atari_zarr.AtariZarrDataset.stream>`,
:meth:`MultiGameDataset.stream <atari_zarr.MultiGameDataset.stream>` and the
``stream`` of windows; ``AtariZarrStream`` and ``MultiGameStream`` are its names
for one store and several.

How a consumer (one rank's worker, :class:`~atari_zarr.read.consumer.Consumer`)
reads one store (``docs/streaming.md`` has the figures):

* The epoch's order of read units, their split across consumers and the order in
  which their items leave are arithmetic (:mod:`atari_zarr.read.epoch`), over the
  items each unit starts (:class:`~atari_zarr.read.items.Items`).
* **Units ahead**: a unit (a frame shard, 4096 frames) is fetched by the engine
  (:meth:`~atari_zarr.read.engine.ChunkEngine.fetch_span`: the whole shard object
  with one request), ``units_ahead`` units in flight on a thread pool, and
  decoded into a slot of one preallocated slab. The frames just outside a unit
  (``frame_stack - 1`` before it, ``L`` after it for items of ``L`` rows) come in
  the same round, so next observations, stacks and windows are exact at unit
  boundaries.
* Batches are gathered from the slab with one ``np.take`` into memory from a
  :class:`~atari_zarr.read.pool.BufferPool` and built by
  :mod:`atari_zarr.read.batch`: the shuffle buffer is item numbers into decoded
  units, never a second copy of the frames.

Several stores: each batch takes from every store a number of items drawn from a
multinomial with the stores' weights, among the stores that have items left; an
epoch yields every item of every store once. Batches then carry ``game_id``,
``row`` and the global ``index`` of ``MultiGameDataset[idx]``.

Layouts the engine does not read itself (unsharded arrays, other codecs) are read
unit by unit through zarr: the same batches, only slower.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.batch import (
    FrameBuffer,
    FramePlan,
    collate_batch,
    finish_batch,
    item_fields,
    put_final_frames,
)
from atari_zarr.read.consumer import Consumer, check_rank
from atari_zarr.read.engine import cpu_count
from atari_zarr.read.epoch import EpochPlan, unit_bounds
from atari_zarr.read.items import Items
from atari_zarr.read.store import StoreReader

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "DEFAULT_UNITS_AHEAD",
    "AtariZarrStream",
    "EpochStream",
    "MultiGameStream",
    "StreamLoader",
    "positive_int",
    "stream_memory_bound",
    "stream_over",
]

log = logging.getLogger("atari_zarr")

#: Transitions whose units are held decoded for mixing (4 shards of 4096 frames).
DEFAULT_SHUFFLE_BUFFER = 16384
#: Units fetched and decoded ahead of the one being read.
DEFAULT_UNITS_AHEAD = 4
_STATE_VERSION = 1


def positive_int(value: Any, name: str, where: str, *, zero: bool = False) -> int:
    """``value`` as an int (positive, or non-negative with ``zero``), or a one-line error."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or value < (0 if zero else 1)
    ):
        kind = "non-negative" if zero else "positive"
        raise InvalidArgumentError(f"{name} must be a {kind} integer; got {value!r} for {where}")
    return int(value)


def stream_memory_bound(
    frame_stack: int = 1,
    *,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    units_ahead: int = DEFAULT_UNITS_AHEAD,
    unit_rows: int = 4096,
    frame_bytes: int = 84 * 84,
    length: int = 1,
) -> int:
    """Bytes a stream holds for frames, per consumer (each DataLoader worker) and store.

    ``(window + 1 + units_ahead) * (unit_rows + frame_stack + length - 1) *
    frame_bytes`` decoded, plus up to ``units_ahead`` fetched units before decoding
    (at most as large again), with ``window = max(1, shuffle_buffer // unit_rows)``
    and ``length`` the rows of an item (1 for transitions, ``K`` for windows).
    Batches handed out and the per-step columns (about 2 bytes per transition
    once read) come on top.

    Examples
    --------
    >>> round(stream_memory_bound() / 2**20)
    358
    """
    window = max(1, shuffle_buffer // unit_rows)
    unit = (unit_rows + frame_stack + length - 1) * frame_bytes
    return (window + 1 + units_ahead) * unit + units_ahead * unit


class _Layout:
    """How one store is cut into units and which items each unit starts."""

    def __init__(self, store: StoreReader, items: Items, unit_rows: int | None) -> None:
        engine = store.engine
        grid = engine.grid
        if grid is not None and grid.sharded:
            self.chunk_rows = grid.chunk_rows
            self.shard_rows = int(grid.shard_rows)  # type: ignore[arg-type]
            self.fast = True
        else:
            if grid is None:
                log.info("%s: the stream reads units through zarr", store.where)
            chunks = int(store.observation.chunks[0])
            self.chunk_rows = chunks
            self.shard_rows = max(chunks, -(-4096 // chunks) * chunks)
            self.fast = False
        where = store.where
        if unit_rows is None:
            unit_rows = self.shard_rows
        unit_rows = positive_int(unit_rows, "unit_rows", where)
        if unit_rows % self.chunk_rows or unit_rows > self.shard_rows:
            raise InvalidArgumentError(
                f"unit_rows must be a multiple of the {self.chunk_rows}-frame chunks of {where}, "
                f"at most a shard ({self.shard_rows}); got {unit_rows}"
            )
        self.unit_rows = unit_rows
        rows = unit_bounds(len(store), shard_rows=self.shard_rows, unit_rows=unit_rows)
        counts = items.count_before(rows.ravel()).reshape(-1, 2) if len(rows) else rows
        if not items.identity:  # units that start no item are not read
            keep = counts[:, 1] > counts[:, 0]
            rows, counts = rows[keep], counts[keep]
        #: Row ranges of the units; :attr:`bounds`: the item ranges they start.
        self.rows = rows
        self.bounds = counts

    def unit_of_row(self, row: int) -> int:
        return int(np.searchsorted(self.rows[:, 1], row, side="right"))


class _UnitReader:
    """One consumer's items of one store, taken ``n`` at a time as TED batches."""

    def __init__(
        self,
        store: StoreReader,
        items: Items,
        layout: _Layout,
        plan: EpochPlan,
        *,
        stack: int,
        start: int,
        stop: int,
        units_ahead: int,
        decoders: threading.BoundedSemaphore,
    ) -> None:
        self.store, self.items, self.layout, self.plan = store, items, layout, plan
        self.k = stack
        self.length = items.length
        self.n = len(store)
        self.remaining = max(0, stop - start)
        self.units_ahead = units_ahead
        self.decoders = decoders
        m = len(plan.units)
        self.halo_front = self.k - 1
        unit_rows = layout.unit_rows
        #: Frames held per unit: the stacks before it, the unit, the items' rows after it.
        self.ext = self.halo_front + unit_rows + self.length
        #: Per-step values held per unit: its rows and the items' rows after it.
        self.cols = unit_rows + self.length - 1
        self.windowed = not items.identity
        # window units mixed, one more whose last items wait in a partly taken batch,
        # units ahead on their way (a batch larger than a unit may need more: _grow)
        self.n_slots = 0
        self.slab: np.ndarray
        self.col: dict[str, np.ndarray] = {}
        self.slot_lo: np.ndarray
        self.slot_items: np.ndarray
        self._allocate(min(m, plan.window + 1 + units_ahead) if m else 0)
        self.finals: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.free = list(range(self.n_slots))[::-1]
        self.slot_of: dict[int, int] = {}
        self.slot_by_pos = np.full(m, -1, dtype=np.int64)
        self.futures: dict[int, Future] = {}
        self.segs: dict[int, np.ndarray] = {}
        self.pool: ThreadPoolExecutor | None = None
        seg, skip = plan.locate(start)
        self.next_seg = seg
        self.next_fetch = plan.needed(seg).start if seg < m else m
        self.pending: deque[list[Any]] = deque()  # [segment, positions, items, head]
        self.skip = skip

    # -- units --------------------------------------------------------------------------
    def _columns(self) -> dict[str, Any]:
        names: dict[str, Any] = {
            "action": np.int64,
            "reward": np.float32,
            "terminated": bool,
            "truncated": bool,
            "episode": np.int64,
            "first": np.int64,
        }
        if self.windowed:
            names["return_to_go"] = np.float32
        return names

    def _allocate(self, n_slots: int) -> None:
        """The slab and per-step columns for ``n_slots`` units, keeping what they hold."""

        def grown(old: np.ndarray | None, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            # np.empty maps pages lazily: memory grows with the slots used, never beyond.
            new = np.empty((n_slots, *shape), dtype=dtype)
            if old is not None and len(old):
                new[: len(old)] = old
            return new

        first = self.n_slots == 0
        frame_shape = tuple(self.store.observation.shape[1:])
        self.slab = grown(None if first else self.slab, (self.ext, *frame_shape), np.uint8)
        for name, dtype in self._columns().items():
            self.col[name] = grown(None if first else self.col[name], (self.cols,), dtype)
        self.slot_lo = grown(None if first else self.slot_lo, (), np.int64)
        self.slot_items = grown(None if first else self.slot_items, (), np.int64)
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
        horizon = min(m, self.next_seg + 1 + self.units_ahead)
        while self.next_fetch < horizon:
            if not self.free:
                if self.next_fetch > self.next_seg:
                    break  # read ahead later, when a slot is free
                self._grow()  # the unit the next segment needs must have a slot
            j = self.next_fetch
            slot = self.free.pop()
            if self.pool is None:
                self.pool = ThreadPoolExecutor(
                    max(1, self.units_ahead), thread_name_prefix="atari_zarr-stream"
                )
            self.slot_of[j] = slot
            self.slot_by_pos[j] = slot
            self.futures[j] = self.pool.submit(self._load, j, slot)
            self.next_fetch += 1

    def _read_frames(self, lo: int, hi: int, ext: np.ndarray) -> None:
        """Frames of rows ``[lo, hi)`` and of the rows just outside into ``ext``."""
        k, n = self.k, self.n
        count = hi - lo
        halo = np.r_[
            np.arange(max(0, lo - k + 1), lo), np.arange(hi, min(hi + self.length, n))
        ].astype(np.int64)
        out = ext[self.halo_front : self.halo_front + count]
        engine = self.store.engine
        if self.layout.fast:
            cr = self.layout.chunk_rows
            extra = sorted({int(r) // cr for r in halo.tolist()})
            span, around = engine.fetch_span(lo, hi, extra)
            # all units' requests fly at once; decoding takes the cores but one, which
            # is left to the loop that gathers batches
            with self.decoders:
                got = engine.decode_span(lo, hi, out, span, halo, around)
        else:
            out[:] = np.asarray(self.store.observation[lo:hi])
            got = engine.read_generic(halo)
        ext[halo - lo + self.halo_front] = got

    def _load(self, j: int, slot: int) -> None:
        store = self.store
        unit = int(self.plan.units[j])
        lo, hi = (int(x) for x in self.layout.rows[unit])
        self._read_frames(lo, hi, self.slab[slot])
        top = min(hi + self.length - 1, self.n)
        rows = np.arange(lo, top, dtype=np.int64)
        c = len(rows)
        col = self.col
        col["action"][slot, :c] = store.action[rows]
        col["reward"][slot, :c] = store.reward[rows]
        term, trunc = store.terminated[rows], store.truncated[rows]
        col["terminated"][slot, :c], col["truncated"][slot, :c] = term, trunc
        col["episode"][slot, :c] = store.episode[rows]
        col["first"][slot, :c] = store.episodes.starts[col["episode"][slot, :c]]
        if self.windowed:
            col["return_to_go"][slot, :c] = store.return_to_go(rows)
        self.slot_lo[slot] = lo
        self.slot_items[slot] = int(self.layout.bounds[unit, 0])
        done = np.flatnonzero(term | trunc)
        self.finals.pop(slot, None)
        if store.final_observation is not None and len(done):
            eps = col["episode"][slot, done]
            self.finals[slot] = (done, store.final_frames(eps))
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

    # -- items ----------------------------------------------------------------------------
    def _fill(self, n: int) -> int:
        have = sum(len(p[1]) - p[3] for p in self.pending)
        while have < n and self.next_seg < len(self.plan.units):
            s = self.next_seg
            self._wait(self.plan.needed(s))
            pos, local = self.plan.segment(s, self.segs.__getitem__)
            entry = [s, pos, local, self.skip]
            have += len(pos) - self.skip
            self.skip = 0
            self.pending.append(entry)
            self.next_seg += 1
            self._submit()
        return have

    def take(self, n: int) -> TensorDict | None:
        """Up to ``n`` items (fewer at the end), or None when this consumer is done."""
        n = min(n, self.remaining)
        if n <= 0:
            return None
        n = min(n, self._fill(n))
        if n <= 0:
            return None
        slots, local, got = [], [], 0
        while got < n:
            _, pos, items, head = self.pending[0]
            step = min(n - got, len(pos) - head)
            slots.append(self.slot_by_pos[pos[head : head + step]])
            local.append(items[head : head + step])
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

    def _assemble(self, slots: np.ndarray, local: np.ndarray) -> TensorDict:
        """The batch of items ``local`` (item numbers within their unit) of ``slots``."""
        k, length, b = self.k, self.length, len(slots)
        item = self.slot_items[slots] + local
        starts = self.items.starts(item)
        real = self.items.real(item)
        off = starts - self.slot_lo[slots]  # column of each item's first row in its slot
        # per-step values: one flat index into the slots' columns
        base = slots * self.cols
        last = base + off + (length - 1 if real is None else real - 1)
        cols = {name: col.reshape(-1) for name, col in self.col.items()}
        plan = FramePlan(
            starts=starts,
            length=length,
            stack=k,
            first=cols["first"].take(base + off),
            last_done=cols["terminated"].take(last) | cols["truncated"].take(last),
            n_rows=self.n,
            valid=real,
        )
        frame_shape = self.slab.shape[2:]
        buffer = FrameBuffer(self.store.pool, b, length, k, frame_shape)
        # slab row of the oldest frame of each item is its first row's column: the
        # halo in front holds the k - 1 frames before the unit
        at = (slots * self.ext + off)[:, None] + np.arange(length + k, dtype=np.int64)[None, :]
        flat = self.slab.reshape(-1, *frame_shape)
        # one gather of every distinct frame into reused memory; rows that are padding
        # (or beyond the end of the store) are zeroed after. mode='clip': with the
        # default mode numpy gathers into a temporary buffer first
        np.take(flat, buffer.flat(at), axis=0, out=buffer.frames, mode="clip")
        valid = buffer.flat(plan.valid)
        if not valid.all():
            buffer.frames[~valid] = 0
        if self.finals and plan.last_done.any():
            self._put_finals(buffer, plan, slots, last - base)
        obs, nxt = buffer.views(self.windowed)
        steps_at = off[:, None] + np.arange(length, dtype=np.int64)[None, :]
        exists = None
        if real is not None:
            exists = np.arange(length)[None, :] < real[:, None]
            steps_at = np.where(exists, steps_at, off[:, None])
        fi = (base[:, None] + steps_at).ravel()
        steps = {
            name: cols[name].take(fi)
            for name in ("action", "reward", "terminated", "truncated", "episode")
        }
        rows2d = starts[:, None] + np.arange(length, dtype=np.int64)[None, :]
        if self.windowed:
            steps["return_to_go"] = cols["return_to_go"].take(fi)
            steps["timestep"] = (starts[:, None] + steps_at - off[:, None]).ravel() - cols[
                "first"
            ].take(fi)
        fields = item_fields(rows2d, exists, steps, window=self.windowed)
        return finish_batch(obs, nxt, plan, fields)

    def _put_finals(
        self, buffer: FrameBuffer, plan: FramePlan, slots: np.ndarray, last: np.ndarray
    ) -> None:
        items, frames = [], []
        for i in np.flatnonzero(plan.last_done).tolist():
            kept = self.finals.get(int(slots[i]))
            if kept is None:
                continue
            at, finals = kept
            items.append(i)
            frames.append(finals[int(np.searchsorted(at, last[i]))])
        if items:
            idx = np.asarray(items, dtype=np.int64)
            put_final_frames(buffer, idx, plan.next_pos[idx], np.stack(frames))

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            # in-flight requests end on their own deadline; nothing waits for them
            pool.shutdown(wait=False, cancel_futures=True)


class EpochStream(torch.utils.data.IterableDataset):
    """One epoch of one store or several as TED batches, each item once: an ``IterableDataset``.

    Made by :meth:`AtariZarrDataset.stream <atari_zarr.AtariZarrDataset.stream>`,
    :meth:`MultiGameDataset.stream <atari_zarr.MultiGameDataset.stream>` and the
    windows' ``stream`` (see there for the parameters). Iterating it yields this
    process's part of the epoch: with ``torch.distributed`` initialised (or
    ``rank``/``world_size`` given), this rank's; in a DataLoader worker, this
    worker's part of it. Together the parts are every item, each once.

    Progress is one number per consumer (``rank * num_workers + worker``) and
    store: the items it has emitted. :meth:`state_dict` holds them with the seed
    and epoch; a stream given that state by :meth:`load_state_dict` yields exactly
    the items not yet emitted. Iterating the stream itself counts what it yields;
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
        stores: Sequence[StoreReader],
        items: Sequence[Items],
        batch_size: int,
        *,
        frame_stack: int = 1,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        units_ahead: int = DEFAULT_UNITS_AHEAD,
        unit_rows: int | None = None,
        weights: Sequence[float] | np.ndarray | None = None,
        several: bool | None = None,
    ) -> None:
        self.stores = list(stores)
        self.items = list(items)
        #: True: batches carry ``game_id``, ``row`` and a global ``index``.
        self.several = len(self.stores) > 1 if several is None else bool(several)
        where = (
            f"MultiGameDataset of {len(self.stores)} stores" if self.several else stores[0].where
        )
        self.where = where
        self.frame_stack = positive_int(frame_stack, "frame_stack", where)
        self.batch_size = positive_int(batch_size, "batch_size", where)
        self.seed = positive_int(seed, "seed", where, zero=True)
        self.epoch = positive_int(epoch, "epoch", where, zero=True)
        self.shuffle = bool(shuffle)
        self.shuffle_buffer = positive_int(shuffle_buffer, "shuffle_buffer", where, zero=True)
        self.units_ahead = positive_int(units_ahead, "units_ahead", where)
        self.drop_last = bool(drop_last)
        check_rank(rank, world_size, where)
        self.rank, self.world_size = rank, world_size
        self._unit_rows_asked = unit_rows
        self._layouts = [
            _Layout(s, i, unit_rows) for s, i in zip(self.stores, self.items, strict=True)
        ]
        self.unit_rows = self._layouts[0].unit_rows
        self.window = max(1, self.shuffle_buffer // self.unit_rows)
        lengths = np.array([len(i) for i in self.items], dtype=np.int64)
        #: Global index of each store's first row (``MultiGameDataset``'s offsets).
        self.offsets = np.concatenate([[0], np.cumsum([len(s) for s in self.stores])]).astype(
            np.int64
        )
        self._item_count = int(lengths.sum())
        if weights is None:
            w = lengths.astype(np.float64)
        else:
            w = np.asarray(weights, dtype=np.float64)
        w = np.where(lengths > 0, w, 0.0)
        self.weights = w / w.sum() if w.sum() > 0 else w
        #: Items emitted per store and consumer in the current epoch.
        self.store_positions: list[dict[int, int]] = [{} for _ in self.stores]
        #: Batches emitted per consumer in the current epoch (several stores).
        self.batches: dict[int, int] = {}
        self._consumers: int | None = None

    # -- the one-store view -------------------------------------------------------------
    @property
    def dataset(self) -> StoreReader:
        return self.stores[0]

    @property
    def bounds(self) -> np.ndarray:
        """Row ranges of the read units of the (first) store."""
        return self._layouts[0].rows

    @property
    def positions(self) -> dict[int, int]:
        """Items emitted per consumer in this epoch (the first store)."""
        return self.store_positions[0]

    @positions.setter
    def positions(self, value: dict[int, int]) -> None:
        self.store_positions[0] = value

    @property
    def fast(self) -> bool:
        """True when units are read by the engine (False: through zarr-python)."""
        return all(layout.fast for layout in self._layouts)

    def __getstate__(self) -> dict[str, Any]:
        # stores hold file systems, caches and locks: opened again where unpickled
        state = dict(self.__dict__)
        state["stores"] = [s.reopen_state() for s in self.stores]
        del state["_layouts"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        stores = [StoreReader(**s) for s in state.pop("stores")]
        self.__dict__.update(state)
        self.stores = stores
        self._layouts = [
            _Layout(s, i, self._unit_rows_asked) for s, i in zip(stores, self.items, strict=True)
        ]

    # -- the plan ---------------------------------------------------------------------
    def _plan(self, g: int, consumer: int, consumers: int) -> EpochPlan:
        return EpochPlan(
            self._layouts[g].bounds,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            window=self.window,
            consumer=consumer,
            consumers=consumers,
        )

    def _consumer_items(self, g: int, consumers: int) -> list[int]:
        """Items each of ``consumers`` consumers reads from store ``g`` in this epoch."""
        bounds = self._layouts[g].bounds
        order = self._plan(g, 0, consumers).order
        sizes = bounds[:, 1] - bounds[:, 0]
        return [int(sizes[order[c::consumers]].sum()) for c in range(consumers)]

    def _check_consumers(self, consumers: int) -> None:
        started = any(p for p in self.store_positions)
        if self._consumers is not None and self._consumers != consumers and started:
            raise InvalidArgumentError(
                f"the stream of {self.where} was saved with {self._consumers} consumers "
                f"(world_size x num_workers) and is read with {consumers}; resume with the same "
                f"number of ranks and DataLoader workers"
            )
        self._consumers = consumers

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[TensorDict]:
        me = Consumer.current(self.rank, self.world_size)
        self._check_consumers(me.count)
        yield from self._consume(me.index, me.count)

    def _readers(self, consumer: int, consumers: int) -> list[_UnitReader]:
        decoders = threading.BoundedSemaphore(max(1, cpu_count() - 1))
        readers = []
        for g, (store, items) in enumerate(zip(self.stores, self.items, strict=True)):
            plan = self._plan(g, consumer, consumers)
            start = self.store_positions[g].get(consumer, 0)
            stop = plan.rows
            if self.drop_last and not self.several:
                least = min(self._consumer_items(g, consumers))
                stop = (least // self.batch_size) * self.batch_size
            readers.append(
                _UnitReader(
                    store,
                    items,
                    self._layouts[g],
                    plan,
                    stack=self.frame_stack,
                    start=start,
                    stop=stop,
                    units_ahead=self.units_ahead,
                    decoders=decoders,
                )
            )
        return readers

    def _counts(self, left: np.ndarray, t: int, consumer: int, consumers: int) -> np.ndarray:
        """Items of each store in batch ``t``: multinomial by weight among stores left."""
        want = min(self.batch_size, int(left.sum()))
        if len(left) == 1:
            return np.array([want], dtype=np.int64)
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

    def _consume(self, consumer: int, consumers: int) -> Iterator[TensorDict]:
        readers = self._readers(consumer, consumers)
        try:
            remaining = np.array([r.remaining for r in readers], dtype=np.int64)
            limit = None
            if self.drop_last and self.several:
                per_store = [self._consumer_items(g, consumers) for g in range(len(readers))]
                totals = [sum(rows) for rows in zip(*per_store, strict=True)]
                limit = min(totals) // self.batch_size
            while remaining.sum() > 0:
                t = self.batches.get(consumer, 0)
                if limit is not None and t >= limit:
                    break
                counts = self._counts(remaining, t, consumer, consumers)
                if self.several and self.drop_last and counts.sum() < self.batch_size:
                    break
                parts = []
                for g in np.flatnonzero(counts).tolist():
                    td = readers[g].take(int(counts[g]))
                    if td is None:  # pragma: no cover - counts never exceed what is left
                        continue
                    if self.several:
                        idx = td["index"]
                        td["row"] = idx
                        # padding positions of windows keep their -1
                        td["index"] = torch.where(idx >= 0, idx + int(self.offsets[g]), idx)
                        td["game_id"] = torch.full(td.batch_size, g, dtype=torch.int64)
                    parts.append(td)
                    pos = self.store_positions[g]
                    pos[consumer] = pos.get(consumer, 0) + len(td)
                if not parts:
                    break
                if not self.several and len(parts[0]) < self.batch_size and self.drop_last:
                    break
                remaining -= counts
                self.batches[consumer] = t + 1
                yield torch.cat(parts) if len(parts) > 1 else parts[0]
        finally:
            for r in readers:
                r.close()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a new permutation); progress is reset."""
        self.epoch = positive_int(epoch, "epoch", self.where, zero=True)
        self.store_positions = [{} for _ in self.stores]
        self.batches = {}

    # -- progress ---------------------------------------------------------------------
    def _consumer_of(self, g: int, row: int, consumers: int) -> int:
        unit = self._layouts[g].unit_of_row(row)
        return self._plan(g, 0, consumers).position_of_unit(unit) % consumers

    def record(self, batch: TensorDict, num_workers: int) -> None:
        """Count ``batch`` as seen: for a DataLoader with ``num_workers`` workers.

        The batch's consumer is found from its ``index`` (the plan is arithmetic).
        """
        if not len(batch):
            return
        consumers = Consumer.current(self.rank, self.world_size, workers=num_workers).count
        self._check_consumers(consumers)
        index = batch["row"] if self.several else batch["index"]
        games = batch["game_id"] if self.several else torch.zeros(len(batch), dtype=torch.int64)
        if index.ndim > 1:  # windows: the first row of each
            index, games = index[:, 0], games[:, 0] if games.ndim > 1 else games
        consumer = None
        for g in torch.unique(games).tolist():
            rows = index[games == g]
            c = self._consumer_of(g, int(rows[0]), consumers)
            consumer = c if consumer is None else consumer
            pos = self.store_positions[g]
            pos[c] = pos.get(c, 0) + len(rows)
        if consumer is not None:
            self.batches[consumer] = self.batches.get(consumer, 0) + 1

    def loader(self, **kwargs: Any) -> StreamLoader:
        """A DataLoader over this stream (``batch_size=None``) that records progress.

        Parameters
        ----------
        **kwargs
            For ``torch.utils.data.DataLoader`` (``num_workers``, ``pin_memory``,
            ``multiprocessing_context`` ...).
        """
        return StreamLoader(self, **kwargs)

    def _store_state(self, g: int) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "window": self.window,
            "unit_rows": self.unit_rows,
            "items": self.items[g].token,
            "transitions": len(self.stores[g]),
            "consumers": self._consumers,
            "positions": {int(c): int(p) for c, p in self.store_positions[g].items()},
        }

    def state_dict(self) -> dict[str, Any]:
        """What resumes this epoch: seed, epoch, layout, and items emitted per consumer.

        ``positions`` maps each consumer that has started (``rank * num_workers +
        worker``) to the items it has emitted in this epoch; a consumer missing
        from it starts at 0. With several stores, ``stores`` holds that state for
        each store and ``batches`` the batches emitted per consumer. A rank only
        knows its own consumers: each rank saves and loads its own state.
        """
        if not self.several:
            return self._store_state(0)
        return {
            "version": _STATE_VERSION,
            "batches": {int(c): int(n) for c, n in self.batches.items()},
            "stores": [self._store_state(g) for g in range(len(self.stores))],
        }

    def _load_store_state(self, g: int, state: dict[str, Any]) -> None:
        expected = {
            "transitions": len(self.stores[g]),
            "unit_rows": self.unit_rows,
            "window": self.window,
            "shuffle": self.shuffle,
            # where each consumer stops depends on it
            "drop_last": self.drop_last,
            "items": self.items[g].token,
        }
        found = {k: state.get(k) for k in expected}
        found["items"] = state.get("items", "transitions")  # states saved before windows
        if state.get("version") != _STATE_VERSION or found != expected:
            raise InvalidArgumentError(
                f"this state does not belong to this stream of {self.where}: expected "
                f"{expected} (state version {_STATE_VERSION}), found {found} (version "
                f"{state.get('version')}); open the stream with the options it was saved with"
            )
        self.seed, self.epoch = int(state["seed"]), int(state["epoch"])
        self._consumers = state.get("consumers")
        self.store_positions[g] = {int(c): int(p) for c, p in state["positions"].items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next iteration yields what was not yet seen."""
        if not self.several:
            self._load_store_state(0, state)
            self.batches = {}
            return
        stores = state.get("stores", [])
        if state.get("version") != _STATE_VERSION or len(stores) != len(self.stores):
            raise InvalidArgumentError(
                f"this state does not belong to this stream of {len(self.stores)} stores "
                f"(found {len(stores)} stores, version {state.get('version')}); "
                f"open the stream with the stores and options it was saved with"
            )
        for g, sub in enumerate(stores):
            self._load_store_state(g, sub)
        self.batches = {int(c): int(n) for c, n in state["batches"].items()}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.where!r}, batch_size={self.batch_size}, "
            f"seed={self.seed}, epoch={self.epoch}, shuffle_buffer={self.shuffle_buffer}, "
            f"items={self._item_count})"
        )


#: The stream of one store (:meth:`AtariZarrDataset.stream`).
AtariZarrStream = EpochStream
#: The stream of several stores (:meth:`MultiGameDataset.stream`).
MultiGameStream = EpochStream


def stream_over(
    stores: Sequence[StoreReader],
    items: Sequence[Items],
    batch_size: int,
    *,
    shuffle_buffer: int | None = None,
    units_ahead: int | None = None,
    **kwargs: Any,
) -> EpochStream:
    """An :class:`EpochStream`, with the defaults of ``shuffle_buffer`` and ``units_ahead``."""
    return EpochStream(
        stores,
        items,
        batch_size,
        shuffle_buffer=DEFAULT_SHUFFLE_BUFFER if shuffle_buffer is None else shuffle_buffer,
        units_ahead=DEFAULT_UNITS_AHEAD if units_ahead is None else units_ahead,
        **kwargs,
    )


class StreamLoader:
    """``DataLoader(stream, batch_size=None, **kwargs)`` that records the batches it yields."""

    def __init__(self, stream: Any, **kwargs: Any) -> None:
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
