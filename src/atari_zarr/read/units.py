"""Units of one store or several read ahead into one slab, and items taken out as batches.

One :class:`UnitReader` serves one consumer (:func:`~atari_zarr.place.current_place`)
of an epoch of :class:`~atari_zarr.read.stream.EpochStream`, whatever the number of
stores: one slab, one shuffle buffer, one set of units ahead, so its memory does not
grow with the stores; a store no unit in flight comes from costs nothing here.
:class:`UnitLayout` cuts one store into read units and counts the items
(:class:`~atari_zarr.read.items.Items`) each unit starts; :class:`Units` puts every
store's units in one list, item numbers global, which the epoch plan
(:mod:`atari_zarr.read.epoch`) permutes and splits. How units are fetched ahead and
decoded into the slab's slots with the frames just outside them, and how
:meth:`UnitReader.batches` gathers batches from the slab (one gather, never a second
copy of the frames, on a thread of its own while the next batch is planned:
:mod:`~atari_zarr.storage.row_gather`), is ``docs/streaming.md``'s "How it works".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
from tensordict import TensorDict

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.forks import after_fork
from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.read.batch import (
    STEP_ENTRIES,
    FrameBuffer,
    FramePlan,
    assemble_batch,
    step_fields,
    step_values,
    steps_before_by_store,
    ted_tensordict,
)
from atari_zarr.read.epoch import EpochPlan, unit_bounds
from atari_zarr.read.items import Items, item_rows
from atari_zarr.read.member import Member
from atari_zarr.read.pool import BufferPool, resident
from atari_zarr.read.store import StoreReader
from atari_zarr.storage.row_gather import Gatherer, PendingGather, gatherer

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "DEFAULT_UNITS_AHEAD",
    "Slots",
    "StreamMemory",
    "UnitLayout",
    "UnitReader",
    "Units",
    "kept_units_bytes",
    "slot_frames",
    "stream_memory_bound",
]

log = logging.getLogger("atari_zarr")

#: Transitions whose units are held decoded for mixing (4 shards of 4096 frames).
DEFAULT_SHUFFLE_BUFFER = 16384
#: Units fetched and decoded ahead of the one being read.
DEFAULT_UNITS_AHEAD = 4
#: Seconds :meth:`UnitReader.close` waits for a thread that reads a unit to end (a
#: guard against a hang: a unit decodes in well under a second, a request ends by its
#: deadline).
STOP_GUARD = 120


def slot_frames(rows: int, frame_stack: int = 1, length: int = 1) -> int:
    """Frames a slot of the slab holds for a unit of ``rows`` rows: the ``frame_stack - 1``
    frames before it (stacks), its rows, and the ``length`` rows after its last items
    (next observations, windows).

    Examples
    --------
    >>> slot_frames(4096, frame_stack=4)
    4100
    """
    return frame_stack - 1 + rows + length


def stream_memory_bound(
    frame_stack: int = 1,
    *,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    units_ahead: int = DEFAULT_UNITS_AHEAD,
    unit_rows: int = 4096,
    frame_bytes: int = 84 * 84,
    length: int = 1,
) -> int:
    """Bytes a stream holds for frames, per consumer (each DataLoader worker), whatever
    the number of stores.

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
    unit = slot_frames(unit_rows, frame_stack, length) * frame_bytes
    return (window + 1 + units_ahead) * unit + units_ahead * unit


class UnitLayout:
    """How one store is cut into units and which items each unit starts."""

    def __init__(self, store: StoreReader, items: Items, unit_rows: int | None) -> None:
        # a store not opened yet tells from its zarr.json alone
        self.chunk_rows, self.shard_rows, self.fast = store.frame_rows()
        where = store.where
        if not self.fast:
            log.info("%s: the stream reads units through zarr", where)
        if unit_rows is None:
            unit_rows = self.shard_rows
        unit_rows = whole_number(unit_rows, "unit_rows", where, unit="rows")
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


