"""Which writer wrote each object of a store: one crc32c per object, recorded at completion.

Every object of a store in this layout ends with a crc32c that depends on what is in it
(a frame shard's index, a per-step chunk's compressed bytes). When a writer marks a
store complete (:func:`atari_zarr.layout.mark_complete`), it records that crc32c of every
object of every array under :data:`FINGERPRINTS_KEY`, so an object copied in from another
store or conversion is named by the readers at its first touch and by ``verify``,
although every byte of it is valid. ``docs/format.md`` defines the attribute.

Examples
--------
>>> import numpy as np, zarr
>>> from zarr.codecs import BloscCodec, Crc32cCodec
>>> a = zarr.create_array({}, shape=(100,), chunks=(40,), dtype="int16",
...                       compressors=[BloscCodec(cname="zstd"), Crc32cCodec()])
>>> a[:] = np.arange(100)
>>> crcs = compute(a)
>>> len(crcs), bool((crcs != 0).all())
(3, True)
>>> a.update_attributes({FINGERPRINTS_KEY: encode(crcs)})  # doctest: +ELLIPSIS
<Array ...>
>>> bool((recorded(a) == crcs).all()), mismatches(a)
(True, [])
>>> a[:40] = 7  # another writer's object
>>> mismatches(a)  # doctest: +ELLIPSIS
[(0, 'c/0', ..., ...)]
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.shard_format import index_size

__all__ = [
    "FINGERPRINTS_KEY",
    "compute",
    "encode",
    "foreign_object_message",
    "mismatches",
    "object_crc",
    "record",
    "recorded",
    "recorded_digest",
]

#: Attribute of an array holding the crc32c of each of its objects.
FINGERPRINTS_KEY = "atari_zarr_objects"
# Objects asked for at once when computing fingerprints over a network.
_CONCURRENCY = 64


def _layout(array: zarr.Array) -> tuple[int, int, Any] | None:
    """``(objects, rows per object, byte request of the crc32c)``, or None: no fingerprints."""
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest

    try:
        chain = row_chunks(array)
    except UnsupportedChunks:
        return None
    n = int(array.shape[0])
    if chain.shard_rows is not None:
        size = index_size(chain.shard_rows // chain.chunk_rows)
        where: Any = (
            RangeByteRequest(size - 4, size) if chain.index_at_start else SuffixByteRequest(4)
        )
        rows = chain.shard_rows
    elif chain.checksum:
        where, rows = SuffixByteRequest(4), chain.chunk_rows
    else:  # a chunk without a crc32c has nothing cheap to compare
        return None
    return -(-n // rows), rows, where


def _key(array: zarr.Array, coord: int) -> str:
    key = array.metadata.encode_chunk_key((coord, *([0] * (array.ndim - 1))))  # type: ignore[union-attr]
    path = array.store_path.path
    return f"{path}/{key}" if path else key


def object_crc(raw: Any) -> int:
    """The fingerprint in ``raw``, the last 4 bytes of a shard index or of a chunk object."""
    return int(np.frombuffer(bytes(raw[-4:]), dtype="<u4")[0])


def compute(array: zarr.Array) -> np.ndarray:
    """The crc32c of every object of ``array`` as stored now (0 where none is stored).

    One small read per object (4 bytes), concurrently.
    """
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    layout = _layout(array)
    if layout is None:
        return np.zeros(0, dtype="<u4")
    count, _, where = layout
    store = array.store_path.store
    proto = default_buffer_prototype()
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def one(coord: int) -> int:
        async with gate:
            buf = await store.get(_key(array, coord), prototype=proto, byte_range=where)
        if buf is None or len(buf) < 4:
            return 0
        return object_crc(buf.to_bytes())

    async def all_of() -> list[int]:
        return list(await asyncio.gather(*(one(c) for c in range(count))))

    return np.asarray(sync(all_of()), dtype="<u4")


def encode(crcs: np.ndarray) -> dict[str, str]:
    """The attribute value recording ``crcs``."""
    raw = np.asarray(crcs, dtype="<u4").tobytes()
    return {"crc32c": base64.b64encode(raw).decode("ascii")}


def recorded(array: zarr.Array) -> np.ndarray | None:
    """The fingerprints recorded for ``array``, or None (none recorded, or unreadable)."""
    value = array.attrs.get(FINGERPRINTS_KEY)
    if not isinstance(value, dict) or not isinstance(value.get("crc32c"), str):
        return None
    try:
        raw = base64.b64decode(value["crc32c"], validate=True)
    except ValueError:
        return None
    if len(raw) % 4:
        return None
    return np.frombuffer(raw, dtype="<u4")


def record(group: zarr.Group) -> str:
    """Record the fingerprints of every array of ``group`` (and of its subgroups).

    Returns
    -------
    str
        The SHA-256 of all of them, array by array in name order (each array's path
        within ``group``, its object count, then its crc32c): what the store's
        ``objects_digest`` attribute holds, so that its content id
        (:func:`atari_zarr.catalog.content_id`) changes with any of them, at no cost to
        a reader. A frame shard's crc32c is its index's (where and how long each of
        its chunks is), so frames that encode to the very same sizes keep it.
    """
    digest = hashlib.sha256()
    for name, array in _arrays(group):
        if _layout(array) is not None:
            crcs = compute(array)
            array.update_attributes({FINGERPRINTS_KEY: encode(crcs)})
            _digest(digest, name, crcs)
    return digest.hexdigest()


def recorded_digest(group: zarr.Group) -> str | None:
    """The digest :func:`record` returned, from the fingerprints recorded in the arrays'
    attributes (no object read), or None where an array has none recorded."""
    digest = hashlib.sha256()
    for name, array in _arrays(group):
        if _layout(array) is not None:
            crcs = recorded(array)
            if crcs is None:
                return None
            _digest(digest, name, crcs)
    return digest.hexdigest()


def _arrays(group: zarr.Group, prefix: str = "") -> Iterator[tuple[str, zarr.Array]]:
    """Every array under ``group`` in name order, with its path within ``group`` (the
    same wherever the store is opened from)."""
    for name, array in sorted(group.arrays(), key=lambda a: a[0]):
        yield f"{prefix}{name}", array
    for name, sub in sorted(group.groups(), key=lambda g: g[0]):
        yield from _arrays(sub, f"{prefix}{name}/")


def _digest(digest: Any, name: str, crcs: np.ndarray) -> None:
    digest.update(f"{name}\0{len(crcs)}\0".encode())
    digest.update(np.asarray(crcs, dtype="<u4").tobytes())


def mismatches(array: zarr.Array) -> list[tuple[int, str, int, int]]:
    """Objects whose crc32c is not the one recorded: ``(coord, key, recorded, found)``."""
    want = recorded(array)
    if want is None:
        return []
    found = compute(array)
    out = []
    for coord in np.flatnonzero(want[: len(found)] != found[: len(want)]).tolist():
        if want[coord] != 0 and found[coord] != 0:  # an absent object is another check's
            out.append((coord, _key(array, coord), int(want[coord]), int(found[coord])))
    return out


def foreign_object_message(where: str, name: str, key: str, want: int, found: int) -> str:
    """One line: the object ``key`` of ``name`` was written by another writer."""
    return (
        f"{where}: object {key!r} of array {name!r} is not the one this store's writer wrote "
        f"(crc32c {found:08x}; the store records {want:08x}): it was changed, or copied in "
        f"from another store or conversion, since the store was completed. Copy the store "
        f"again from where it was made, or convert again"
    )
