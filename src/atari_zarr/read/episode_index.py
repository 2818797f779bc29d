"""The episodes of many stores as one table: :class:`EpisodeIndex`.

A batch drawn from a mixture touches a store for nearly every item (157 of 240
stores for a batch of 256). Asking each store touched for the episode, first row and
end of its rows costs a few array operations per store, and over hundreds of stores
those cost more than the batch's decoding. The index lays every opened store's
episode ends on one axis of rows (store ``g``'s row ``r`` is row ``offsets[g] + r``),
so these values for a whole batch are one ``searchsorted`` and a few gathers, whatever
the number of stores it touches. Their actions and rewards lie on the same axis in a
:class:`~atari_zarr.read.step_axis.StepAxis`.

A store joins the index when a batch first touches it (a mixture known by its catalog
opens its stores on first need): the index is then made again from every store
opened so far, at most once per store.

Examples
--------
>>> from atari_zarr.read.store import StoreReader
>>> store = StoreReader(store_url)  # the converted Pong/1 fixture
>>> index = EpisodeIndex([store, store])
>>> which, rows = np.array([1, 0]), np.array([5, len(store) - 1])
>>> got = index.lookup(which, rows)
>>> got.episode.tolist() == store.episode[rows].tolist()
True
>>> bool(got.done[1]), got.first.tolist() == store.first_row(rows).tolist()
(True, True)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atari_zarr.forks import after_fork

__all__ = ["EpisodeIndex", "RowEpisodes"]


@dataclass(frozen=True)
class RowEpisodes:
    """What the episode table says of some rows, each of its own store.

    Attributes
    ----------
    episode : numpy.ndarray
        int64, the row's episode, numbered within its store.
    first : numpy.ndarray
        int64, the first row of that episode, in its store.
    done, terminated, truncated : numpy.ndarray
        bool, the row ends its episode; by termination; by truncation.
    """

    episode: np.ndarray
    first: np.ndarray
    done: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


@dataclass(frozen=True)
class _Table:
    included: np.ndarray  # bool per store
    ends: np.ndarray  # global rows, sorted
    starts: np.ndarray  # global rows
    terminated: np.ndarray  # bool per episode
    first_episode: np.ndarray  # per store: global number of its first episode


class EpisodeIndex:
    """Every opened store's episode table, on one axis of rows.

    Parameters
    ----------
    stores : sequence of StoreReader
        The stores, in their order in the dataset (opened or not): each has a length
        and, once opened, its ``episodes`` table
        (:class:`~atari_zarr.episodes.EpisodeTable`).
    """

    def __init__(self, stores: Sequence[Any]) -> None:
        self.stores = list(stores)
        #: Global row of each store's first row.
        self.offsets = np.cumsum([0, *(len(s) for s in self.stores)], dtype=np.int64)
        #: Rows of each store.
        self.lengths = np.diff(self.offsets)
        none = np.zeros(0, dtype=np.int64)
        self._table = _Table(
            included=np.zeros(len(self.stores), dtype=bool),
            ends=none,
            starts=none,
            terminated=np.zeros(0, dtype=bool),
            first_episode=np.zeros(len(self.stores), dtype=np.int64),
        )
        # per store: 1 where its episodes come from its table, 0 where not, -1 unknown
        self._in_table = np.full(len(self.stores), -1, dtype=np.int8)
        self._lock = threading.Lock()
        after_fork(self._renew_lock)

    def answers(self, groups: Sequence[int]) -> bool:
        """Whether the index answers for the stores ``groups`` (opened): each takes its
        episodes from its table, not from per-step arrays (one array step, once known)."""
        flags = self._in_table[groups]
        if (flags < 0).any():
            for g in np.asarray(groups)[flags < 0].tolist():
                self._in_table[g] = bool(self.stores[g].episodes_in_table)
            flags = self._in_table[groups]
        return bool((flags == 1).all())

    def _renew_lock(self) -> None:
        """In a forked child: a lock a reading thread of the parent held stays held."""
        self._lock = threading.Lock()

    def _covering(self, which: np.ndarray) -> _Table:
        """The table, made again to include the stores ``which`` (opened) if it does not."""
        table = self._table
        if table.included[which].all():
            return table
        with self._lock:
            table = self._table
            missing = np.setdiff1d(which, np.flatnonzero(table.included))
            if missing.size:
                included = table.included.copy()
                included[missing] = True
                table = self._table = self._make(included)
        return table

    def _make(self, included: np.ndarray) -> _Table:
        """The table of the stores ``included`` (bool per store)."""
        groups = np.flatnonzero(included)
        ends, starts, term = [], [], []
        first_episode = np.zeros(len(self.stores), dtype=np.int64)
        count = 0
        for g in groups.tolist():
            table = self.stores[g].episodes
            first_episode[g] = count
            count += len(table.ends)
            ends.append(table.ends + self.offsets[g])
            starts.append(table.starts + self.offsets[g])
            term.append(table.terminated)
        return _Table(
            included,
            np.concatenate(ends).astype(np.int64, copy=False),
            np.concatenate(starts).astype(np.int64, copy=False),
            np.concatenate(term).astype(bool, copy=False),
            first_episode,
        )

    def lookup(self, which: np.ndarray, rows: np.ndarray) -> RowEpisodes:
        """The episode values of row ``rows[i]`` of store ``which[i]`` (opened stores).

        Parameters
        ----------
        which, rows : numpy.ndarray
            int64, of one shape: each row's store and its row in it.
        """
        which = np.asarray(which, dtype=np.int64)
        table = self._covering(np.unique(which))
        base = self.offsets[which]
        at = np.asarray(rows, dtype=np.int64) + base
        ep = np.searchsorted(table.ends, at, side="left")
        done = table.ends[ep] == at
        term = table.terminated[ep]
        return RowEpisodes(
            episode=ep - table.first_episode[which],
            first=table.starts[ep] - base,
            done=done,
            terminated=done & term,
            truncated=done & ~term,
        )