class Units:
    """Every store's read units as one list: the units an epoch plan permutes and splits.

    Store ``g``'s units follow store ``g - 1``'s; item numbers are global, store
    ``g``'s items numbered from ``item_offsets[g]`` (one store: its own numbers).

    Parameters
    ----------
    members : sequence of Member
        The stores (one not opened yet is cut from its ``zarr.json`` alone), and what
        an item of each is (one kind and length for all).
    unit_rows : int, optional
        Rows per unit (default: each store's shard).
    """

    def __init__(self, members: list[Member], unit_rows: int | None) -> None:
        self.layouts = [UnitLayout(m.store, m.items, unit_rows) for m in members]
        #: Rows per unit of the first store (the shuffle window is counted in these).
        self.unit_rows = self.layouts[0].unit_rows
        #: Global item number of each store's first item (``len(stores) + 1``).
        self.item_offsets = np.cumsum([0, *(len(m.items) for m in members)], dtype=np.int64)
        per = [len(layout.rows) for layout in self.layouts]
        #: Store of each unit, and its number among that store's units.
        self.store = np.repeat(np.arange(len(per), dtype=np.int64), per)
        self.local = np.concatenate([np.arange(n, dtype=np.int64) for n in per])
        #: ``(n_units, 2)`` the item ranges the units start, global numbers.
        starts = self.item_offsets[:-1]
        self.bounds = np.concatenate(
            [layout.bounds + off for layout, off in zip(self.layouts, starts, strict=True)]
        ).reshape(-1, 2)
        spans = [
            int(np.diff(layout.rows, axis=1).max()) for layout in self.layouts if len(layout.rows)
        ]
        #: The most rows a unit of any store has (a slot of the slab holds one).
        self.span = max([self.unit_rows, *spans])
        #: True when every unit is read by the engine (False: some through zarr-python).
        self.fast = all(layout.fast for layout in self.layouts)

    def rows(self, unit: int) -> tuple[int, int, int]:
        """``(store, first row, end row)`` of global unit ``unit``."""
        g = int(self.store[unit])
        lo, hi = self.layouts[g].rows[int(self.local[unit])]
        return g, int(lo), int(hi)

    def first_item(self, unit: int) -> int:
        """The store's own number of the first item unit ``unit`` starts."""
        g = int(self.store[unit])
        return int(self.layouts[g].bounds[int(self.local[unit]), 0])


def kept_units_bytes(units: Units, frame_stack: int = 1, length: int = 1) -> int:
    """Bytes of frames every unit of ``units`` takes decoded, each with the frames just
    outside it: what a stream that keeps its units holds (:class:`Slots`; with
    ``keep_units=True``, at most the decoded-frame budget). Each unit counts its own
    rows: a slot's pages past them are never touched, so a short unit (a small store's
    only one) holds its frames, not a whole shard's.

    Examples
    --------
    >>> from atari_zarr import AtariZarrDataset
    >>> ds = AtariZarrDataset(store_url)
    >>> kept_units_bytes(ds.stream(8).units) == (len(ds) + 1) * 84 * 84  # one unit
    True
    """
    frame_bytes = int(np.prod(FRAME_SHAPE))
    rows = sum(int(np.diff(layout.rows, axis=1).sum()) for layout in units.layouts)
    halo = slot_frames(0, frame_stack, length)  # the frames just outside each unit
    return (rows + len(units.bounds) * halo) * frame_bytes


