"""An epoch stream over one store or several: whole units read in shuffled order, batches out.

:class:`EpochStream` yields every item of its stores once per epoch, across all
ranks and DataLoader workers together. One store is a mixture of one: the read
units of every store form one list (:class:`~atari_zarr.read.units.Units`), whose
order, split among consumers (:func:`~atari_zarr.place.current_place`) and
order of leaving are arithmetic (:mod:`atari_zarr.read.epoch`); each consumer
reads its units with one :class:`~atari_zarr.read.units.UnitReader`, whose shuffle
buffer mixes the units of whichever stores they come from. With weights, each
consumer's next unit comes from a store drawn by weight
(:func:`~atari_zarr.read.epoch.interleave`). ``docs/streaming.md`` has the design
and the figures.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.arguments import whole_number
from atari_zarr.errors import DatasetClosedError, InvalidArgumentError
from atari_zarr.place import check_rank, current_place, quiet_worker_exit
from atari_zarr.read.batch import collate_batch
from atari_zarr.read.epoch import Consumed, EpochPlan
from atari_zarr.read.member import Member
from atari_zarr.read.mixture import tag_items
from atari_zarr.read.units import (
    DEFAULT_SHUFFLE_BUFFER,
    DEFAULT_UNITS_AHEAD,
    StreamMemory,
    UnitReader,
    Units,
    kept_units_bytes,
    stream_memory_bound,
)
from atari_zarr.resources import cpu_count

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "DEFAULT_UNITS_AHEAD",
    "AtariZarrStream",
    "EpochStream",
    "StreamIterator",
    "StreamLoader",
    "stream_memory_bound",
]

# 4: each member's identity recorded; 3: the items emitted, whatever the consumers
# (elastic resume; such a state loads where its stores' names and lengths match);
# 2: consumers read contiguous parts of the epoch's items; 1: units dealt round-robin.
_STATE_VERSION = 4


class EpochStream(torch.utils.data.IterableDataset):
    """One epoch of one store or several as TED batches, each item once: an ``IterableDataset``.

    Made by :meth:`AtariZarrDataset.stream <atari_zarr.AtariZarrDataset.stream>`,
    :meth:`MultiGameDataset.stream <atari_zarr.MultiGameDataset.stream>` and the
    windows' ``stream`` (see there for the parameters). Iterating it yields this
    process's part of the epoch: with ``torch.distributed`` initialised (or
    ``rank``/``world_size`` given), this rank's; in a DataLoader worker, this
    worker's part of it. Together the parts are every item, each once.

    Progress is one number per consumer (``rank * num_workers + worker``): the items
    it has emitted. :meth:`state_dict` holds them with the seed and epoch, and which
    items they are whatever the consumers; a stream given that state by
    :meth:`load_state_dict` yields exactly the items not yet emitted, on any number
    of ranks and DataLoader workers. Iterating the stream itself counts what it
    yields; through a DataLoader with workers, use :meth:`loader` (which counts the
    batches it hands out) or call :meth:`record` on every batch.

    Parameters
    ----------
    members : sequence of Member
        The stores, in order (one, or a mixture), each with its items, weight and
        ``game_id`` (tagged items carry ``game_id``, ``row`` and a global ``index``);
        one not opened yet is opened when a unit of it is first read.
    batch_size : int
        Items per batch.
    weighted : bool
        The members' weights order each consumer's units (default: the permutation's
        order, stores drawn in proportion to their items).
    **options
        As :meth:`~atari_zarr.read.core.ItemDataset.stream` documents.

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
        members: Sequence[Member],
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
        keep_units: bool = False,
        weighted: bool = False,
        where: str | None = None,
    ) -> None:
        #: The stores, each with its items, weight and game_id.
        self.members = list(members)
        self.stores = [m.store for m in self.members]
        self.items = [m.items for m in self.members]
        self.where = where = where or self.stores[0].where
        self.frame_stack = int(frame_stack)  # checked by the dataset that made the stream
        self.batch_size = whole_number(batch_size, "batch_size", where)
        self.seed = whole_number(seed, "seed", where, low=0)
        self.epoch = whole_number(epoch, "epoch", where, low=0)
        self.shuffle = bool(shuffle)
        self.shuffle_buffer = whole_number(shuffle_buffer, "shuffle_buffer", where, low=0)
        self.units_ahead = whole_number(units_ahead, "units_ahead", where)
        self.drop_last = bool(drop_last)
        if not isinstance(keep_units, bool):
            raise InvalidArgumentError(
                f"{where}: keep_units must be True or False; got {keep_units!r}. "
                "Pass True to keep every unit decoded up to the decoded-frame budget"
            )
        #: Keep every unit decoded from one epoch to the next (within the budget).
        self.keep_units = keep_units
        self.rank, self.world_size = check_rank(rank, world_size, where)
        self.units = Units(self.members, unit_rows)
        self.unit_rows = self.units.unit_rows
        self.window = max(1, self.shuffle_buffer // self.unit_rows)
        #: Global index of each store's first row (``MultiGameDataset``'s offsets).
        self.offsets = np.cumsum([0, *(len(s) for s in self.stores)], dtype=np.int64)
        self._item_count = sum(len(i) for i in self.items)
        #: Weight of each store, as the plan orders units by it (None: by the permutation).
        self.weights = np.array([m.weight for m in self.members]) if weighted else None
        #: Items emitted per consumer in the current epoch.
        self.positions: dict[int, int] = {}
        self._consumers: int | None = None
        #: Items emitted before the current consumers took over (None: none).
        self._base: Consumed | None = None
        #: The items a loaded state had emitted, until the consumers are known.
        self._loaded: Consumed | None = None
        #: The slab and batch memory each epoch's reader reuses.
        self._memory = StreamMemory()
        #: The iterators of this process not done yet (:meth:`close` stops them).
        self._iterators: weakref.WeakSet[StreamIterator] = weakref.WeakSet()

    # pickled, each store is what opens it again where unpickled (one not opened yet
    # stays so), and the units keep the cut they were planned with

    # -- the plan ---------------------------------------------------------------------
    def _plan(self, consumer: int, consumers: int, pad: int = 0) -> EpochPlan:
        return EpochPlan(
            self.units.bounds,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            window=self.window,
            consumer=consumer,
            consumers=consumers,
            pad=pad,
            left=self._base,
            stores=self.units.store,
            weights=self.weights,
        )

    def balance(self, consumers: int) -> tuple[np.ndarray, np.ndarray]:
        """Per consumer: the items it yields in the epoch, and the padding among them.

        Every consumer yields the same number of batches. By default each is padded to
        the largest count (one item more than its own at most), repeating its first
        items, as ``DistributedSampler`` does; with ``drop_last`` each yields the
        largest number of whole batches all of them can fill, so fewer than
        ``consumers * batch_size`` items are left out. An epoch too small for that is
        one line.

        Returns
        -------
        (items, pads) : numpy.ndarray, numpy.ndarray
            ``(consumers,)`` each; ``pads`` is 0 with ``drop_last``.
        """
        own = np.diff(self._plan(0, consumers).cuts).astype(np.int64)
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

    def _check_consumers(self, consumers: int) -> None:
        """Read by ``consumers`` consumers from now on. Other consumers than the ones the
        progress was made by take over what is left of the epoch (elastic)."""
        if self._consumers is not None and self._consumers != consumers:
            if self._loaded is not None or self.positions:
                self._base = self._loaded or self._progress()[1]
                self.positions = {}
        self._loaded = None
        self._consumers = consumers

    def _epoch_over(self, consumers: int, own: Iterable[int]) -> bool:
        """Whether the epoch has nothing left for the consumers ``own`` (of
        ``consumers``, after :meth:`_check_consumers`): every item emitted by the
        consumers before them (with ``drop_last``, all but less than a batch for each),
        or each of ``own`` has emitted its share. Then one warning
        says so and how to start the next: the iteration yields nothing, as a state
        saved at the end of its epoch and loaded does."""
        base = self._base
        over = base is not None and bool(base.done.all())
        if not over and base is not None and base.count and self.drop_last:
            # what earlier consumers left of a drop_last epoch: less than a batch each
            left = np.diff(self._plan(0, consumers).cuts)
            over = int(left.min()) < self.batch_size
        if not over:
            items = self.balance(consumers)[0]
            over = all(self.positions.get(c, 0) >= int(items[c]) for c in own)
        if over:
            what = "windows" if not self.items[0].identity else "transitions"
            warnings.warn(
                f"epoch {self.epoch} of {self.where} is over: its {self._item_count} {what} "
                f"were all emitted, so this iteration yields nothing. Call "
                f"stream.set_epoch({self.epoch + 1}) to start the next epoch (or "
                f"set_epoch({self.epoch}) to read this one again)",
                stacklevel=4,
            )
        return over

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> StreamIterator:
        it = StreamIterator(self.where)
        # by a weak reference: no cycle, so an iterator let go stops its reader at once
        it.start(self._iterate(weakref.ref(it)))
        self._iterators.add(it)
        return it

    def _iterate(self, it: weakref.ref[StreamIterator]) -> Iterator[TensorDict]:
        quiet_worker_exit()
        me = current_place(self.rank, self.world_size)
        self._check_consumers(me.consumers)
        if self._epoch_over(me.consumers, [me.consumer]):
            return
        yield from self._consume(me.consumer, me.consumers, self.keeps_units(me.workers), it)

    def close(self, why: str = "the stream was closed") -> None:
        """Stop every iterator of this stream that is not done: their threads stopped and
        joined, their batches' memory given back; their next ``next()`` raises
        :class:`~atari_zarr.errors.DatasetClosedError`. What a ``with`` block does at its
        end. The progress stays (:meth:`state_dict`), and iterating the stream again
        starts another pass where it stopped.

        Examples
        --------
        >>> from atari_zarr import AtariZarrDataset
        >>> ds = AtariZarrDataset(store_url)
        >>> with ds.stream(8, unit_rows=64) as stream:
        ...     it = iter(stream)
        ...     first = next(it)
        >>> next(it)
        Traceback (most recent call last):
        ...
        atari_zarr.errors.DatasetClosedError: ...
        """
        for it in list(self._iterators):
            it.close(why)

    def __enter__(self) -> EpochStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # its iterators are this process's (threads): a copy has none
        return {k: v for k, v in self.__dict__.items() if k != "_iterators"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._iterators = weakref.WeakSet()

    def keeps_units(self, workers: int = 1) -> bool:
        """Whether every unit is kept decoded from one epoch to the next
        (:class:`~atari_zarr.read.units.Slots`), with ``workers`` DataLoader workers.

        Only with ``keep_units=True``, and then only when they fit the stores'
        decoded-frame budget (``frame_cache_bytes``; a share of memory is divided
        among the workers): otherwise one line.

        Raises
        ------
        InvalidArgumentError
            ``keep_units=True`` and the units do not fit the budget.

        Examples
        --------
        >>> from atari_zarr import AtariZarrDataset
        >>> ds = AtariZarrDataset(store_url)
        >>> ds.stream(8).keeps_units(), ds.stream(8, keep_units=True).keeps_units()
        (False, True)
        """
        if not self.keep_units:
            return False
        need = kept_units_bytes(self.units, self.frame_stack, self.items[0].length)
        budget = sum(s.options.frame_cache_limit(workers) for s in self.stores)
        if need > budget:
            per = f" ({workers} DataLoader workers share it)" if workers > 1 else ""
            raise InvalidArgumentError(
                f"{self.where}: keep_units=True, but its units take {need / 2**30:.2f} GiB "
                f"decoded, more than the decoded-frame budget of {budget / 2**30:.2f} GiB"
                f"{per}. Raise ReadOptions(frame_cache_bytes=...), or stream without "
                "keep_units to read through a window of units"
            )
        return True

    def _tagger(self) -> Callable[[TensorDict, np.ndarray], TensorDict] | None:
        """What tags a batch with its items' stores (None: items untagged)."""
        if self.members[0].game_id is None:
            return None
        offsets, games = self.offsets, np.array([m.game_id for m in self.members], np.int64)
        return lambda td, stores: tag_items(td, stores, offsets, games)

    def _consume(
        self,
        consumer: int,
        consumers: int,
        keep: bool = False,
        it: weakref.ref[StreamIterator] | None = None,
    ) -> Iterator[TensorDict]:
        # an epoch too small for its consumers is one line, before anything is read
        items, pads = self.balance(consumers)
        plan = self._plan(consumer, consumers, int(pads[consumer]))
        start = self.positions.get(consumer, 0)
        reader = UnitReader(
            self.members,
            self.units,
            plan,
            stack=self.frame_stack,
            start=start,
            stop=int(items[consumer]) if self.drop_last else plan.rows,
            units_ahead=self.units_ahead,
            decoders=max(1, cpu_count() - 1),
            tag=self._tagger(),
            memory=self._memory,
            keep=keep,
        )
        owner = it() if it is not None else None
        if owner is not None:
            owner.reader = reader
            if owner.closed:  # closed on another thread before it had a reader to stop
                reader.close()
                return
        del owner
        try:
            for td in reader.batches(self.batch_size):
                if self.drop_last and len(td) < self.batch_size:
                    break
                self.positions[consumer] = self.positions.get(consumer, 0) + len(td)
                yield td
        finally:
            reader.close()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a new permutation); progress is reset, except that the
        epoch of a state just loaded (:meth:`load_state_dict`, nothing read since) keeps
        that state's progress, as a training loop that calls ``set_epoch`` every epoch
        expects after a resume."""
        epoch = whole_number(epoch, "epoch", self.where, low=0)
        if self._loaded is not None and epoch == self.epoch:
            return
        self.epoch = epoch
        self.positions = {}
        self._base = None
        self._loaded = None

    # -- progress ---------------------------------------------------------------------
    def record(self, batch: TensorDict, num_workers: int) -> None:
        """Count ``batch`` as seen: for a DataLoader with ``num_workers`` workers.

        The batch's consumer is found from its first item's ``index`` (the plan is
        arithmetic).
        """
        if not len(batch):
            return
        consumers = current_place(self.rank, self.world_size, loader_workers=num_workers).consumers
        self._check_consumers(consumers)
        index = batch["index"]
        row = int(index[0, 0] if index.ndim > 1 else index[0])  # a window: its first row
        g = int(np.searchsorted(self.offsets, row, side="right")) - 1
        local = np.array([row - int(self.offsets[g])], dtype=np.int64)
        item = int(self.units.item_offsets[g] + self.items[g].count_before(local)[0])
        c = self._plan(0, consumers).consumer_of(item)
        self.positions[c] = self.positions.get(c, 0) + len(batch)

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
        me = current_place(self.rank, self.world_size)
        workers = max(1, consumers // me.world_size)
        return range(me.rank * workers, (me.rank + 1) * workers), workers

    def _progress(self) -> tuple[dict[int, int], Consumed]:
        """The items every consumer emitted (the other ranks' by lockstep: DDP ranks
        step together, and a rank's DataLoader hands out its workers' batches in turn,
        so worker ``w`` of every rank has emitted as many as this rank's), and every
        item emitted in this epoch, whoever emitted it."""
        consumed = self._base.copy() if self._base is not None else Consumed(self.units.bounds)
        consumers = self._consumers
        if consumers is None:
            return {}, consumed
        own, workers = self._own(consumers)
        positions = {
            c: self.positions.get(c if c in own else own.start + c % workers, 0)
            for c in range(consumers)
        }
        if any(positions.values()):
            pads = self.balance(consumers)[1]
            for c, position in positions.items():
                if position > 0:
                    plan = self._plan(c, consumers, int(pads[c]))
                    for unit, items in plan.consumed(position).items():
                        consumed.add(unit, items)
        return positions, consumed

    def _identities(self) -> list[dict[str, Any]]:
        return [m.identity() for m in self.members]

    def _weights(self) -> list[float] | None:
        return None if self.weights is None else [float(w) for w in self.weights]

    def state_dict(self) -> dict[str, Any]:
        """What resumes this epoch, on any number of ranks and DataLoader workers.

        ``consumed`` says which items were emitted (whole read units, and the items of
        the units consumers were in the middle of): it does not depend on the
        consumers, so a stream loaded with it on other ranks or another ``num_workers``
        deals exactly the rest of the epoch among its consumers, each item once.
        ``consumers`` and ``positions`` (items emitted per consumer, ``rank *
        num_workers + worker``) let a resume with the same consumers continue in the
        very order of the uninterrupted epoch. ``members`` says which stores it was
        saved over (name, content id, rows, frame shards), in order, and ``weights``
        their weights: it loads only into the same.

        In a distributed job, every rank's state describes the whole job: ranks step
        together, so the consumers of other ranks have emitted as many batches as this
        rank's (rank 0's checkpoint is enough).
        """
        positions, consumed = self._progress()
        if self._loaded is not None:  # loaded, not read since: what the state said
            consumed = self._loaded
        return {
            "version": _STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "window": self.window,
            "unit_rows": self.unit_rows,
            "items": self.items[0].token,
            "transitions": int(sum(len(s) for s in self.stores)),
            "members": self._identities(),
            "weights": self._weights(),
            "consumers": self._consumers,
            "positions": {int(c): int(p) for c, p in positions.items() if p},
            "base": None if self._base is None else self._base.encode(),
            "consumed": consumed.encode(),
        }

    def _check_belongs(self, state: dict[str, Any]) -> None:
        """Refuse ``state`` unless it was saved over these members, in this order, with
        their weights, items and options, naming what differs."""
        ours, weights = self._identities(), self._weights()
        expected = {
            "transitions": sum(i["rows"] for i in ours),
            "unit_rows": self.unit_rows,
            "window": self.window,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,  # where each consumer stops depends on it
            "items": self.items[0].token,
        }
        found = {k: state.get(k) for k in expected}
        saved, theirs = state.get("members"), state.get("weights")
        if state.get("version") == 3:  # saved before identities: names and rows
            names, rows = state.get("names") or [], state.get("lengths") or []
            saved = [{"name": n, "rows": r} for n, r in zip(names, rows, strict=False)]
            saved = [{k: v for k, v in i.items() if "?" not in str(v)} for i in saved]
            saved = saved if len(names) == len(rows) else None
            found["items"] = state.get("items", "transitions")  # saved before windows
            theirs = state.get("weights", weights)  # saved before weights: taken
        elif state.get("version") != _STATE_VERSION:
            saved = None
        differs = [] if found == expected else [f"options {found}, here {expected}"]
        if not isinstance(saved, list) or len(saved) != len(ours):
            differs.append(f"stores {saved}, here {[i['name'] for i in ours]}")
        else:
            for g, (mine, here) in enumerate(zip(saved, ours, strict=True)):
                if not isinstance(mine, dict):
                    differs.append(f"store {g} {mine!r}, here {here['name']!r}")
                    continue
                differs += [
                    f"store {g}'s {k} {mine[k]!r}, here {v!r}"
                    for k, v in here.items()
                    if k in mine and mine[k] != v
                ]
        same = (theirs is None and weights is None) or (
            isinstance(theirs, list)
            and weights is not None
            and len(theirs) == len(weights)
            and all(isinstance(w, int | float) for w in theirs)
            and np.allclose(theirs, weights, rtol=1e-9, atol=0)
        )
        if not same:
            differs.append(f"weights {theirs} (they order an epoch's units), here {weights}")
        if differs:
            raise InvalidArgumentError(
                f"this state does not belong to this stream of {self.where}: it was saved "
                f"with {'; '.join(differs[:3])}; open the stream with the stores, in the "
                f"same order, weights and options it was saved with"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next iteration yields what was not yet seen,
        whatever the number of ranks and DataLoader workers."""
        where = f"the state of a stream of {self.where} (pass the state as state_dict() gave it)"
        if not isinstance(state, dict):  # None, a list: not a state at all
            raise InvalidArgumentError(
                f"a stream's state must be the dict its state_dict() gave; got "
                f"{type(state).__name__} {state!r:.60} for {where}"
            )
        self._check_belongs(state)
        sizes = np.diff(self.units.bounds, axis=1).reshape(-1)
        epoch = whole_number(state.get("epoch"), "epoch", where, low=0)
        seed = whole_number(state.get("seed"), "seed", where, low=0)
        saved = state.get("positions")
        if not isinstance(saved, dict):
            raise InvalidArgumentError(
                f"positions must be a dict of items emitted by consumer; got {saved!r} for {where}"
            )
        positions: dict[int, int] = {}
        for c, p in saved.items():
            # a state saved as JSON has the consumers' numbers as strings
            key = int(c) if isinstance(c, str) and c.isdigit() else c
            consumer = whole_number(key, "a consumer of positions", where, low=0)
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
        self.seed, self.epoch, self._consumers = seed, epoch, state.get("consumers")
        self.positions, self._base, self._loaded = positions, base, consumed

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.where!r}, batch_size={self.batch_size}, "
            f"seed={self.seed}, epoch={self.epoch}, shuffle_buffer={self.shuffle_buffer}, "
            f"items={self._item_count})"
        )


