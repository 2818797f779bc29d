"""The one check of an array's codec chain, for code that handles chunk bytes itself.

Two places bypass zarr-python's per-chunk machinery for speed: the chunk reader
(:mod:`atari_zarr.read.chunks`) decodes chunk bytes straight into its buffers, and
the shard encoder (:mod:`atari_zarr.conversion.shards`) writes whole frame shards.
Both must recognise exactly the same layouts, and fall back to zarr for anything
else; :func:`row_chunks` is that recognition. It is generic (any Zarr v3 array, no
Atari names), so the bottom floor holds it and both paths import it.

Recognised: a Zarr v3 array with a regular chunk grid whose chunks (and shards)
span whole rows (every axis but the first whole), codecs ``bytes`` (little endian)
-> ``blosc`` -> optionally ``crc32c``, either directly or inside a
``sharding_indexed`` codec whose index codecs are ``bytes`` (little endian) ->
``crc32c``, and a fixed-size, non-object dtype on a little-endian machine.

Examples
--------
>>> import zarr
>>> from zarr.codecs import BloscCodec, Crc32cCodec
>>> a = zarr.create_array({}, shape=(100, 3), chunks=(8, 3), shards=(32, 3), dtype="int16",
...                       compressors=[BloscCodec(cname="zstd"), Crc32cCodec()])
>>> chunks = row_chunks(a)
>>> chunks.chunk_rows, chunks.shard_rows, chunks.checksum
(8, 32, True)
>>> row_chunks(zarr.create_array({}, shape=(10, 4), chunks=(5, 2), dtype="int8"))
Traceback (most recent call last):
    ...
atari_zarr.codec_chain.UnsupportedChunks: chunks split rows
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec
from zarr.core.metadata.v3 import ArrayV3Metadata

__all__ = ["RowChunks", "UnsupportedChunks", "row_chunks"]


class UnsupportedChunks(Exception):
    """The array's layout is outside what the direct paths handle: use zarr-python.

    Never reaches a caller of the package: the reader and the encoder catch it and
    fall back to zarr, which reads and writes every layout correctly, only slower.
    The message is the reason, for the log.
    """


@dataclass(frozen=True)
class RowChunks:
    """How an array's rows are cut into chunks and how each chunk is encoded.

    Attributes
    ----------
    chunk_rows : int
        Rows per chunk (the unit of encoding).
    shard_rows : int or None
        Rows per shard (the unit of storage), or None when the array is not sharded.
    index_at_start : bool
        The shard index is at the start of each shard object (always True unsharded).
    compressor : zarr.codecs.BloscCodec
        The Blosc codec of every chunk.
    checksum : bool
        Every chunk ends with its crc32c (4 little-endian bytes).
    """

    chunk_rows: int
    shard_rows: int | None
    index_at_start: bool
    compressor: BloscCodec
    checksum: bool


def _endian(codec: Any) -> str | None:
    endian = getattr(codec, "endian", None)
    return getattr(endian, "value", endian)


def row_chunks(array: zarr.Array | ArrayV3Metadata) -> RowChunks:
    """The chunking and codec chain of ``array``, if the direct paths handle it.

    Parameters
    ----------
    array : zarr.Array or ArrayV3Metadata
        Any array, or its metadata (read without opening the array).

    Returns
    -------
    RowChunks

    Raises
    ------
    UnsupportedChunks
        Anything else (the message says what); callers then use zarr-python.
    """
    meta = getattr(array, "metadata", array)
    if not isinstance(meta, ArrayV3Metadata):
        raise UnsupportedChunks("not Zarr v3")
    if len(meta.shape) < 1:
        raise UnsupportedChunks("0-d array")
    grid = getattr(meta.chunk_grid, "chunk_shape", None)
    if grid is None:
        raise UnsupportedChunks("irregular chunk grid")
    dtype = np.dtype(meta.dtype.to_native_dtype())
    if dtype.hasobject:
        raise UnsupportedChunks("object dtype")
    if dtype.itemsize > 1 and sys.byteorder != "little":
        raise UnsupportedChunks("big-endian machine")
    row_shape = tuple(meta.shape[1:])
    codecs = tuple(meta.codecs)  # type: ignore[union-attr]
    shard_rows: int | None = None
    index_at_start = True
    if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec):
        shard = codecs[0]
        index_codecs = tuple(shard.index_codecs)
        if not (
            len(index_codecs) == 2
            and isinstance(index_codecs[0], BytesCodec)
            and _endian(index_codecs[0]) in (None, "little")
            and isinstance(index_codecs[1], Crc32cCodec)
        ):
            raise UnsupportedChunks(f"shard index codecs {index_codecs}")
        if tuple(grid[1:]) != row_shape:
            raise UnsupportedChunks("shards split rows")
        location = shard.index_location
        index_at_start = str(getattr(location, "value", location)) == "start"
        shard_rows = int(grid[0])
        inner_shape = tuple(shard.chunk_shape)
        codecs = tuple(shard.codecs)
    else:
        inner_shape = tuple(grid)
    if tuple(inner_shape[1:]) != row_shape:
        raise UnsupportedChunks("chunks split rows")
    if not codecs or not isinstance(codecs[0], BytesCodec):
        raise UnsupportedChunks(f"codecs {codecs}")
    if dtype.itemsize > 1 and _endian(codecs[0]) not in (None, "little"):
        raise UnsupportedChunks("big-endian chunks")
    rest = list(codecs[1:])
    checksum = bool(rest) and isinstance(rest[-1], Crc32cCodec)
    if checksum:
        rest.pop()
    if len(rest) != 1 or not isinstance(rest[0], BloscCodec):
        raise UnsupportedChunks(f"codecs {codecs}")
    return RowChunks(
        chunk_rows=int(inner_shape[0]),
        shard_rows=shard_rows,
        index_at_start=index_at_start,
        compressor=rest[0],
        checksum=checksum,
    )