class Slots:
    """The slab a unit reader decodes units into, a slot per unit, and what each holds.

    A slot holds a unit's frames with the frames just outside it, its per-step
    columns, its first row, first item and store, and the frames after episodes' ends
    that its rows end (``finals``). By default a reader reuses a window of slots as the
    epoch passes its units. A stream that keeps its units (``stream(keep_units=True)``,
    when their frames fit the decoded-frame budget, :func:`kept_units_bytes`) gives
    unit ``u`` slot ``u`` and keeps them from one epoch to the next: a unit whose slot
    is ``loaded`` is not decoded again, and the epochs after the first only gather
    batches (``docs/streaming.md``). The slab's pages are made resident at once
    (:func:`~atari_zarr.read.pool.resident`): page by page, a first epoch spent most
    of its time in their faults.

    Examples
    --------
    >>> slots = Slots(3, 5, 4, {"reward": np.float32})
    >>> slots.shape, slots.grown().shape, slots.loaded.tolist()
    ((3, 5, ('reward',)), (4, 5, ('reward',)), [False, False, False])
    """

    def __init__(self, n: int, ext: int, cols: int, fields: dict[str, Any]) -> None:
        self._made = (ext, cols, fields)
        #: Per-step values per slot.
        self.cols = cols
        self.slab = resident((n, ext, *FRAME_SHAPE))
        self.col = {name: np.empty((n, cols), dtype=dtype) for name, dtype in fields.items()}
        #: Each slot's first row, first item and store.
        self.lo, self.items, self.store = (np.empty(n, dtype=np.int64) for _ in range(3))
        #: Kept frames after episodes' ends, by slot.
        self.finals: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        #: Whether each slot holds its whole unit (kept units only).
        self.loaded = np.zeros(n, dtype=bool)

    @property
    def shape(self) -> tuple[int, int, tuple[str, ...]]:
        """Slots, frames per slot, and the columns: what a reader checks before reuse."""
        return (len(self.loaded), self.slab.shape[1], tuple(self.col))

    def grown(self) -> Slots:
        """One more slot, with what these hold."""
        n = len(self.loaded)
        more = Slots(n + 1, *self._made)
        for name in ("slab", "lo", "items", "store", "loaded"):
            getattr(more, name)[:n] = getattr(self, name)
        for name, col in self.col.items():
            more.col[name][:n] = col
        more.finals = self.finals
        return more


