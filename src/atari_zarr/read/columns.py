"""Per-step columns of a store, loaded lazily.

:class:`StepColumn` loads a per-step array chunk by chunk, in the smallest dtype
that holds it losslessly. :func:`open_step_columns` opens the columns the reader
needs; episode ids and episode ends come from the per-episode table in the
attributes when it is there (:func:`atari_zarr.episodes.episode_table`, the one
parser of that table), so opening a 50 M-transition store reads no per-step data.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import zarr

from atari_zarr.episodes import EpisodeTable, episode_table
from atari_zarr.forks import after_fork
from atari_zarr.layout import (
    ACTION,
    EPISODE,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
    get_array,
)
from atari_zarr.read.chunks import ChunkReader
from atari_zarr.read.options import ReadOptions

__all__ = ["StepColumn", "open_step_columns"]

log = logging.getLogger("atari_zarr")


class StepColumn:
    """A per-step array loaded lazily, chunk by chunk, kept in a compact dtype.

    ``column[rows]`` returns values in the array's own dtype; ``reading`` is the
    :class:`~atari_zarr.read.chunks.ChunkReader`'s ``remedy`` and ``options``. Each chunk is
    decoded the first time one of its rows is asked for and stored in the smallest
    candidate dtype that round-trips its bytes exactly (int8 for actions and DQN's
    clipped rewards), widening the whole column if a later chunk needs it. The
    backing array is allocated untouched, so memory grows only with the chunks read.

    Examples
    --------
    >>> import numpy as np, zarr
    >>> a = zarr.create_array({}, shape=(10,), chunks=(4,), dtype="float32")
    >>> a[:] = np.arange(10) - 5
    >>> col = StepColumn(a, where="memory")
    >>> col[np.array([9, 0])].tolist(), col.compact_dtype
    ([4.0, -5.0], dtype('int8'))
    >>> a[3] = 0.5
    >>> StepColumn(a, where="memory")[np.arange(10)][3]
    np.float32(0.5)
    """

    def __init__(self, array: zarr.Array, *, where: str, **reading: Any) -> None:
        # the store's options (coalescing, encoded bytes kept), with no decoded-chunk cache
        options = (reading.pop("options", None) or ReadOptions()).replace(budget=None)
        self._reader = ChunkReader(
            array,
            where=where,
            cache_bytes=0,
            threads=1,
            decode_ahead=False,
            options=options,
            **reading,
        )
        self.dtype = np.dtype(array.dtype)
        self._n = int(array.shape[0])
        self._chunk_rows = int(array.chunks[0])
        small = np.dtype("bool") if self.dtype == np.bool_ else np.dtype("int8")
        self.compact_dtype = (
            small if small.itemsize < self.dtype.itemsize or small == self.dtype else self.dtype
        )
        # np.empty of a large size maps untouched pages: no memory until a chunk is read.
        self._values = np.empty(self._n, dtype=self.compact_dtype)
        self._loaded = np.zeros(-(-self._n // self._chunk_rows), dtype=bool)
        self._complete = self._n == 0  # every chunk loaded: rows need no check
        # called when the values leave the arrays of move_to (widened)
        self._on_leave: Callable[[], None] | None = None
        self._lock = threading.Lock()
        after_fork(self._renew_lock)

    def _renew_lock(self) -> None:
        """In a forked child: a lock a reading thread of the parent held stays held."""
        self._lock = threading.Lock()

    @property
    def reader(self) -> ChunkReader:
        """The chunk reader of the column's array."""
        return self._reader

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, rows: Any) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if not self._complete:
            cids = rows // self._chunk_rows
            missing = ~self._loaded[cids]
            if missing.any():
                self._load(np.unique(cids[missing]).tolist())
        return self._values[rows].astype(self.dtype, copy=False)

    def to_numpy(self) -> np.ndarray:
        """Every value, in the array's dtype."""
        return self.span(0, self._n)

    def span(self, lo: int, hi: int) -> np.ndarray:
        """The values of rows ``lo`` to ``hi - 1``, with no array of row numbers."""
        first, last = lo // self._chunk_rows, -(-hi // self._chunk_rows)
        need = np.flatnonzero(~self._loaded[first:last]) + first
        if need.size:
            self._load(need.tolist())
        return self._values[lo:hi].astype(self.dtype, copy=False)

    @property
    def chunk_rows(self) -> int:
        """Rows per chunk of the column's array (the unit it loads)."""
        return self._chunk_rows

    def move_to(self, values: np.ndarray, loaded: np.ndarray, on_leave: Callable[[], None]) -> bool:
        """Keep the values in ``values`` and the chunks' loaded flags in ``loaded`` from now
        on (a mixture's arrays of every store's values:
        :class:`~atari_zarr.read.step_axis.StepAxis`), what is loaded copied there.

        False, nothing moved, where they do not fit (another compact dtype, length or
        chunking) or the column was moved before (a store that is twice in a mixture
        is on its axis once). A chunk loaded later that needs a wider dtype moves the values back
        to arrays of the column's own, after calling ``on_leave``.
        """
        with self._lock:
            if (
                self._on_leave is not None
                or values.dtype != self._values.dtype
                or values.shape != self._values.shape
                or loaded.shape != self._loaded.shape
            ):
                return False
            for c in np.flatnonzero(self._loaded).tolist():
                lo, hi = c * self._chunk_rows, min((c + 1) * self._chunk_rows, self._n)
                values[lo:hi] = self._values[lo:hi]
            loaded[:] = self._loaded
            self._values, self._loaded, self._on_leave = values, loaded, on_leave
            return True

    def _load(self, cids: list[int]) -> None:
        with self._lock:
            cids = [c for c in cids if not self._loaded[c]]
            if not cids:
                return
            # fetched in one round, decoded one at a time: a batch touching hundreds of
            # chunks of a huge store never holds hundreds of decoded chunks at once
            for c, block in zip(cids, self._reader.iter_chunks(cids), strict=True):
                lo = c * self._chunk_rows
                hi = min(lo + self._chunk_rows, self._n)
                data = np.ascontiguousarray(block[: hi - lo], dtype=self.dtype)
                if self._values.dtype != self.dtype:
                    back = data.astype(self._values.dtype).astype(self.dtype)
                    if not np.array_equal(back.view(np.uint8), data.view(np.uint8)):
                        log.debug("widening %s to %s", self._reader.name, self.dtype)
                        if self._on_leave is not None:  # off the mixture's arrays first
                            self._on_leave()
                            self._on_leave = None
                            self._loaded = self._loaded.copy()
                        self._values = self._values.astype(self.dtype)
                self._values[lo:hi] = data
                self._loaded[c] = True
            self._complete = bool(self._loaded.all())


