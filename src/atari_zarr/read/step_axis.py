"""The actions and rewards of many stores on one axis: :class:`StepAxis`.

A batch drawn from a mixture touches 157 of 240 stores for a batch of 256. Asking each
store touched for its actions and rewards costs a few array operations per store and
per column, and over hundreds of stores those cost more than the batch's decoding
did. The axis keeps every store's values of a column in one array, store ``g``'s row
``r`` at row ``offsets[g] + r`` (the rows of
:class:`~atari_zarr.read.episode_index.EpisodeIndex`), so a batch's values are one
gather whatever the number of stores it touches.

The values stay lazy: each store's :class:`~atari_zarr.read.columns.StepColumn` moves
onto the axis when a batch first touches it (:meth:`StepColumn.move_to
<atari_zarr.read.columns.StepColumn.move_to>`), and still loads its chunks itself,
into the axis, the first time one of their rows is asked for. The arrays are address
space until chunks are loaded: memory grows with the chunks read, as it does store by
store. A store whose column does not fit the axis (another dtype or chunking), or
leaves it (a chunk that needs a wider dtype), is read by itself.

Examples
--------
>>> from atari_zarr.read.store import StoreReader
>>> stores = [StoreReader(store_url), StoreReader(store_url)]  # the Pong/1 fixture, twice
>>> axis = StepAxis(stores)
>>> which, rows = np.array([1, 0]), np.array([5, 7])
>>> got = axis.values(which, rows, ["action", "reward"])
>>> alone = [stores[1].action[np.array([5])][0], stores[0].action[np.array([7])][0]]
>>> got["action"].tolist() == alone
True
>>> got["reward"].dtype == stores[0].reward[np.array([5])].dtype
True
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from atari_zarr.forks import after_fork
from atari_zarr.read.columns import StepColumn

__all__ = ["StepAxis"]

#: The columns the axis holds, by the name a batch gives them.
COLUMNS = ("action", "reward")


class _Column:
    """One column of every store on the axis: values, chunk flags and stores moved on."""

    def __init__(self, dtype: np.dtype, compact: np.dtype, chunk_rows: int, lengths: np.ndarray):
        self.dtype = dtype
        self.chunk_rows = chunk_rows
        chunks = -(-lengths // chunk_rows)
        #: Global chunk of each store's first chunk.
        self.chunk_offsets = np.concatenate(([0], np.cumsum(chunks))).astype(np.int64)
        # np.empty: address space until chunks are loaded into it
        self.values = np.empty(int(lengths.sum()), dtype=compact)
        self.loaded = np.zeros(int(self.chunk_offsets[-1]), dtype=bool)
        #: Stores whose column keeps its values here.
        self.on = np.zeros(len(lengths), dtype=bool)


class StepAxis:
    """The actions and rewards of ``stores`` (opened or not), on one axis of rows.

    Parameters
    ----------
    stores : sequence of StoreReader
        The stores, in their order in the dataset.
    """

    def __init__(self, stores: Sequence[Any]) -> None:
        self.stores = list(stores)
        self.lengths = np.array([len(s) for s in self.stores], dtype=np.int64)
        #: Global row of each store's first row.
        self.offsets = np.concatenate(([0], np.cumsum(self.lengths))).astype(np.int64)
        self._columns: dict[str, _Column] = {}
        #: Stores that cannot be on the axis (read by themselves).
        self._apart = np.zeros(len(self.stores), dtype=bool)
        self._lock = threading.Lock()
        after_fork(self._renew_lock)

    def _renew_lock(self) -> None:
        """In a forked child: a lock a reading thread of the parent held stays held."""
        self._lock = threading.Lock()

    def values(
        self, which: np.ndarray, rows: np.ndarray, names: Sequence[str]
    ) -> dict[str, np.ndarray] | None:
        """Values ``names`` (of :data:`COLUMNS`) of row ``rows[i]`` of store ``which[i]``
        (opened stores), each in its column's dtype; None where a store touched is not
        on the axis (the caller asks the stores)."""
        which = np.asarray(which, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        touched = np.unique(which)
        out = {}
        for name in names:
            col = self._column(name, touched)
            if col is None:
                return None
            chunks = col.chunk_offsets[which] + rows // col.chunk_rows
            missing = ~col.loaded[chunks]
            if missing.any():  # chunks read for the first time, by their stores
                for g in np.unique(which[missing]).tolist():
                    column = self._store_column(g, name)
                    column[rows[which == g]]
                if not (col.on[touched].all() and col.loaded[chunks].all()):
                    return None  # a store left the axis meanwhile
            got = col.values[self.offsets[which] + rows]
            if not col.on[touched].all():
                return None
            out[name] = got.astype(col.dtype, copy=False)
        return out

    def _store_column(self, g: int, name: str) -> StepColumn:
        store = self.stores[g]
        return store.action if name == "action" else store.reward  # type: ignore[no-any-return]

    def _column(self, name: str, touched: np.ndarray) -> _Column | None:
        """Column ``name`` with the stores ``touched`` on it; None where one cannot be."""
        col = self._columns.get(name)
        if col is not None and col.on[touched].all():
            return col
        if self._apart[touched].any():
            return None
        with self._lock:
            col = self._columns.get(name)
            for g in touched.tolist():
                if col is not None and col.on[g]:
                    continue
                column = self._store_column(g, name)
                if not isinstance(column, StepColumn):
                    self._apart[g] = True
                    return None
                if col is None:
                    col = self._columns[name] = _Column(
                        column.dtype, column.compact_dtype, column.chunk_rows, self.lengths
                    )
                if not self._move(col, g, column):
                    self._apart[g] = True
                    return None
        return col

    def _move(self, col: _Column, g: int, column: StepColumn) -> bool:
        """Store ``g``'s ``column`` keeps its values on ``col`` from now on."""
        if column.dtype != col.dtype or column.chunk_rows != col.chunk_rows:
            return False
        lo, hi = int(self.offsets[g]), int(self.offsets[g + 1])
        c0, c1 = int(col.chunk_offsets[g]), int(col.chunk_offsets[g + 1])

        def leave() -> None:
            col.on[g] = False
            self._apart[g] = True

        if not column.move_to(col.values[lo:hi], col.loaded[c0:c1], leave):
            return False
        col.on[g] = True
        return True