class StreamMemory:
    """Memory a stream's unit readers reuse from one epoch to the next.

    Every epoch has a reader of its own, and a reader's first writes to fresh memory
    cost a page fault per 4 KB page. The slab of decoded units (about 260 MB by
    default) and the batches' blocks used to be taken anew each epoch: on a store of
    60,000 transitions, whose epoch takes a fraction of a second, that was a large
    part of every epoch (``docs/benchmarks/stream.md``).

    A reader takes the :class:`Slots` when it starts and gives them back when it
    closes, if no decode may still be writing into them. A second reader at the same
    time gets none and allocates its own. The batches'
    :class:`~atari_zarr.read.pool.BufferPool` is shared, since it never hands out a
    block that a batch still refers to. Pickled (a DataLoader worker's copy of the
    stream), it starts empty.

    Examples
    --------
    >>> memory = StreamMemory()
    >>> memory.give(Slots(2, 3, 1, {}), keep=False)
    >>> memory.take((2, 4, ()), keep=False) is None  # another shape: not reused
    True
    >>> memory.give(Slots(2, 3, 1, {}), keep=False)
    >>> memory.take((2, 3, ()), keep=True) is None  # kept units are another kind
    True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: tuple[bool, Slots] | None = None
        #: The blocks batches are gathered into.
        self.pool = BufferPool()
        after_fork(self._renew_lock)

    def _renew_lock(self) -> None:
        """In a forked child: a lock another thread of the parent held stays held."""
        self._lock = threading.Lock()

    def take(self, shape: tuple[Any, ...], *, keep: bool) -> Slots | None:
        """The slots held if they have ``shape`` and were kept units or not as ``keep``
        says (then no longer held), else None."""
        with self._lock:
            held, self._held = self._held, None
        if held is None or held[0] != keep or held[1].shape != tuple(shape):
            return None
        return held[1]

    def give(self, slots: Slots, *, keep: bool) -> None:
        """Hold ``slots`` for the next reader (replacing any held)."""
        with self._lock:
            self._held = (keep, slots)

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


#: The item field holding each TED entry of single transitions (:func:`step_values`).
_TED = {key: "ted " + (key if isinstance(key, str) else "/".join(key)) for key in STEP_ENTRIES}


class _Segment:
    """A segment's items in the order they leave, with what their batches need
    (:meth:`UnitReader._segment_items`), and how many were taken."""

    def __init__(self, number: int, items: dict[str, np.ndarray], head: int) -> None:
        self.number = number
        self.items = items
        self.size = len(items["slot"])
        self.head = head

    @property
    def left(self) -> int:
        return self.size - self.head

    def take(self, n: int) -> dict[str, np.ndarray]:
        """The next ``n`` items (views)."""
        a, self.head = self.head, self.head + n
        return {name: values[a : self.head] for name, values in self.items.items()}


class _Gathering(NamedTuple):
    """A batch planned, its frames on their way (:meth:`UnitReader._finish`)."""

    #: None: single transitions (:meth:`UnitReader._plan_transitions`).
    plan: FramePlan | None
    buffer: FrameBuffer
    frames: PendingGather
    steps: dict[str, np.ndarray]
    finals: tuple[np.ndarray, np.ndarray] | None
    stores: np.ndarray
    #: The first segment its items come from (its units stay until it is done).
    oldest: int


class UnitReader:
    """One consumer's items, of one store or several, taken ``n`` at a time as TED batches.

    Parameters
    ----------
    members : list of Member
        The stores and what an item of each is.
    units : Units
        Their read units, which ``plan`` deals.
    plan : EpochPlan
        This consumer's part of the epoch.
    stack : int
        Frames per observation.
    start, stop : int
        The items of the plan to emit (its position, and where it stops).
    units_ahead : int
        Units fetched and decoded ahead of the one being read.
    decoders : int
        Decoding threads allowed at once.
    tag : callable, optional
        ``tag(batch, stores)``: the batch as the mixture gives it, ``stores`` the store
        of each item (default: as the store gives it).
    memory : StreamMemory, optional
        The slab and batch memory to reuse, the stream's (default: this reader's own).
    keep : bool
        Keep every unit decoded, slot ``u`` unit ``u`` (:class:`Slots`, taken from
        ``memory``), and decode only those not decoded yet (default: a window of
        slots, every unit decoded when the plan reaches it).
    """

    def __init__(
        self,
        members: list[Member],
        units: Units,
        plan: EpochPlan,
        *,
        stack: int,
        start: int,
        stop: int,
        units_ahead: int,
        decoders: int,
        tag: Any = None,
        memory: StreamMemory | None = None,
        keep: bool = False,
    ) -> None:
        self.stores = [m.store for m in members]
        self.items = [m.items for m in members]
        self.units, self.plan = units, plan
        self.memory = memory
        self.tag = tag
        self.k = stack
        self.length = self.items[0].length
        self.n_rows = np.array([len(s) for s in self.stores], dtype=np.int64)
        self.remaining = max(0, stop - start)
        self.units_ahead = units_ahead
        self._decoding = max(1, int(decoders))
        #: Held while a unit decodes (requests fly without it).
        self.decoders = threading.BoundedSemaphore(self._decoding)
        #: The thread that gathers batches' frames (started with the first batch).
        self.gatherer: Gatherer | None = None
        #: Whether the loop that gathers batches waits for a unit (then nothing runs
        #: beside the decoding, and the faster decoder, which holds the GIL, decodes).
        self.waiting = False
        m = len(plan.units)
        #: Frames held per unit: the stacks before it, the unit, the items' rows after it.
        self.ext = slot_frames(units.span, self.k, self.length)
        self.windowed = not self.items[0].identity
        #: Single transitions of one frame each (the default): their batches are built
        #: from values the segment computed (:meth:`_segment_items`), not planned one by one.
        self.lean = not self.windowed and self.length == 1 and self.k == 1
        #: Memory of the batches handed out, reused once no tensor refers to it.
        self.pool = memory.pool if memory is not None else BufferPool()
        # window units mixed, one more whose last items wait in a partly taken batch,
        # units ahead on their way (a batch larger than a unit may need more: _grow)
        #: True: every unit decoded once, slot ``u`` unit ``u``; False: a window of slots.
        self.keep = keep
        n = len(units.bounds) if keep else min(m, plan.window + 1 + units_ahead) if m else 0
        shape = (n, self.ext, tuple(step_fields(self.windowed)))
        held = memory.take(shape, keep=keep) if memory is not None else None
        # per-step values held per unit: its rows and the items' rows after it
        cols = units.span + self.length - 1
        self.slots = held or Slots(n, self.ext, cols, step_fields(self.windowed))
        self.free = [] if keep else list(range(n))[::-1]
        self.slot_of: dict[int, int] = {}
        self.slot_by_pos = np.full(m, -1, dtype=np.int64)
        self.futures: dict[int, Future] = {}
        self.segs: dict[int, np.ndarray] = {}
        self.pool_threads: ThreadPoolExecutor | None = None
        seg, skip = plan.locate(start)
        self.next_seg = seg
        self.next_fetch = plan.needed(seg).start if seg < m else m
        #: Segments whose items are not all taken yet, in the order they leave.
        self.pending: deque[_Segment] = deque()
        #: Batches whose frames are being gathered, oldest first.
        self.gathering: list[_Gathering] = []
        self.skip = skip
        #: True once :meth:`close` was called: no batch is read after it.
        self.closed = False
        #: Held while a batch is read (between two of them the caller holds the batch):
        #: a close from another thread waits for it, so the gathering thread is never
        #: stopped, nor the slab given away, under a batch being read.
        self._reading = threading.RLock()
        #: Units whose loads a forked child redoes: their threads were the parent's.
        self.stranded: set[int] = set()
        after_fork(self._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: the parent's threads that load units are not here, so a
        unit still on its way (queued, or part written) would be waited for for ever;
        each is loaded again, whole, by the child (:meth:`_submit`). A thread of the
        parent may have held the decoding semaphore: the child takes a new one."""
        self.stranded.update(self.futures)
        self.futures = {}
        self.pool_threads = None
        self.decoders = threading.BoundedSemaphore(self._decoding)
        self.waiting = False
        self._reading = threading.RLock()  # a thread of the parent may have held it

    # -- units --------------------------------------------------------------------------
    def _grow(self) -> None:
        """One more slot: a batch spans more segments than the slots were sized for."""
        for fut in list(self.futures.values()):  # nothing may write into the old slab
            fut.result()
        log.debug("stream: growing the slab to %d units", len(self.slots.loaded) + 1)
        self.slots = self.slots.grown()
        self.free.append(len(self.slots.loaded) - 1)

    def _submit(self) -> None:
        if self.closed:  # no thread is started again once stopped
            return
        if self.stranded:  # forked: the units the parent's threads were loading, again
            for j in sorted(self.stranded):
                self.futures[j] = self._threads().submit(self._load, j, self.slot_of[j])
            self.stranded.clear()
        m = len(self.plan.units)
        horizon = min(m, self.next_seg + 1 + self.units_ahead)
        while self.next_fetch < horizon:
            j = self.next_fetch
            if self.keep:
                slot = int(self.plan.units[j])  # unit u's slot is u
                if self.slots.loaded[slot]:  # decoded by an epoch before
                    self.slot_of[j] = slot
                    self.slot_by_pos[j] = slot
                    self.segs[j] = self.plan.row_segments(j)
                    self.next_fetch += 1
                    continue
            else:
                if not self.free:
                    if self.next_fetch > self.next_seg:
                        break  # read ahead later, when a slot is free
                    self._grow()  # the unit the next segment needs must have a slot
                slot = self.free.pop()
            self.slot_of[j] = slot
            self.slot_by_pos[j] = slot
            self.futures[j] = self._threads().submit(self._load, j, slot)
            self.next_fetch += 1

    def _threads(self) -> ThreadPoolExecutor:
        """The threads that load units, started with the first."""
        if self.pool_threads is None:
            self.pool_threads = ThreadPoolExecutor(
                max(1, self.units_ahead), thread_name_prefix="atari_zarr-stream"
            )
        return self.pool_threads

    def _store(self, g: int) -> StoreReader:
        """Store ``g``, opened when a unit of it is first read (then checked against the
        shards its plan was cut along)."""
        return self.stores[g].open()

    def _read_frames(self, g: int, lo: int, hi: int, ext: np.ndarray) -> None:
        """Frames of rows ``[lo, hi)`` of store ``g`` and of the rows just outside into ``ext``."""
        k, n = self.k, int(self.n_rows[g])
        halo = np.r_[
            np.arange(max(0, lo - k + 1), lo), np.arange(hi, min(hi + self.length, n))
        ].astype(np.int64)
        out = ext[self.k - 1 : self.k - 1 + hi - lo]
        # all units' requests fly at once; decoding takes the cores but one, which is
        # left to the loop that gathers batches, and while that loop waits for a unit
        # the faster decoder (which holds the GIL) decodes
        got = self._store(g).frames.read_unit(
            lo, hi, out, halo, decoding=self.decoders, background=lambda: not self.waiting
        )
        ext[halo - lo + (self.k - 1)] = got

    def _load(self, j: int, slot: int) -> None:
        unit = int(self.plan.units[j])
        g, lo, hi = self.units.rows(unit)
        store, slots = self._store(g), self.slots
        if self.keep:
            # a fresh slot: its pages' first writes fault (costlier than decoding here);
            # numpy takes those with the GIL released, c-blosc2's decoding would hold it
            slots.slab[slot, : (self.k - 1) + hi - lo + self.length] = 0
        self._read_frames(g, lo, hi, slots.slab[slot])
        top = min(hi + self.length - 1, int(self.n_rows[g]))
        rows = np.arange(lo, top, dtype=np.int64)
        values = store.step_values(rows, self.windowed)
        for name, column in slots.col.items():
            column[slot, : len(rows)] = values[name]
        slots.lo[slot], slots.items[slot], slots.store[slot] = lo, self.units.first_item(unit), g
        done = np.flatnonzero(values["terminated"] | values["truncated"])
        slots.finals.pop(slot, None)
        if store.final_observation is not None and len(done):
            slots.finals[slot] = (done, store.final_frames(values["episode"][done]))
        self.segs[j] = self.plan.row_segments(j)
        slots.loaded[slot] = self.keep  # kept: all of its slot is written

    def _wait(self, positions: range) -> None:
        self._submit()
        for j in positions:
            fut = self.futures.pop(j, None)
            if fut is not None:
                self.waiting = not fut.done()
                try:
                    fut.result()
                finally:
                    self.waiting = False

    def _release(self) -> None:
        oldest = self.pending[0].number if self.pending else self.next_seg
        # units a batch still being gathered reads stay
        oldest = min([oldest, *(g.oldest for g in self.gathering)])
        last = len(self.plan.units) - 1
        for j in [j for j in self.slot_of if j not in self.futures and j not in self.stranded]:
            if min(j + self.plan.window - 1, last) < oldest:
                slot = self.slot_of.pop(j)
                if not self.keep:  # kept units keep their slots
                    self.free.append(slot)
                self.segs.pop(j, None)

    # -- items ----------------------------------------------------------------------------
    def _fill(self, n: int) -> int:
        have = sum(seg.left for seg in self.pending)
        while have < n and self.next_seg < len(self.plan.units):
            s = self.next_seg
            self._wait(self.plan.needed(s))
            pos, local = self.plan.segment(s, self.segs.__getitem__)
            segment = _Segment(s, self._segment_items(self.slot_by_pos[pos], local), self.skip)
            have += segment.left
            self.skip = 0
            self.pending.append(segment)
            self.next_seg += 1
            self._submit()
        return have

    def _segment_items(self, slots: np.ndarray, local: np.ndarray) -> dict[str, np.ndarray]:
        """What the batches of a segment's items need, for all of them at once (a
        segment holds thousands of items, a batch a few hundred): items ``local`` (item
        numbers within their unit) of ``slots``, whose units are decoded."""
        length = self.length
        held = self.slots
        stores = held.store[slots]
        starts, real = item_rows(self.items, stores, held.items[slots] + local)
        off = starts - held.lo[slots]  # column of each item's first row in its slot
        # per-step values: one flat index into the slots' columns
        base = slots * held.cols
        last = base + off + (length - 1 if real is None else real - 1)
        cols = {name: col.reshape(-1) for name, col in held.col.items()}
        steps_at = off[:, None] + np.arange(length, dtype=np.int64)[None, :]
        if real is not None and (real < length).any():  # padding: the item's first row
            steps_at = np.where(np.arange(length)[None, :] < real[:, None], steps_at, off[:, None])
        fi = base[:, None] + steps_at
        items = {
            "slot": slots,
            "store": stores,
            "start": starts,
            "first": cols["first"].take(base + off),
            "last_done": cols["terminated"].take(last) | cols["truncated"].take(last),
            "n_rows": self.n_rows[stores],
            # slab row of the oldest frame of each item is its first row's column: the
            # halo in front holds the k - 1 frames before the unit
            "frame": slots * self.ext + off,
            "last_col": last - base,
            **{f"step {name}": cols[name].take(fi) for name in step_fields(self.windowed)},
        }
        if real is not None:
            items["real"] = real
        elif self.lean:
            # an observation exists; its next frame unless the step ends its episode or
            # its store (FramePlan's rule for one frame and one step)
            items["exists"] = np.column_stack(
                [
                    np.ones(len(starts), dtype=bool),
                    ~items["last_done"] & (starts + 1 < items["n_rows"]),
                ]
            )
            for name in step_fields(False):
                items[f"step {name}"] = items[f"step {name}"].reshape(-1)
            # every TED entry of every item, once: a batch takes slices (_finish)
            steps = {name: items[f"step {name}"] for name in step_fields(False)}
            values = step_values({**steps, "index": starts}, (len(starts),))
            items.update({_TED[key]: value for key, value in values.items()})
        return items

    def batches(self, n: int) -> Iterator[TensorDict]:
        """This consumer's items, ``n`` at a time (fewer in the last batch).

        Each batch's frames are gathered on a thread that needs no GIL
        (:class:`~atari_zarr.storage.row_gather.Gatherer`) while this thread plans the
        next batch, and while the caller uses this one.
        """
        with self._reading:
            if self.closed:
                return
            current = self._start(n)
        while current is not None:
            with self._reading:
                if self.closed:  # closed while the caller held the batch: nothing more
                    return
                following = self._start(n)  # planned while current's frames are gathered
                batch = self._finish(current)
                self._release()
                self._submit()
            yield batch
            current = following

    def _start(self, n: int) -> _Gathering | None:
        """Plan the next batch of up to ``n`` items and start gathering its frames (None:
        this consumer is done)."""
        n = min(n, self.remaining)
        if n <= 0:
            return None
        n = min(n, self._fill(n))
        if n <= 0:
            return None
        parts, got = [], 0
        oldest = self.pending[0].number
        while got < n:
            segment = self.pending[0]
            step = min(n - got, segment.left)
            parts.append(segment.take(step))
            got += step
            if not segment.left:
                self.pending.popleft()
        self.remaining -= n
        items = (
            parts[0]
            if len(parts) == 1
            else {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        )
        gathering = self._plan_batch(items, oldest)
        self.gathering.append(gathering)
        return gathering

    def _plan_batch(self, items: dict[str, np.ndarray], oldest: int) -> _Gathering:
        """A batch of ``items`` (:meth:`_segment_items`): their steps, and their frames on
        their way (:meth:`_finish` completes the batch)."""
        if self.lean and not self.slots.finals:
            return self._plan_transitions(items, oldest)
        k, length = self.k, self.length
        slots = items["slot"]
        plan = FramePlan(
            starts=items["start"],
            length=length,
            stack=k,
            first=items["first"],
            last_done=items["last_done"],
            n_rows=items["n_rows"],
            valid=items.get("real"),
        )
        buffer = FrameBuffer(self.pool, len(slots), length, k, FRAME_SHAPE)
        # frames that do not exist are zeroed by assemble_batch, once they are in
        frames = self._gather(items, buffer)
        # views of the segment's values: no two batches share an item
        steps = {name: items[f"step {name}"].ravel() for name in step_fields(self.windowed)}
        if self.slots.finals:
            finals = self._finals_of(plan, slots, items["last_col"])
        else:
            finals = None
        return _Gathering(plan, buffer, frames, steps, finals, items["store"], oldest)

    def _plan_transitions(self, items: dict[str, np.ndarray], oldest: int) -> _Gathering:
        """:meth:`_plan_batch` of single transitions (:attr:`lean`), none of whose
        episodes kept a final frame: observations and next observations are each one
        frame, gathered into two blocks, and the per-step values are the segment's."""
        buffer = FrameBuffer(self.pool, len(items["slot"]), 1, 1, FRAME_SHAPE)
        frames = self._gather(items, buffer)
        # the batch's slices of its segment's TED entries (step_values), and which frames
        # exist, to _finish, which zeroes the others
        steps = {name: items[name] for name in _TED.values()}
        steps["exists"] = items["exists"]
        return _Gathering(None, buffer, frames, steps, None, items["store"], oldest)

    def _gather(self, items: dict[str, np.ndarray], buffer: FrameBuffer) -> PendingGather:
        """Start gathering every distinct frame of ``items`` (frame ``t`` of an item is
        slab row ``frame + t``) into ``buffer``'s reused memory, on the gathering thread."""
        at = items["frame"][:, None] + np.arange(buffer.width, dtype=np.int64)[None, :]
        if self.gatherer is None:
            self.gatherer = gatherer()
        flat = self.slots.slab.reshape(-1, *FRAME_SHAPE)
        return self.gatherer.submit(flat, buffer.flat(at), buffer.frames)

    def _finish(self, gathering: _Gathering) -> TensorDict:
        """The batch of ``gathering`` once its frames are in."""
        gathering.frames.wait()
        self.gathering.remove(gathering)
        stores = gathering.stores
        if gathering.plan is None:  # single transitions (_plan_transitions)
            steps, buffer = gathering.steps, gathering.buffer
            buffer.zero_missing(steps.pop("exists"))
            obs, nxt = buffer.views(False)
            batch = ted_tensordict(obs, nxt, {key: steps[name] for key, name in _TED.items()})
        else:
            batch = assemble_batch(
                gathering.plan,
                gathering.buffer,
                gathering.steps,
                window=self.windowed,
                steps_before=self._steps_before(stores) if self.windowed else None,
                finals=gathering.finals,
            )
        return batch if self.tag is None else self.tag(batch, stores)

    def _steps_before(self, stores: np.ndarray) -> Any:
        """``steps_before`` of the stores of a batch's items (:func:`assemble_batch`)."""
        return steps_before_by_store(
            {g: self._store(g).steps_before for g in np.unique(stores).tolist()}, stores
        )

    def _finals_of(
        self, plan: FramePlan, slots: np.ndarray, last: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Kept frames after episodes' ends that items of this batch end on."""
        items, frames = [], []
        for i in np.flatnonzero(plan.last_done).tolist():
            kept = self.slots.finals.get(int(slots[i]))
            if kept is None:
                continue
            at, finals = kept
            items.append(i)
            frames.append(finals[int(np.searchsorted(at, last[i]))])
        if not items:
            return None
        return np.asarray(items, dtype=np.int64), np.stack(frames)

    def close(self) -> None:
        """Stop: the batch being read on another thread read first, the batches being
        gathered finished, the gathering thread and the threads that read units stopped
        and joined (a unit being decoded is finished first; one that never ends is
        waited for :data:`STOP_GUARD` seconds, then logged), the slab given back. Again:
        nothing more."""
        self.closed = True
        if not self._reading.acquire(timeout=STOP_GUARD):
            # the thread reading a batch stops after it, and closes the reader then
            # (its stream's generator ends): nothing is stopped under it here
            log.warning(
                "stream: a batch still being read after %d s; its reader stops once it is",
                STOP_GUARD,
            )
            return
        try:
            self._stop()
        finally:
            self._reading.release()

    def _stop(self) -> None:
        """:meth:`close`, no batch being read."""
        for gathering in list(self.gathering):  # nothing may read the slab once it is given
            gathering.frames.wait()
        self.gathering.clear()
        rows, self.gatherer = self.gatherer, None
        if rows is not None:
            rows.close()  # its thread finishes what is queued, then is joined
        pool, self.pool_threads = self.pool_threads, None
        if pool is not None:
            threads = list(getattr(pool, "_threads", ()))
            pool.shutdown(wait=False, cancel_futures=True)
            end = time.monotonic() + STOP_GUARD
            for thread in threads:
                if thread is not threading.current_thread():  # (closed by its own work)
                    thread.join(max(0.0, end - time.monotonic()))
            stuck = [
                t.name for t in threads if t.is_alive() and t is not threading.current_thread()
            ]
            if stuck:
                log.warning(
                    "stream: %s still reading after %d s; left to end on their own deadline",
                    ", ".join(stuck),
                    STOP_GUARD,
                )
        # the next epoch's reader takes the slab, unless a decode may still write into it
        if self.memory is not None and all(f.done() for f in self.futures.values()):
            self.memory.give(self.slots, keep=self.keep)
        self.futures.clear()