class _Derived:
    """A read-only per-row column computed from the per-episode table.

    ``fn(rows)`` gives the values of any rows; ``span_fn(lo, hi)`` those of a range of
    rows without an array of row numbers (a whole 50 M-row column costs
    its values only).
    """

    def __init__(
        self, n: int, fn: Callable[[np.ndarray], np.ndarray], span_fn: Callable[[int, int], Any]
    ) -> None:
        self._n = n
        self._fn = fn
        self._span_fn = span_fn

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, rows: Any) -> np.ndarray:
        return self._fn(np.asarray(rows, dtype=np.int64))

    def span(self, lo: int, hi: int) -> np.ndarray:
        """The values of rows ``lo`` to ``hi - 1``."""
        return self._span_fn(lo, hi)  # type: ignore[no-any-return]

    def to_numpy(self) -> np.ndarray:
        return self.span(0, self._n)


def _episode_columns(table: EpisodeTable, n: int) -> dict[str, _Derived]:
    """Episode id, terminated, truncated and done of every row, from the table."""
    ends = table.ends
    term = table.terminated
    every = np.ones(len(ends), dtype=bool)

    def episode(rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(ends, rows, side="left").astype(np.int64)

    def episode_span(lo: int, hi: int) -> np.ndarray:
        if hi <= lo:
            return np.zeros(0, dtype=np.int64)
        first, last = np.searchsorted(ends, [lo, hi - 1], side="left")
        stop = np.minimum(ends[first : last + 1], hi - 1)
        begin = np.maximum(np.r_[lo, ends[first:last] + 1], lo)
        return np.repeat(np.arange(first, last + 1, dtype=np.int64), stop - begin + 1)

    def end_flag(flag: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        def fn(rows: np.ndarray) -> np.ndarray:
            ep = np.searchsorted(ends, rows, side="left")
            return (ends[ep] == rows) & flag[ep]

        return fn

    def end_span(flag: np.ndarray) -> Callable[[int, int], np.ndarray]:
        def fn(lo: int, hi: int) -> np.ndarray:
            out = np.zeros(max(hi - lo, 0), dtype=bool)
            at = ends[flag & (ends >= lo) & (ends < hi)]
            out[at - lo] = True
            return out

        return fn

    return {
        EPISODE: _Derived(n, episode, episode_span),
        TERMINATED: _Derived(n, end_flag(term), end_span(term)),
        TRUNCATED: _Derived(n, end_flag(~term), end_span(~term)),
        "done": _Derived(n, end_flag(every), end_span(every)),
    }


def open_step_columns(
    group: zarr.Group,
    meta: Mapping[str, Any],
    where: str,
    *,
    n: int | None = None,
    remedy: str | None = None,
    options: ReadOptions | None = None,
) -> dict[str, Any]:
    """Lazy per-step columns of a store, keyed by layout array name (plus ``"done"``).

    Episode id, terminated, truncated and done come from the per-episode table in
    the attributes when its lengths add up to the number of rows; otherwise from
    the arrays. Every column supports ``column[rows] -> numpy.ndarray``,
    ``column.span(lo, hi)`` (a range of rows, with no array of row numbers) and ``len``.

    Parameters
    ----------
    group : zarr.Group
        An open store.
    meta : mapping
        Its ``atari_zarr`` attributes.
    where : str
        Path or URL of the store, for error messages.
    n : int, optional
        Rows in use (default: all; an unfinished recording uses a prefix).
    remedy : str, optional
        What to do about a damaged chunk (:class:`~atari_zarr.read.chunks.ChunkReader`).
    options : ReadOptions, optional
        How the store is read (the columns keep no decoded chunks of their own).

    Examples
    --------
    >>> import zarr
    >>> from atari_zarr.layout import read_metadata
    >>> # store_url: a converted Pong/1 fixture store (shared by the examples)
    >>> group = zarr.open_group(store_url, mode="r")
    >>> cols = open_step_columns(group, read_metadata(group, store_url), store_url)
    >>> sorted(cols)
    ['action', 'done', 'episode', 'next/reward', 'next/terminated', 'next/truncated']
    >>> cols["action"][np.array([0, 5])].dtype.name
    'int32'
    >>> len(cols["episode"]) == group["action"].shape[0]
    True
    """
    if n is None:
        n = int(get_array(group, OBSERVATION, where).shape[0])

    def column(name: str) -> StepColumn:
        return StepColumn(
            get_array(group, name, where), where=where, remedy=remedy, options=options
        )

    cols: dict[str, Any] = {ACTION: column(ACTION), REWARD: column(REWARD)}
    table = episode_table(meta, n)
    if table is not None:
        cols.update(_episode_columns(table, n))
    else:
        term, trunc = column(TERMINATED), column(TRUNCATED)
        cols[EPISODE] = column(EPISODE)
        cols[TERMINATED] = term
        cols[TRUNCATED] = trunc
        cols["done"] = _Derived(
            n,
            lambda rows: term[rows] | trunc[rows],
            lambda lo, hi: term.span(lo, hi) | trunc.span(lo, hi),
        )
    return cols
