"""Stores as a Grain data source, for JAX: :class:`AtariZarrSource`.

Grain's ``RandomAccessDataSource`` protocol is structural: ``__len__``, a thread-safe
``__getitem__``, ``_getitems`` for batched reads, pickling for its worker processes,
and a ``__repr__`` that names the source for checkpoints. :class:`AtariZarrSource`
meets it over one store, its windows, or a mixture of stores, with records as nested
dicts of numpy arrays keyed as TorchRL's TED batches are (``observation``, ``action``,
``next: {observation, reward, terminated, truncated, done}``, ``index``, ...). Nothing
here imports grain or jax.

Examples
--------
>>> source = AtariZarrSource(store_url, frame_stack=4)  # the converted Pong/1 fixture
>>> record = source[0]
>>> record["observation"].shape, record["next"]["reward"].dtype
((4, 84, 84), dtype('float32'))
>>> [r["index"].item() for r in source._getitems([3, 1])]
[3, 1]
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.storage.paths import redact

__all__ = ["AtariZarrSource"]


def _records(columns: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """``n`` records from a nested dict of arrays whose first axis is the record: views
    of the batch's rows (numpy scalars for per-step values), split column by column in
    C (iterating an array's first axis), not element by element in Python."""
    keys = list(columns)
    parts = [
        _records(v, n) if isinstance(v, dict) else list(np.asarray(v)) for v in columns.values()
    ]
    return [dict(zip(keys, row, strict=True)) for row in zip(*parts, strict=True)]


class AtariZarrSource:
    """One store, its windows, or several stores as a Grain ``RandomAccessDataSource``.

    Parameters
    ----------
    path_or_url : str, path, or sequence of them
        A store (local path or fsspec URL), or several, read as one mixture
        (:class:`~atari_zarr.MultiGameDataset`: records carry ``game_id``).
    frame_stack : int
        Frames per ``observation`` (4: DQN's input).
    window : int, optional
        Records are windows of this many steps of one episode
        (:meth:`AtariZarrDataset.windows <atari_zarr.AtariZarrDataset.windows>`), each
        array with a leading axis of ``window``.
    storage_options : dict, optional
        fsspec options for URLs.
    options : ReadOptions, optional
        How the stores are read.

    Notes
    -----
    The stores open on first use, in each process (a pickled source reopens them there,
    and refuses a store replaced since it opened them where it was pickled). An index
    is checked as the datasets check it: never rounded, nor cast from a string or a
    bool. Reads are serialized by a lock: Grain may call
    ``__getitem__`` from several threads, and a batch (``_getitems``) is read with one
    frame fetch.
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        frame_stack: int = 4,
        *,
        window: int | None = None,
        storage_options: dict[str, Any] | None = None,
        options: Any = None,
    ) -> None:
        if isinstance(path_or_url, str | os.PathLike):
            urls: list[str] | str = os.fspath(path_or_url)
        elif isinstance(path_or_url, Sequence) and path_or_url:
            urls = [os.fspath(u) for u in path_or_url]
        else:
            raise InvalidArgumentError(
                f"path_or_url={path_or_url!r}: expected a store's path or URL, or a non-empty "
                f"list of them. Pass the store, or a list of stores to mix"
            )
        self.urls = urls
        self.frame_stack = frame_stack
        self.window = window
        self.storage_options = dict(storage_options or {})
        self.options = options
        self._dataset: Any = None
        self._lock = threading.Lock()

    def _open(self) -> Any:
        with self._lock:
            if self._dataset is None:
                from atari_zarr.read.dataset import AtariZarrDataset
                from atari_zarr.read.mixing import MultiGameDataset

                args = {"storage_options": self.storage_options, "options": self.options}
                if isinstance(self.urls, str):
                    ds: Any = AtariZarrDataset(self.urls, frame_stack=self.frame_stack, **args)
                else:
                    ds = MultiGameDataset(self.urls, frame_stack=self.frame_stack, **args)
                self._dataset = ds if self.window is None else ds.windows(self.window)
            return self._dataset

    def __len__(self) -> int:
        return len(self._open())

    def __getitem__(self, index: int) -> dict[str, Any]:
        rows, scalar = self._rows(index)
        if not scalar:
            raise TypeError(
                f"a source's [] reads one record, at an integer index; got {index!r:.60}. "
                f"Read several with _getitems(indices) or read_batch(indices)"
            )
        return _records(self._read(rows), 1)[0]

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The records at ``indices``, read as one batch (one frame fetch)."""
        rows, _ = self._rows(indices)
        return _records(self._read(rows), len(rows))

    def _rows(self, index: Any) -> tuple[np.ndarray, bool]:
        """The rows ``index`` selects, checked as the dataset checks them (never rounded,
        nor cast from a string or a bool): :func:`~atari_zarr.read.indexing.normalize_index`."""
        from atari_zarr.read.indexing import normalize_index

        dataset = self._open()
        return normalize_index(index, len(dataset), dataset.where, unit=dataset._unit)

    def _read(self, rows: np.ndarray) -> dict[str, Any]:
        dataset = self._open()
        with self._lock:
            batch = dataset[rows]
        return batch.numpy()  # type: ignore[no-any-return]

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """The records at ``indices`` as one batch: a nested dict of numpy arrays whose
        first axis is the record (what Grain's ``Batch`` makes of them, without
        splitting them into records and stacking them again).

        For ``grain.MapDataset.range(len(source)).shuffle(seed=0).batch(256)
        .map(source.read_batch)``: Grain's batches of indices, each read with one fetch.

        Examples
        --------
        >>> source = AtariZarrSource(store_url, frame_stack=4)
        >>> batch = source.read_batch([5, 2, 9])
        >>> batch["observation"].shape, batch["next"]["reward"].shape
        ((3, 4, 84, 84), (3, 1))
        """
        # numpy rows, as sample() draws them: no torch op (and none of its thread pool's
        # stalls beside other processes) on the way
        rows, _ = self._rows(indices)
        return self._read(rows)

    def __getstate__(self) -> dict[str, Any]:
        # the stores open again where unpickled (a Grain worker process). A dataset
        # opened here pickles as the datasets do (URLs, and which store each one was),
        # so a worker that finds a store replaced since refuses it
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        # what Grain's checkpoints name the source by: stable, with no credential
        urls = self.urls if isinstance(self.urls, str) else list(self.urls)
        window = "" if self.window is None else f", window={self.window}"
        return f"AtariZarrSource({redact(repr(urls))}, frame_stack={self.frame_stack}{window})"