#: The stream of one store (:meth:`AtariZarrDataset.stream`).
AtariZarrStream = EpochStream


class StreamIterator(Iterator[TensorDict]):
    """An iteration of an :class:`EpochStream`: its batches, and :meth:`close`.

    Closed (by itself, its stream or its dataset), its unit reader's threads are
    stopped and joined, and every later ``next()`` raises
    :class:`~atari_zarr.errors.DatasetClosedError` in one line: an iterator never reads
    on after a close, nor ends as if its epoch were done.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        #: The unit reader once the first batch was asked for (None: not yet).
        self.reader: UnitReader | None = None
        self._batches: Iterator[TensorDict] = iter(())
        self._error: DatasetClosedError | None = None
        self._done = False

    def start(self, batches: Iterator[TensorDict]) -> None:
        """Yield ``batches`` (the stream's generator of this iteration)."""
        self._batches = batches

    def __iter__(self) -> StreamIterator:
        return self

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called before its epoch was done."""
        return self._error is not None

    def __next__(self) -> TensorDict:
        if self._error is not None:
            self._end()  # closed on another thread while it ran: stopped here
            raise self._error
        try:
            return next(self._batches)
        except StopIteration:
            if self._error is not None:  # closed meanwhile: not the end of its epoch
                raise self._error from None
            self._done = True  # its epoch is done: a close later changes nothing
            raise
        except Exception:
            if self._error is not None:  # closed from another thread meanwhile
                raise self._error from None
            raise

    def close(self, why: str = "the iterator was closed") -> None:
        """Stop: the unit reader's threads joined, its memory given back; ``next()``
        raises one line from now on (``why`` says what closed it)."""
        if self._done:
            return
        if self._error is None:
            self._error = DatasetClosedError(
                f"{self.where}: this stream iterator was stopped because {why}; its threads "
                f"are stopped and its files let go. Iterate the stream again for another pass "
                f"(it starts where this one stopped), or open the dataset again"
            )
        reader = self.reader
        if reader is not None:
            reader.close()
        self._end()

    def _end(self) -> None:
        """End the generator of batches (its reader's close, a loader's workers stopped),
        unless another thread runs it: then its next ``next()`` does."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            try:
                close()  # its reader's close runs again: nothing more
            except ValueError:  # running on another thread: it stops after its batch
                pass


class StreamLoader:
    """``DataLoader(stream, batch_size=None, **kwargs)`` that records the batches it yields."""

    def __init__(self, stream: Any, **kwargs: Any) -> None:
        kwargs.setdefault("batch_size", None)
        # batches are TensorDicts already: the default conversion would take them apart
        kwargs.setdefault("collate_fn", collate_batch)
        self.stream = stream
        self.kwargs = kwargs

    def __iter__(self) -> StreamIterator:
        # one of the stream's iterators: its close (the stream's, the dataset's) stops
        # the loader's worker processes too, which read copies of the stream
        it = StreamIterator(self.stream.where)
        it.start(self._batches())
        self.stream._iterators.add(it)
        return it

    def _batches(self) -> Iterator[TensorDict]:
        loader = torch.utils.data.DataLoader(self.stream, **self.kwargs)
        workers = loader.num_workers
        stream = self.stream
        consumers = current_place(stream.rank, stream.world_size, loader_workers=workers).consumers
        # the workers start from what is left for this many consumers (pickled after this)
        stream._check_consumers(consumers)
        # an epoch that is over, or too small for its consumers, is one line here (no
        # worker is started), not a worker's traceback
        if stream._epoch_over(consumers, stream._own(consumers)[0]):
            return
        batches = iter(loader)
        try:
            for batch in batches:
                if workers:
                    self.stream.record(batch, workers)
                yield batch
        finally:
            stop = getattr(batches, "_shutdown_workers", None)
            if stop is not None:  # its worker processes, now rather than when collected
                stop()
