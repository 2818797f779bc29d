"""What the readers of one dataset may hold in a process: :class:`Budget`, passed down.

A dataset's stores share one budget in each process (a store read by itself has its
own). It owns what they hold between batches:

* **decoded frames**: one :class:`~atari_zarr.read.chunk_cache.ChunkCache` per chunk
  shape, bounded by the sum of its readers' shares of ``frame_cache_bytes``; a stream
  that keeps its units decoded (``keep_units=True``) draws on the same bound
  (:meth:`Budget.frame_bytes`);
* **encoded bytes kept**: one :class:`~atari_zarr.storage.kept.KeptBytes`, bounded by
  the sum of the stores' ``kept_bytes``;
* **open files**: the memory maps of local shards, bounded for the whole process by
  :func:`~atari_zarr.storage.fetch.map_limit` (a share of ``RLIMIT_NOFILE``: on
  Python 3.11 each map holds a descriptor), whatever the number of stores;
* **where chunks lie**: one :class:`~atari_zarr.storage.chunk_tables.ChunkTables` for
  the local stores' shard indexes and maps, so a batch locates the chunks of every
  store it touches at once. What it holds stays true in a forked child, which keeps it.

It travels in :class:`~atari_zarr.read.options.ReadOptions` (``budget=``), set by
:meth:`ReadOptions.divided <atari_zarr.read.options.ReadOptions.divided>` for a
mixture, so it is passed explicitly from the dataset down to every reader, and pickled
with the dataset it starts empty in the process that unpickles it (one pickle: one
budget for all of its stores). A forked child starts with an empty budget too
(:func:`~atari_zarr.forks.after_fork`): the parent's share is not the child's.

Examples
--------
>>> budget = Budget()
>>> cache = budget.frame_cache((16, 84, 84), np.dtype("uint8"))
>>> budget.frame_cache((16, 84, 84), np.dtype("uint8")) is cache, budget.kept() is budget.kept()
(True, True)
>>> import pickle
>>> pickle.loads(pickle.dumps(budget)).frame_cache((16, 84, 84), np.dtype("uint8")) is cache
False
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from atari_zarr.forks import after_fork
from atari_zarr.read.chunk_cache import ChunkCache
from atari_zarr.storage.chunk_tables import ChunkTables
from atari_zarr.storage.kept import KeptBytes

__all__ = ["Budget"]


class Budget:
    """The decoded frames and encoded bytes the stores of one dataset share in a process."""

    def __init__(self) -> None:
        self._renew()
        self._tables = ChunkTables()
        after_fork(self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()
        self._caches: dict[tuple[Any, ...], ChunkCache] = {}
        self._kept: KeptBytes | None = None

    def frame_cache(self, chunk_shape: Sequence[int], dtype: np.dtype) -> ChunkCache:
        """The decoded-chunk cache of chunks of ``chunk_shape`` and ``dtype``."""
        key = (tuple(int(x) for x in chunk_shape), np.dtype(dtype).str)
        with self._lock:
            cache = self._caches.get(key)
            if cache is None:
                cache = self._caches[key] = ChunkCache(key[0], np.dtype(dtype))
            return cache

    def kept(self) -> KeptBytes:
        """The encoded-byte cache; each store joins it (:meth:`KeptBytes.join`)."""
        with self._lock:
            if self._kept is None:
                self._kept = KeptBytes(0)
            return self._kept

    def tables(self) -> ChunkTables:
        """Where the chunks of the local stores lie; each store's arrays join it."""
        return self._tables

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Budget(caches={len(self._caches)})"
