"""Write whole frame shards without zarr's per-chunk machinery, byte for byte as zarr does.

Writing a 4096-frame shard through ``zarr.Array.__setitem__`` costs about twice
the Blosc time itself (an asyncio task, a thread hop and several buffer copies per
16-frame chunk), which made it the bottleneck of conversion. A *full* shard is
simple to encode directly with the codecs that :mod:`atari_zarr.layout` defines:

* each inner chunk: Blosc (the layout's parameters) then crc32c, appended as 4
  little-endian bytes;
* the index (index location ``start``), as :func:`atari_zarr.shard_format.encode_index`
  writes it.

:func:`shard_encoder` returns ``None`` unless the array's metadata is exactly that
(:func:`atari_zarr.codec_chain.row_chunks`, the check the chunk reader uses too,
plus: sharded, index at start, crc32c after Blosc, uint8, fill value 0), so any
layout change falls back to zarr. The tests compare this encoder with zarr's on
real frames.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import zarr

from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.shard_format import crc_bytes, encode_index

__all__ = ["shard_encoder", "write_shard"]

# numcodecs.blosc.use_threads is global: encoders running in several threads at once
# switch it off together, and the last one out puts back what was there before.
_BLOSC_SWITCH = threading.Lock()
_encoders = 0
_saved_use_threads: Any = None


@contextmanager
def _single_threaded_blosc() -> Iterator[None]:
    global _encoders, _saved_use_threads
    import numcodecs.blosc

    with _BLOSC_SWITCH:
        if _encoders == 0:
            _saved_use_threads = numcodecs.blosc.use_threads
            numcodecs.blosc.use_threads = False
        _encoders += 1
    try:
        yield
    finally:
        with _BLOSC_SWITCH:
            _encoders -= 1
            if _encoders == 0:
                numcodecs.blosc.use_threads = _saved_use_threads


def shard_encoder(array: zarr.Array) -> Callable[[np.ndarray], bytes] | None:
    """Return ``encode(rows) -> shard bytes`` for full shards of ``array``, or None.

    Examples
    --------
    >>> import numpy as np, zarr
    >>> from atari_zarr.layout import OBSERVATION, create_store
    >>> group = create_store(zarr.storage.MemoryStore(), 8192, {})
    >>> arr = group[OBSERVATION]
    >>> frames = np.arange(4096 * 84 * 84, dtype=np.uint64).astype(np.uint8).reshape(4096, 84, 84)
    >>> arr[:4096] = frames
    >>> encode = shard_encoder(arr)
    >>> from zarr.core.buffer import default_buffer_prototype
    >>> from zarr.core.sync import sync
    >>> stored = sync(arr.store.get(f"{OBSERVATION}/c/0/0/0", default_buffer_prototype()))
    >>> encode(frames) == stored.to_bytes()
    True
    """
    from numcodecs import Blosc

    try:
        chain = row_chunks(array)
    except UnsupportedChunks:
        return None
    if (
        chain.shard_rows is None
        or not chain.index_at_start
        or not chain.checksum
        or array.dtype != np.uint8
        or array.fill_value != 0
    ):
        return None
    b = chain.compressor
    shuffle_name = str(getattr(b.shuffle, "value", b.shuffle))
    shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[shuffle_name]
    blosc = Blosc.from_config(
        {
            "cname": b.cname.name if hasattr(b.cname, "name") else str(b.cname),
            "clevel": b.clevel,
            "shuffle": shuffle,
            "blocksize": b.blocksize,
            "typesize": b.typesize,
        }
    )
    chunk_rows = chain.chunk_rows
    shard_rows = chain.shard_rows
    n_chunks = shard_rows // chunk_rows

    def encode(rows: np.ndarray) -> bytes:
        if rows.shape[0] != shard_rows or rows.dtype != np.uint8:
            raise ValueError(f"expected a full shard of {shard_rows} uint8 rows, got {rows.shape}")
        rows = np.ascontiguousarray(rows)
        chunks = []
        # One Blosc thread, as zarr does (it encodes off the main thread): each worker
        # then uses one core, and Blosc's thread pool would only contend with the
        # other workers (measured slower on 2 cores). Output bytes do not depend on it.
        with _single_threaded_blosc():
            for c in range(n_chunks):
                data = blosc.encode(rows[c * chunk_rows : (c + 1) * chunk_rows].reshape(-1))
                chunks.append(data + crc_bytes(data))
        return b"".join([encode_index([len(c) for c in chunks]), *chunks])

    return encode


def write_shard(array: zarr.Array, shard: int, data: bytes) -> None:
    """Store the encoded shard number ``shard`` (along the first axis) of ``array``."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    coords = (shard,) + (0,) * (array.ndim - 1)
    key = f"{array.path}/{array.metadata.encode_chunk_key(coords)}"  # type: ignore[union-attr]
    sync(array.store.set(key, default_buffer_prototype().buffer.from_bytes(data)))
