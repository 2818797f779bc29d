"""The one codec-chain check: the chunk reader and the shard encoder recognise the same layouts."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec

from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.conversion.shards import shard_encoder
from atari_zarr.layout import ARRAYS, OBSERVATION, OPTIONAL_ARRAYS, create_array
from atari_zarr.read.chunks import ChunkReader

FRAME_CODECS = ARRAYS[OBSERVATION].compressors()


def test_every_layout_array_takes_the_direct_paths():
    group = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    for name, spec in {**ARRAYS, **OPTIONAL_ARRAYS}.items():
        array = create_array(group, name, 2 * (spec.shard_rows or spec.chunk_rows))
        chain = row_chunks(array)
        assert (chain.chunk_rows, chain.shard_rows) == (spec.chunk_rows, spec.shard_rows), name
        assert chain.checksum and chain.index_at_start, name
        assert ChunkReader(array, where="memory").fast, name
        # only the frame array is written shard by shard without zarr
        assert (shard_encoder(array) is not None) == (name == OBSERVATION), name


def _made(kind: str) -> zarr.Array:
    common = {"dtype": "uint8", "fill_value": 0}
    shape, rows = (64, 6, 5), (6, 5)
    if kind == "gzip":
        return zarr.create_array(
            {},
            shape=shape,
            chunks=(8, *rows),
            shards=(32, *rows),
            compressors=[GzipCodec()],
            **common,
        )
    if kind == "chunks split rows":
        return zarr.create_array(
            {}, shape=shape, chunks=(8, 3, 5), compressors=FRAME_CODECS, **common
        )
    if kind == "no compressor":
        return zarr.create_array({}, shape=shape, chunks=(8, *rows), compressors=None, **common)
    if kind == "two compressors":
        return zarr.create_array(
            {},
            shape=shape,
            chunks=(8, *rows),
            compressors=[BloscCodec(cname="zstd"), BloscCodec(cname="lz4"), Crc32cCodec()],
            **common,
        )
    if kind == "zarr v2":
        return zarr.create_array({}, shape=shape, chunks=(8, *rows), zarr_format=2, **common)
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["gzip", "chunks split rows", "no compressor", "two compressors", "zarr v2"]
)
def test_layouts_outside_the_check_fall_back_in_both_paths(kind):
    array = _made(kind)
    with pytest.raises(UnsupportedChunks):
        row_chunks(array)
    assert not ChunkReader(array, where="memory").fast
    assert shard_encoder(array) is None


def test_encoder_needs_more_than_the_reader():
    """Readable directly, but not a full-shard frame layout: zarr writes these."""
    rows = (6, 5)
    unsharded = zarr.create_array(
        {}, shape=(64, *rows), chunks=(8, *rows), dtype="uint8", compressors=FRAME_CODECS
    )
    index_at_end = zarr.create_array(
        {},
        shape=(64, *rows),
        chunks=(8, *rows),
        dtype="uint8",
        compressors=FRAME_CODECS,
        shards={"shape": (32, *rows), "index_location": "end"},
    )
    wide = zarr.create_array(
        {},
        shape=(64, *rows),
        chunks=(8, *rows),
        shards=(32, *rows),
        dtype="int16",
        compressors=FRAME_CODECS,
    )
    for array in (unsharded, index_at_end, wide):
        assert ChunkReader(array, where="memory").fast
        assert shard_encoder(array) is None
    assert row_chunks(index_at_end).index_at_start is False


def test_encoder_writes_what_zarr_writes():
    group = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    array = create_array(group, OBSERVATION, 4096)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 4, size=(4096, 84, 84), dtype=np.uint8)
    array[:] = frames
    encode = shard_encoder(array)
    assert encode is not None
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    stored = sync(array.store.get(f"{OBSERVATION}/c/0/0/0", default_buffer_prototype()))
    assert encode(frames) == stored.to_bytes()
