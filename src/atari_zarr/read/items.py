"""What one item of a reader is: a transition, or a window of ``K`` rows of one episode.

:class:`Items` numbers the items of a store and maps item numbers to rows, with
arithmetic on the per-episode table only (no per-item array: a 50M-row store costs
``O(episodes)`` memory here):

* **transitions**: item ``i`` is row ``i``;
* **windows of K** (``Items.windows``): every start row ``s`` such that rows
  ``s .. s + K - 1`` lie in one episode, in row order, so an episode of length
  ``L`` gives ``max(0, L - K + 1)`` items; with ``pad``, an episode shorter than
  ``K`` gives one item of its ``L`` rows (the rest is padding).

The stream deals items through read units (:mod:`atari_zarr.read.epoch`) with
:meth:`Items.count_before`, and readers turn an item into rows with
:meth:`Items.starts` and :meth:`Items.real`.

Examples
--------
>>> from atari_zarr.episodes import EpisodeTable
>>> table = EpisodeTable(np.array([5, 2, 4]), np.array([True, False, True]), None)
>>> w = Items.windows(table, 3)
>>> len(w), w.starts(np.arange(len(w))).tolist()
(5, [0, 1, 2, 7, 8])
>>> p = Items.windows(table, 3, pad=True)
>>> p.starts(np.arange(len(p))).tolist(), p.real(np.arange(len(p))).tolist()
([0, 1, 2, 5, 7, 8], [3, 3, 3, 2, 3, 3])
>>> w.count_before(np.array([0, 3, 7, 11])).tolist()
[0, 3, 3, 5]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atari_zarr.arguments import whole_number
from atari_zarr.episodes import EpisodeTable
from atari_zarr.errors import InvalidArgumentError

__all__ = ["Items", "item_rows"]


class Items:
    """The items of a store: transitions (``length == 1``) or windows of ``length`` rows.

    Use :meth:`transitions` or :meth:`windows` to make one.
    """

    def __init__(
        self,
        n_rows: int,
        length: int,
        *,
        pad: bool = False,
        starts: np.ndarray | None = None,
        counts: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
    ) -> None:
        self.n_rows = int(n_rows)
        self.length = int(length)
        self.pad = bool(pad)
        #: True when item ``i`` is row ``i``.
        self.identity = starts is None
        if starts is None:
            self._count = self.n_rows
            return
        assert counts is not None and lengths is not None
        self._ep_start = np.asarray(starts, dtype=np.int64)
        self._ep_len = np.asarray(lengths, dtype=np.int64)
        self._ep_count = np.asarray(counts, dtype=np.int64)
        self._ep_end = self._ep_start + self._ep_len - 1
        #: Items before each episode's first one (``len(episodes) + 1`` entries).
        self._cum = np.concatenate([[0], np.cumsum(self._ep_count)]).astype(np.int64)
        self._count = int(self._cum[-1])

    @classmethod
    def transitions(cls, n_rows: int) -> Items:
        """Every row is an item."""
        return cls(n_rows, 1)

    @classmethod
    def windows(
        cls, table: EpisodeTable, length: Any, *, pad: bool = False, where: str = "the store"
    ) -> Items:
        """Windows of ``length`` consecutive rows of one episode (see the module docstring).

        ``length`` is checked here, the one place a window length is: a one-line error
        names ``where`` and its longest episode when no window would fit.

        Examples
        --------
        >>> ends = np.array([0, 0, 0, 1, 0, 1], bool)
        >>> table = EpisodeTable.from_steps(np.repeat([0, 1], [4, 2]), ends, np.zeros(6))
        >>> Items.windows(table, 30, where="s.zarr")
        Traceback (most recent call last):
            ...
        atari_zarr.errors.InvalidArgumentError: windows of 30 steps: no episode of s.zarr is \
that long (the longest has 4 steps); use a shorter window, or pad=True to pad shorter episodes
        """
        length = whole_number(length, "window length", where, unit="steps")
        lengths = np.asarray(table.length, dtype=np.int64)
        longest = int(lengths.max()) if len(lengths) else 0
        if not pad and length > longest:
            raise InvalidArgumentError(
                f"windows of {length} steps: no episode of {where} is that long (the longest "
                f"has {longest} steps); use a shorter window, or pad=True to pad shorter episodes"
            )
        counts = np.maximum(lengths - length + 1, 0)
        if pad:
            counts = np.where(lengths < length, 1, counts)
        return cls(
            int(lengths.sum()),
            length,
            pad=bool(pad),
            starts=table.starts,
            counts=counts,
            lengths=lengths,
        )

    def __len__(self) -> int:
        return self._count

    @property
    def token(self) -> str:
        """What the items are, as recorded in a stream's state: ``transitions``, ``windows:K``."""
        if self.identity:
            return "transitions"
        return f"windows:{self.length}" + (":pad" if self.pad else "")

    def episode(self, items: np.ndarray) -> np.ndarray:
        """Episode of each item (windows only)."""
        return np.searchsorted(self._cum, np.asarray(items, dtype=np.int64), side="right") - 1

    def starts(self, items: np.ndarray) -> np.ndarray:
        """First row of each item."""
        items = np.asarray(items, dtype=np.int64)
        if self.identity:
            return items
        e = self.episode(items)
        return self._ep_start[e] + (items - self._cum[e])

    def real(self, items: np.ndarray) -> np.ndarray | None:
        """Rows of each item that exist (``< length`` only for a padded window); None: all."""
        if not self.pad:
            return None
        e = self.episode(items)
        return np.minimum(self._ep_len[e], self.length)

    def count_before(self, rows: np.ndarray) -> np.ndarray:
        """Items whose first row is before each of ``rows`` (``rows`` in ``[0, n_rows]``)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.identity:
            return rows
        e = np.searchsorted(self._ep_end, rows, side="left")  # the episode holding the row
        inside = e < len(self._ep_start)
        e_safe = np.minimum(e, max(len(self._ep_start) - 1, 0))
        if not len(self._ep_start):
            return np.zeros_like(rows)
        within = np.clip(rows - self._ep_start[e_safe], 0, self._ep_count[e_safe])
        return np.where(inside, self._cum[e_safe] + within, self._count)


def item_rows(
    items: Sequence[Items], store: np.ndarray, local: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """First row and real rows (None: every item whole) of item ``local[i]`` of store
    ``store[i]``, each by its store's ``items``.

    Examples
    --------
    >>> two = [Items.transitions(10), Items.transitions(5)]
    >>> starts, real = item_rows(two, np.array([1, 0]), np.array([4, 9]))
    >>> starts.tolist(), real
    ([4, 9], None)
    """
    if items[0].identity:
        return np.asarray(local, dtype=np.int64), None
    starts = np.empty(len(local), dtype=np.int64)
    real = np.empty(len(local), dtype=np.int64) if items[0].pad else None
    for g in np.unique(store).tolist():
        sel = store == g
        starts[sel] = items[g].starts(local[sel])
        if real is not None:
            real[sel] = items[g].real(local[sel])
    return starts, real
