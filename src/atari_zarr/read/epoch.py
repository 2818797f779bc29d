"""The order of one epoch of a stream: read units, their permutation, the split, the window.

Everything here is arithmetic on row numbers; nothing reads a store. The stream
(:mod:`atari_zarr.read.stream`) asks an :class:`EpochPlan` which units one
consumer (a rank's DataLoader worker) reads, in which order, and in which order
their transitions leave.

* **Units.** A store's rows are cut into read units: whole frame shards by
  default, or runs of ``unit_rows`` rows inside a shard (:func:`unit_bounds`). A
  unit is fetched with one request.
* **Permutation and split.** The units are permuted by a generator seeded with
  ``(seed, epoch)``; in that order their items form one sequence of ``n`` items,
  cut into ``consumers = world_size * num_workers`` contiguous parts of
  ``floor(n / consumers)`` or one more: consumer ``c`` reads items
  ``[c * n // consumers, (c + 1) * n // consumers)`` of the sequence, so the units it
  reads are a run of the permutation, the first and last possibly in part (a unit cut
  between two consumers is read by both, each taking its own items). Consumers differ
  by one item at most.
* **Padding.** A consumer may be given ``pad`` items more than it has (the stream
  balances every consumer to the same count, as ``DistributedSampler`` does): they
  repeat the first items of its first unit, and leave in the shuffled order like the
  others.
* **Window.** A consumer's transitions leave in *segments*. Each row of the unit
  at position ``j`` of its list is assigned, at random, to one of the segments
  ``j .. j + window - 1``; a segment's rows leave in a random order. So at any
  time the rows come from ``window`` units at most, each contributing about
  ``1/window`` of a batch, and exactly ``window`` units are held decoded: the
  shuffle buffer is ``window`` units, a hard bound. (The first segment takes the
  rows that would fall before it, the last those after it, so no segment is
  nearly empty.)
* **Position.** Everything is a function of ``(seed, epoch, consumers, window,
  units)``, so the progress of a consumer is one number, the rows it has
  emitted; :meth:`EpochPlan.locate` turns it back into a segment and an offset.
* **What is left** (:class:`Consumed`). Which items of the epoch have been emitted,
  whatever the consumers that emitted them: whole units, and the items of the few
  units consumers were in the middle of. :meth:`EpochPlan.consumed` gives a
  consumer's share of it from its position. A plan made with ``left=`` deals only
  the items not yet consumed, in the same unit order, among any number of
  consumers: a job saved on 8 ranks resumes on 6, or with other DataLoader workers,
  with exactly the rest of its epoch.

Examples
--------
>>> bounds = unit_bounds(10_000, shard_rows=4096, unit_rows=4096)
>>> bounds.tolist()
[[0, 4096], [4096, 8192], [8192, 10000]]
>>> plan = EpochPlan(bounds, seed=0, epoch=0, shuffle=True, window=2, consumer=0, consumers=1)
>>> parts = [plan.segment(s) for s in plan.segments]  # (unit position, row in unit)
>>> rows = np.concatenate([bounds[plan.units[p], 0] + r for p, r in parts])
>>> sorted(rows.tolist()) == list(range(10_000)), rows[:3].tolist() != [0, 1, 2]
(True, True)
>>> [EpochPlan(bounds, seed=0, epoch=0, shuffle=True, window=2, consumer=c, consumers=3).rows
...  for c in range(3)]
[3333, 3333, 3334]
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Consumed", "EpochPlan", "interleave", "unit_bounds"]

# Streams of random numbers: one per purpose, so no two draws share a stream.
_SEGMENT_OF_ROW = 1
_ORDER_IN_SEGMENT = 2
_INTERLEAVE = 4


def unit_bounds(n_rows: int, *, shard_rows: int, unit_rows: int) -> np.ndarray:
    """Read units of a store: ``(n_units, 2)`` int64 ``[start, stop)`` row ranges.

    Units never cross a shard boundary; a shard of ``shard_rows`` rows is cut into
    units of ``unit_rows`` rows (the last one of a shard, and of the store, may be
    shorter).

    Examples
    --------
    >>> unit_bounds(100, shard_rows=64, unit_rows=48).tolist()
    [[0, 48], [48, 64], [64, 100]]
    """
    if n_rows <= 0:
        return np.zeros((0, 2), dtype=np.int64)
    shard_starts = np.arange(0, n_rows, shard_rows, dtype=np.int64)
    within = np.arange(0, shard_rows, unit_rows, dtype=np.int64)
    starts = (shard_starts[:, None] + within[None, :]).ravel()
    starts = starts[starts < n_rows]
    shard_end = (starts // shard_rows + 1) * shard_rows
    stops = np.minimum(np.minimum(starts + unit_rows, shard_end), n_rows)
    return np.stack([starts, stops], axis=1)


def interleave(
    sizes: np.ndarray, stores: np.ndarray, weights: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """An order of units in which each next one comes from a store drawn by weight.

    Each store's units keep their order and arrive as a Poisson process whose items
    flow at the store's weight: unit ``u`` of store ``s`` comes ``Exp(1) * sizes[u] /
    weights[s]`` after the store's previous one. Merged by arrival, the next unit is
    from store ``s`` with probability ``weights[s]`` over the weights of the stores
    with units left, in ``O(n log n)`` for ``n`` units. Stores of weight 0 come last.

    Examples
    --------
    >>> order = interleave(np.full(6, 10), np.array([0, 0, 0, 1, 1, 1]),
    ...                    np.array([1.0, 0.0]), np.random.default_rng(0))
    >>> order.tolist()
    [0, 1, 2, 3, 4, 5]
    >>> order = interleave(np.full(6, 10), np.array([0, 0, 0, 1, 1, 1]),
    ...                    np.array([1.0, 1.0]), np.random.default_rng(0))
    >>> sorted(order.tolist()), [u for u in order.tolist() if u < 3]
    ([0, 1, 2, 3, 4, 5], [0, 1, 2])
    >>> interleave(np.full(4, 10), np.array([0, 0, 1, 1]), np.array([0.0, 1.0]),
    ...            np.random.default_rng(0)).tolist()
    [2, 3, 0, 1]
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    stores = np.asarray(stores, dtype=np.int64)
    rate = np.asarray(weights, dtype=np.float64)[stores]
    gap = rng.exponential(1.0, len(sizes)) * np.maximum(sizes, 1.0)
    gap = np.where(rate > 0, gap / np.where(rate > 0, rate, 1.0), 0.0)
    # each store's clock: the cumulative gaps of its units, in their order
    by_store = np.argsort(stores, kind="stable")
    arrive = np.empty(len(sizes), dtype=np.float64)
    cum = np.cumsum(gap[by_store])
    first = np.r_[0, np.flatnonzero(np.diff(stores[by_store])) + 1]
    before = np.repeat(np.r_[0.0, cum][first], np.diff(np.r_[first, len(sizes)]))
    arrive[by_store] = cum - before
    arrive[rate <= 0] = np.inf  # never drawn while a store of weight is left
    return np.lexsort((np.arange(len(sizes)), arrive))


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([int(k) & 0xFFFFFFFF for k in key])


