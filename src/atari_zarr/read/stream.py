"""An epoch stream over one store or several: whole units read in shuffled order, batches out.

:class:`EpochStream` yields every item of its stores once per epoch, across all
ranks and DataLoader workers together. The order of read units, their split among
consumers (:class:`~atari_zarr.read.consumer.Consumer`) and the order in which
items leave are arithmetic (:mod:`atari_zarr.read.epoch`); each consumer reads its
units of each store with a :class:`~atari_zarr.read.units.UnitReader`. Several
stores: each batch takes from every store a multinomial share by weight, among
the stores with items left. ``docs/streaming.md`` has the design and the figures.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.batch import collate_batch
from atari_zarr.read.consumer import Consumer, check_rank, quiet_worker_exit
from atari_zarr.read.epoch import Consumed, EpochPlan
from atari_zarr.read.items import Items
from atari_zarr.read.mixture import store_probabilities, tag_store
from atari_zarr.read.store import StoreReader
from atari_zarr.read.units import (
    DEFAULT_SHUFFLE_BUFFER,
    DEFAULT_UNITS_AHEAD,
    UnitLayout,
    UnitReader,
    stream_memory_bound,
)
from atari_zarr.resources import cpu_count

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "DEFAULT_UNITS_AHEAD",
    "AtariZarrStream",
    "EpochStream",
    "StreamLoader",
    "stream_memory_bound",
]

# 3: the items emitted, whatever the consumers (elastic resume); 2: consumers read
# contiguous parts of the epoch's items; 1: units dealt round-robin
_STATE_VERSION = 3


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
    and epoch, and which items they are whatever the consumers; a stream given that
    state by :meth:`load_state_dict` yields exactly the items not yet emitted, on any
    number of ranks and DataLoader workers. Iterating the stream itself counts what it yields;
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
        where: str | None = None,
    ) -> None:
        self.stores = list(stores)
        self.items = list(items)
        #: True: batches carry ``game_id``, ``row`` and a global ``index``.
        self.several = len(self.stores) > 1 if several is None else bool(several)
        where = where or (
            f"MultiGameDataset of {len(self.stores)} stores" if self.several else stores[0].where
        )
        self.where = where
        self.frame_stack = whole_number(frame_stack, "frame_stack", where)
        self.batch_size = whole_number(batch_size, "batch_size", where)
        self.seed = whole_number(seed, "seed", where, low=0)
        self.epoch = whole_number(epoch, "epoch", where, low=0)
        self.shuffle = bool(shuffle)
        self.shuffle_buffer = whole_number(shuffle_buffer, "shuffle_buffer", where, low=0)
        self.units_ahead = whole_number(units_ahead, "units_ahead", where)
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = check_rank(rank, world_size, where)
        self._unit_rows_asked = unit_rows
        self._layouts = [
            UnitLayout(s, i, unit_rows) for s, i in zip(self.stores, self.items, strict=True)
        ]
        self.unit_rows = self._layouts[0].unit_rows
        self.window = max(1, self.shuffle_buffer // self.unit_rows)
        lengths = np.array([len(i) for i in self.items], dtype=np.int64)
        #: Global index of each store's first row (``MultiGameDataset``'s offsets).
        self.offsets = np.concatenate([[0], np.cumsum([len(s) for s in self.stores])]).astype(
            np.int64
        )
        self._item_count = int(lengths.sum())
        #: Probability of drawing each store (one store: 1).
        self.weights = store_probabilities(lengths, weights) if self.several else np.ones(1)
        #: Items emitted per store and consumer in the current epoch.
        self.store_positions: list[dict[int, int]] = [{} for _ in self.stores]
        #: Batches emitted per consumer in the current epoch (several stores).
        self.batches: dict[int, int] = {}
        self._consumers: int | None = None
        #: Items emitted before the current consumers took over (None: none), per store.
        self._base: list[Consumed | None] = [None] * len(self.stores)
        #: The items a loaded state had emitted, until the consumers are known.
        self._loaded: list[Consumed] | None = None

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
            UnitLayout(s, i, self._unit_rows_asked) for s, i in zip(stores, self.items, strict=True)
        ]

    # -- the plan ---------------------------------------------------------------------
    def _plan(self, g: int, consumer: int, consumers: int, pad: int = 0) -> EpochPlan:
        return EpochPlan(
            self._layouts[g].bounds,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            window=self.window,
            consumer=consumer,
            consumers=consumers,
            pad=pad,
            left=self._base[g],
        )

    def _consumer_items(self, g: int, consumers: int) -> np.ndarray:
        """Items each of ``consumers`` consumers reads from store ``g`` (padding not counted)."""
        return np.diff(self._plan(g, 0, consumers).cuts)

    def balance(self, consumers: int) -> tuple[np.ndarray, np.ndarray]:
        """Per consumer: the items it yields in the epoch, and the padding among them.

        Every consumer yields the same number of batches. By default each is padded to
        the largest count (at most one item per store more than its own), repeating its
        first items, as ``DistributedSampler`` does; with ``drop_last`` each yields the
        largest number of whole batches all of them can fill, so fewer than
        ``consumers * batch_size`` items are left out. An epoch too small for that is
        one line.

        Returns
        -------
        (items, pads) : numpy.ndarray, numpy.ndarray
            ``(consumers,)`` each; ``pads`` is 0 with ``drop_last``.
        """
        own = np.sum([self._consumer_items(g, consumers) for g in range(len(self.stores))], 0)
        own = np.asarray(own, dtype=np.int64).reshape(consumers)
        what = "windows" if not self.items[0].identity else "transitions"
        if own.min() == 0:
            raise InvalidArgumentError(
                f"an epoch of {self.where} has {self._item_count} {what}, fewer than its "
                f"{consumers} consumers (world_size x num_workers); use fewer ranks or "
                f"DataLoader workers, or a larger store"
            )
        if self.drop_last:
            whole = int(own.min()) // self.batch_size * self.batch_size
            if whole == 0:
                raise InvalidArgumentError(
                    f"drop_last=True leaves no batch of {self.batch_size} in an epoch of "
                    f"{self.where}: each of its {consumers} consumers (world_size x num_workers) "
                    f"has {int(own.min())} {what} or more; pass a smaller batch_size, use fewer "
                    f"consumers, or drop_last=False (then the last batches are padded)"
                )
            return np.full(consumers, whole, dtype=np.int64), np.zeros(consumers, np.int64)
        top = int(own.max())
        return np.full(consumers, top, dtype=np.int64), top - own

    def _pads(self, consumer: int, consumers: int, extra: int) -> list[int]:
        """This consumer's ``extra`` padding per store: all on the first store it reads from."""
        pads = [0] * len(self.stores)
        if extra:
            for g in range(len(self.stores)):
                if self._consumer_items(g, consumers)[consumer] > 0:
                    pads[g] = extra
                    break
        return pads

    def _check_consumers(self, consumers: int) -> None:
        """Read by ``consumers`` consumers from now on. Other consumers than the ones the
        progress was made by take over what is left of the epoch (elastic)."""
        if self._consumers is not None and self._consumers != consumers:
            started = any(p for p in self.store_positions)
            if self._loaded is not None or started:
                left = self._loaded or self._progress()[1]
                self._base = list(left)
                self.store_positions = [{} for _ in self.stores]
                self.batches = {}
        self._loaded = None
        self._consumers = consumers

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[TensorDict]:
        quiet_worker_exit()
        me = Consumer.current(self.rank, self.world_size)
        self._check_consumers(me.count)
        yield from self._consume(me.index, me.count)

    def _readers(self, consumer: int, consumers: int, total: int, extra: int) -> list[UnitReader]:
        """This consumer's reader of each store: ``total`` items, ``extra`` of them padding."""
        decoders = threading.BoundedSemaphore(max(1, cpu_count() - 1))
        readers = []
        pads = self._pads(consumer, consumers, extra)
        for g, (store, items) in enumerate(zip(self.stores, self.items, strict=True)):
            plan = self._plan(g, consumer, consumers, pads[g])
            start = self.store_positions[g].get(consumer, 0)
            stop = plan.rows
            if self.drop_last and not self.several:
                stop = total
            readers.append(
                UnitReader(
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
        # an epoch too small for its consumers is one line, before anything is read
        items, pads = self.balance(consumers)
        readers = self._readers(consumer, consumers, int(items[consumer]), int(pads[consumer]))
        try:
            remaining = np.array([r.remaining for r in readers], dtype=np.int64)
            limit = None
            if self.drop_last and self.several:
                limit = int(items[consumer]) // self.batch_size
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
                        td = tag_store(td, g, int(self.offsets[g]))
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
        self.epoch = whole_number(epoch, "epoch", self.where, low=0)
        self.store_positions = [{} for _ in self.stores]
        self.batches = {}
        self._base = [None] * len(self.stores)
        self._loaded = None

    # -- progress ---------------------------------------------------------------------
    def _consumer_of(self, g: int, row: int, consumers: int) -> int:
        item = int(self.items[g].count_before(np.array([row]))[0])
        return self._plan(g, 0, consumers).consumer_of(item)

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

    # -- the state: progress, and what it means whatever the consumers ------------------
    def _own(self, consumers: int) -> tuple[range, int]:
        """This rank's consumers, and the workers of each rank."""
        me = Consumer.current(self.rank, self.world_size)
        workers = max(1, consumers // me.world_size)
        return range(me.rank * workers, (me.rank + 1) * workers), workers

    def _replay(self, consumer: int, consumers: int, batches: int, pads: np.ndarray) -> np.ndarray:
        """Items of each store consumer ``consumer`` emitted in its first ``batches``."""
        extra = self._pads(consumer, consumers, int(pads[consumer]))
        left = np.array(
            [self._plan(g, consumer, consumers, extra[g]).rows for g in range(len(self.stores))],
            dtype=np.int64,
        )
        done = np.zeros(len(self.stores), dtype=np.int64)
        for t in range(batches):
            done += self._counts(left - done, t, consumer, consumers)
        return done

    def _all_batches(self, consumers: int) -> dict[int, int]:
        """Batches of every consumer: this rank's as counted, the others' by lockstep (DDP
        ranks step together, and a rank's DataLoader hands out its workers' batches in
        turn, so worker ``w`` of every rank has emitted as many as this rank's)."""
        own, workers = self._own(consumers)
        return {
            c: self.batches.get(c if c in own else own.start + c % workers, 0)
            for c in range(consumers)
        }

    def _progress(self) -> tuple[list[dict[int, int]], list[Consumed]]:
        """Per store: the items every consumer emitted (the others' by lockstep, with
        several stores replayed from their batches), and every item emitted in this
        epoch, whoever emitted it."""
        stores = range(len(self.stores))
        consumed = [
            base.copy() if base is not None else Consumed(self._layouts[g].bounds)
            for g, base in enumerate(self._base)
        ]
        consumers = self._consumers
        if consumers is None:
            return [{} for _ in stores], consumed
        own, workers = self._own(consumers)
        positions: list[dict[int, int]] = [{} for _ in stores]
        pads = None
        for c in range(consumers):
            mate = c if c in own else own.start + c % workers
            if c in own or not self.several:
                for g in stores:
                    positions[g][c] = self.store_positions[g].get(mate, 0)
                continue
            if pads is None:
                pads = self.balance(consumers)[1]
            done = self._replay(c, consumers, self.batches.get(mate, 0), pads)
            for g in stores:
                positions[g][c] = int(done[g])
        if any(p for by_consumer in positions for p in by_consumer.values()):
            pads = self.balance(consumers)[1] if pads is None else pads
            for c in range(consumers):
                extra = self._pads(c, consumers, int(pads[c]))
                for g in stores:
                    if positions[g][c] > 0:
                        plan = self._plan(g, c, consumers, extra[g])
                        for unit, items in plan.consumed(positions[g][c]).items():
                            consumed[g].add(unit, items)
        return positions, consumed

    def _store_state(self, g: int, positions: dict[int, int], consumed: Consumed) -> dict[str, Any]:
        base = self._base[g]
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
            "positions": {int(c): int(p) for c, p in positions.items() if p},
            "base": None if base is None else base.encode(),
            "consumed": consumed.encode(),
        }

    def state_dict(self) -> dict[str, Any]:
        """What resumes this epoch, on any number of ranks and DataLoader workers.

        ``consumed`` says which items were emitted (whole read units, and the items of
        the units consumers were in the middle of): it does not depend on the
        consumers, so a stream loaded with it on other ranks or another ``num_workers``
        deals exactly the rest of the epoch among its consumers, each item once.
        ``consumers`` and ``positions`` (items emitted per consumer, ``rank *
        num_workers + worker``) let a resume with the same consumers continue in the
        very order of the uninterrupted epoch. With several stores, ``stores`` holds
        that state for each store and ``batches`` the batches emitted per consumer.

        In a distributed job, every rank's state describes the whole job: ranks step
        together, so the consumers of other ranks have emitted as many batches as this
        rank's (rank 0's checkpoint is enough).
        """
        positions, consumed = self._progress()
        if self._loaded is not None:  # loaded, not read since: what the state said
            consumed = self._loaded
        states = [self._store_state(g, positions[g], consumed[g]) for g in range(len(consumed))]
        if not self.several:
            return states[0]
        consumers = self._consumers
        batches = self._all_batches(consumers) if consumers else {}
        return {
            "version": _STATE_VERSION,
            "batches": {int(c): int(n) for c, n in batches.items() if n},
            "stores": states,
        }

    def _load_store_state(self, g: int, state: dict[str, Any]) -> Consumed:
        _check_state(state, self.where)
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
        sizes = np.diff(self._layouts[g].bounds, axis=1).reshape(-1)
        where = f"the state of a stream of {self.where} (pass the state as state_dict() gave it)"
        epoch = whole_number(state.get("epoch"), "epoch", where, low=0)
        seed = whole_number(state.get("seed"), "seed", where, low=0)
        saved = state.get("positions")
        if not isinstance(saved, dict):
            raise InvalidArgumentError(
                f"positions must be a dict of items emitted by consumer; got {saved!r} for {where}"
            )
        positions: dict[int, int] = {}
        for c, p in saved.items():
            consumer = _consumer_key(c, "a consumer of positions", where)
            positions[consumer] = whole_number(p, f"positions[{c!r}]", where, low=0)
            if positions[consumer] > int(sizes.sum()):
                raise InvalidArgumentError(
                    f"positions[{c!r}] is {p!r} items, more than the {int(sizes.sum())} of an "
                    f"epoch, for {where}"
                )
        try:
            base = None if state.get("base") is None else Consumed.decode(state["base"], sizes)
            consumed = Consumed.decode(state["consumed"], sizes)
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidArgumentError(
                f"this state of a stream of {self.where} does not say which items were "
                f"emitted ({exc}); expected what state_dict() gave. Pass the state as saved"
            ) from None
        self.seed, self.epoch = seed, epoch
        self._consumers = state.get("consumers")
        self.store_positions[g] = positions
        self._base[g] = base
        return consumed

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next iteration yields what was not yet seen,
        whatever the number of ranks and DataLoader workers."""
        _check_state(state, self.where)
        if not self.several:
            self._loaded = [self._load_store_state(0, state)]
            self.batches = {}
            return
        stores = state.get("stores")
        batches = state.get("batches")
        if (
            state.get("version") != _STATE_VERSION
            or not isinstance(stores, list)
            or len(stores) != len(self.stores)
            or not isinstance(batches, dict)
        ):
            stores = stores if isinstance(stores, list) else []
            raise InvalidArgumentError(
                f"this state does not belong to this stream of {len(self.stores)} stores "
                f"(found {len(stores)} stores, version {state.get('version')}); "
                f"open the stream with the stores and options it was saved with"
            )
        self._loaded = [self._load_store_state(g, sub) for g, sub in enumerate(stores)]
        where = f"the state of a stream of {self.where} (pass the state as state_dict() gave it)"
        self.batches = {
            _consumer_key(c, "a consumer of batches", where): whole_number(
                n, f"batches[{c!r}]", where, low=0
            )
            for c, n in batches.items()
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.where!r}, batch_size={self.batch_size}, "
            f"seed={self.seed}, epoch={self.epoch}, shuffle_buffer={self.shuffle_buffer}, "
            f"items={self._item_count})"
        )


def _consumer_key(key: Any, name: str, where: str) -> int:
    """A consumer's number as a state's key: an int, or its digits (a state saved as JSON,
    whose keys are strings)."""
    if isinstance(key, str) and key.isdigit():
        return int(key)
    return whole_number(key, name, where, low=0)


def _check_state(state: Any, where: str) -> None:
    """Refuse what is not a state at all (None, a list) in one line."""
    if not isinstance(state, dict):
        raise InvalidArgumentError(
            f"a stream's state must be the dict its state_dict() gave; got "
            f"{type(state).__name__} {state!r:.60} for {where}. Pass the state as saved"
        )


#: The stream of one store (:meth:`AtariZarrDataset.stream`).
AtariZarrStream = EpochStream


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
        stream = self.stream
        consumers = Consumer.current(stream.rank, stream.world_size, workers=workers).count
        # the workers start from what is left for this many consumers (pickled after this)
        stream._check_consumers(consumers)
        # an epoch too small for its consumers is one line here, not a worker's traceback
        stream.balance(consumers)
        for batch in loader:
            if workers:
                self.stream.record(batch, workers)
            yield batch