class Consumed:
    """The items of an epoch already emitted, per read unit: the part of a stream's state
    that no number of consumers enters.

    Parameters
    ----------
    bounds : numpy.ndarray
        ``(n_units, 2)`` item ranges of the units (as :class:`EpochPlan` takes them).

    Examples
    --------
    >>> done = Consumed(np.array([[0, 4], [4, 10]]))
    >>> done.add(0, np.arange(4)); done.add(1, np.array([2, 3]))
    >>> done.count, done.remaining(0).size, done.remaining(1).tolist()
    (6, 0, [0, 1, 4, 5])
    >>> Consumed.decode(done.encode(), done.sizes).count
    6
    """

    def __init__(self, bounds: np.ndarray | None = None, *, sizes: np.ndarray | None = None):
        if sizes is None:
            b = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
            sizes = b[:, 1] - b[:, 0]
        self.sizes = np.asarray(sizes, dtype=np.int64)
        #: Units whose every item was emitted.
        self.done = np.zeros(len(self.sizes), dtype=bool)
        #: Units in part: which of their items were emitted.
        self.partial: dict[int, np.ndarray] = {}

    @property
    def count(self) -> int:
        """Items emitted."""
        return int(self.sizes[self.done].sum()) + sum(int(m.sum()) for m in self.partial.values())

    def add(self, unit: int, items: np.ndarray) -> None:
        """Items ``items`` (numbers within unit ``unit``) were emitted."""
        unit = int(unit)
        if self.done[unit] or not len(items):
            return
        mask = self.partial.get(unit)
        if mask is None:
            mask = np.zeros(int(self.sizes[unit]), dtype=bool)
        mask[np.asarray(items, dtype=np.int64)] = True
        if mask.all():
            self.done[unit] = True
            self.partial.pop(unit, None)
        else:
            self.partial[unit] = mask

    def remaining(self, unit: int) -> np.ndarray | None:
        """Items of ``unit`` not emitted (numbers within it); None: all of them."""
        if self.done[unit]:
            return np.zeros(0, dtype=np.int64)
        mask = self.partial.get(int(unit))
        return None if mask is None else np.flatnonzero(~mask)

    def copy(self) -> Consumed:
        out = Consumed(sizes=self.sizes)
        out.done = self.done.copy()
        out.partial = {u: m.copy() for u, m in self.partial.items()}
        return out

    @classmethod
    def concat(cls, parts: list[Consumed]) -> Consumed:
        """One list of units from several, in order (their units numbered on).

        Examples
        --------
        >>> a, b = Consumed(np.array([[0, 2]])), Consumed(np.array([[0, 3], [3, 4]]))
        >>> a.add(0, np.array([0, 1])); b.add(0, np.array([1]))
        >>> both = Consumed.concat([a, b])
        >>> both.count, both.done.tolist(), both.remaining(1).tolist()
        (3, [True, False, False], [0, 2])
        """
        out = cls(sizes=np.concatenate([p.sizes for p in parts]) if parts else np.zeros(0))
        out.done = np.concatenate([p.done for p in parts]) if parts else out.done
        start = 0
        for p in parts:
            out.partial.update({start + u: m.copy() for u, m in p.partial.items()})
            start += len(p.sizes)
        return out

    def encode(self) -> dict[str, Any]:
        """A JSON-friendly value: bit sets, base64."""
        import base64

        def bits(mask: np.ndarray) -> str:
            return base64.b64encode(np.packbits(mask).tobytes()).decode("ascii")

        return {
            "units": len(self.sizes),
            "done": bits(self.done),
            "partial": {str(u): bits(m) for u, m in sorted(self.partial.items())},
        }

    @classmethod
    def decode(cls, value: Any, sizes: np.ndarray) -> Consumed:
        """What :meth:`encode` gave, for units of ``sizes`` items; ValueError if it does not fit."""
        import base64

        out = cls(sizes=sizes)
        n = len(out.sizes)
        if not isinstance(value, dict) or value.get("units") != n:
            raise ValueError(f"expected the emitted items of {n} units")

        def mask(text: Any, size: int) -> np.ndarray:
            raw = np.frombuffer(base64.b64decode(str(text), validate=True), dtype=np.uint8)
            if len(raw) != -(-size // 8):
                raise ValueError(f"expected {size} bits")
            return np.unpackbits(raw)[:size].astype(bool)

        out.done = mask(value.get("done", ""), n)
        for key, text in dict(value.get("partial", {})).items():
            unit = int(key)
            if not 0 <= unit < n:
                raise ValueError(f"unit {unit} is not one of {n}")
            out.add(unit, np.flatnonzero(mask(text, int(out.sizes[unit]))))
        return out


class EpochPlan:
    """One consumer's part of one epoch: its units, their segments, the order of rows.

    Parameters
    ----------
    bounds : numpy.ndarray
        ``(n_units, 2)`` item ranges of every unit of the store (:func:`unit_bounds`).
    seed, epoch : int
        The permutation of units and of rows is drawn from these.
    shuffle : bool
        False: units and rows in stored order (``window`` is then 1).
    window : int
        Units whose rows are mixed at any time (the shuffle buffer, in units).
    consumer, consumers : int
        This consumer (``rank * num_workers + worker``) and how many there are.
    pad : int
        Items to add by repeating this consumer's first ones (0: none).
    left : Consumed, optional
        Items already emitted in this epoch (a resumed stream): only the others are
        dealt, in the same unit order (default: none emitted).
    stores, weights : numpy.ndarray, optional
        A mixture: the store of each unit (``(n_units,)``) and the weight of each store.
        This consumer's units then come in the order of :func:`interleave` (each next
        unit from a store drawn by weight among those it still has units of), so its
        first batches draw on every store by weight. Default: the permutation's order,
        which draws on the stores in proportion to their items.
    """

    def __init__(
        self,
        bounds: np.ndarray,
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int,
        consumer: int,
        consumers: int,
        pad: int = 0,
        left: Consumed | None = None,
        stores: np.ndarray | None = None,
        weights: np.ndarray | None = None,
    ) -> None:
        self.bounds = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
        self.seed, self.epoch, self.shuffle = int(seed), int(epoch), bool(shuffle)
        self.consumer, self.consumers = int(consumer), int(consumers)
        n = len(self.bounds)
        self.order = _rng(self.seed, self.epoch).permutation(n) if shuffle else np.arange(n)
        self._at = np.empty(n, dtype=np.int64)
        self._at[self.order] = np.arange(n, dtype=np.int64)
        sizes = self.bounds[self.order, 1] - self.bounds[self.order, 0]
        #: Items left of units in part (numbers within the unit), where some were emitted.
        self._lists: dict[int, np.ndarray] = {}
        if left is not None:
            sizes = np.where(left.done[self.order], 0, sizes)
            for unit in left.partial:
                self._lists[unit] = left.remaining(unit)  # type: ignore[assignment]
                sizes[self._at[unit]] = len(self._lists[unit])
        ends = np.cumsum(sizes)
        starts = ends - sizes
        self._before = starts
        #: Items of the whole epoch (every consumer's, before padding).
        self.total = int(ends[-1]) if n else 0
        #: Where each consumer's part of the epoch's sequence of items begins (and ends).
        self.cuts = (np.arange(self.consumers + 1, dtype=np.int64) * self.total) // self.consumers
        lo, hi = int(self.cuts[self.consumer]), int(self.cuts[self.consumer + 1])
        take = (ends > lo) & (starts < hi) & (sizes > 0)
        #: Units this consumer reads, in order (ids into ``bounds``).
        self.units = self.order[take]
        #: Its first item in each of them (0 unless the unit is shared), and how many.
        self.offsets = np.maximum(lo - starts[take], 0)
        self.real = np.minimum(ends[take], hi) - starts[take] - self.offsets
        m = len(self.units)
        if shuffle and stores is not None and weights is not None and m > 1:
            rng = _rng(self.seed, self.epoch, self.consumers, self.consumer, _INTERLEAVE)
            at = interleave(self.real, np.asarray(stores)[self.units], weights, rng)
            self.units, self.offsets, self.real = self.units[at], self.offsets[at], self.real[at]
        self.window = max(1, min(int(window), m)) if shuffle else 1
        self.pad = int(pad) if m else 0
        self._sizes = self.real.copy()
        if self.pad:
            self._sizes[0] += self.pad
        #: Items this consumer emits in the whole epoch (padding included).
        self.rows = int(self._sizes.sum())
        self._segment_sizes: np.ndarray | None = None

    @property
    def segments(self) -> range:
        """Segment numbers, in the order they leave (positions in :attr:`units`)."""
        return range(self.window - 1, len(self.units))

    def needed(self, s: int) -> range:
        """Positions (in :attr:`units`) of the units whose rows segment ``s`` holds."""
        return range(max(0, s - self.window + 1), s + 1)

    def row_segments(self, j: int) -> np.ndarray:
        """The segment of each item of the unit at position ``j`` (padding included)."""
        n = int(self._sizes[j])
        if not self.shuffle or self.window == 1:
            return np.full(n, j, dtype=np.int64)
        unit = int(self.units[j])
        key = (self.seed, self.epoch, unit, int(self.offsets[j]), n, _SEGMENT_OF_ROW)
        off = _rng(*key).integers(0, self.window, n)
        return np.clip(j + off, self.window - 1, len(self.units) - 1)

    def segment(self, s: int, row_segments: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Items of segment ``s`` in the order they leave.

        Returns ``(position, item)``: the unit's position in :attr:`units` and the item
        within the unit (0-based, :attr:`offsets` included; padding maps to the item it
        repeats), each ``(len,)`` int64. ``row_segments`` maps a position to
        :meth:`row_segments` already computed (a cache).
        """
        pos, rows = [], []
        for j in self.needed(s):
            segs = row_segments(j) if row_segments is not None else self.row_segments(j)
            r = np.flatnonzero(segs == s)
            pos.append(np.full(len(r), j, dtype=np.int64))
            rows.append(self._local(j, r))
        p, r = np.concatenate(pos), np.concatenate(rows)
        if self.shuffle:
            perm = _rng(
                self.seed, self.epoch, self.consumers, self.consumer, s, _ORDER_IN_SEGMENT
            ).permutation(len(p))
            p, r = p[perm], r[perm]
        return p, r

    def _local(self, j: int, r: np.ndarray) -> np.ndarray:
        """Item numbers within unit ``j``'s unit of its ``r``-th items (padding wraps)."""
        local = np.asarray(r, dtype=np.int64) % int(self.real[j]) + int(self.offsets[j])
        left = self._lists.get(int(self.units[j]))
        return local if left is None else left[local]

    def consumed(self, position: int) -> dict[int, np.ndarray]:
        """The items this consumer emitted in its first ``position``: unit -> item numbers
        within it (padding repeats an item already there)."""
        s, off = self.locate(position)
        m = len(self.units)
        out: dict[int, list[np.ndarray]] = {}
        for j in range(min(s + 1, m)):
            n = int(self._sizes[j])
            if s >= m or j + self.window - 1 < s:  # every item of it left in segments < s
                r = np.arange(n, dtype=np.int64)
            else:
                r = np.flatnonzero(self.row_segments(j) < s)
            out.setdefault(int(self.units[j]), []).append(self._local(j, r))
        if s < m and off:
            p, items = self.segment(s)
            for j in np.unique(p[:off]).tolist():
                out.setdefault(int(self.units[j]), []).append(items[:off][p[:off] == j])
        return {u: np.unique(np.concatenate(parts)) for u, parts in out.items()}

    def segment_sizes(self) -> np.ndarray:
        """Rows of every segment (indexed like :attr:`segments`)."""
        if self._segment_sizes is None:
            m = len(self.units)
            counts = np.zeros(m, dtype=np.int64)
            for j in range(m):
                counts += np.bincount(self.row_segments(j), minlength=m)
            self._segment_sizes = counts[self.window - 1 :] if m else counts
        return self._segment_sizes

    def locate(self, position: int) -> tuple[int, int]:
        """Segment holding the row emitted at ``position``, and the offset in it.

        ``position == rows`` (the epoch is done) gives ``(len(units), 0)``.
        """
        if position >= self.rows:
            return len(self.units), 0
        if position == 0:  # the start: no segment's size is needed (empty ones are skipped)
            return self.window - 1, 0
        ends = np.cumsum(self.segment_sizes())
        k = int(np.searchsorted(ends, position, side="right"))
        start = int(ends[k - 1]) if k else 0
        return self.window - 1 + k, int(position - start)

    def consumer_of(self, item: int) -> int:
        """The consumer that reads item ``item`` (an item number of the store)."""
        unit = int(np.searchsorted(self.bounds[:, 1], item, side="right"))
        within = item - int(self.bounds[unit, 0])
        left = self._lists.get(unit)
        if left is not None:
            within = int(np.searchsorted(left, within))
        position = int(self._before[self._at[unit]]) + within
        return int(np.searchsorted(self.cuts, position, side="right")) - 1
