"""The bytes of a stored object: a shard's index, a chunk's checksum, an object's key.

Zarr v3's sharding codec stores a shard as one object: its inner chunks' bytes and an
index of ``(offset, nbytes)`` per inner chunk, little-endian uint64 in chunk order (the
Morton order of an ``(n, 1, 1)`` grid is C order), followed by the index's crc32c;
an absent inner chunk has both set to ``2**64 - 1``. Each inner chunk of this
package's layout ends with its own crc32c (the ``crc32c`` codec after Blosc). Its
objects are at ``{array}/c/{row}/0/0`` (the default chunk key encoding).

This module is the one place that knows those bytes: the converter encodes indexes
with :func:`encode_index`, the engine and ``verify`` decode and check them with
:func:`parse_index` and :func:`check_crc`, and ``verify`` names objects with
:func:`object_key`.

Examples
--------
>>> raw = encode_index([100, 0, 50])  # the second chunk absent
>>> parse_index(raw, where="s.zarr", name="observation", key="observation/c/0/0/0").tolist()
[[52, 100], [18446744073709551615, 18446744073709551615], [152, 50]]
>>> object_key("observation", 3, 2)
'observation/c/3/0/0'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from atari_zarr.errors import StoreCorruptError

__all__ = [
    "MISSING",
    "check_crc",
    "crc32c",
    "crc_bytes",
    "encode_index",
    "index_problem",
    "index_size",
    "object_key",
    "parse_index",
]

#: Offset and length of an absent inner chunk in a shard index (Zarr v3).
MISSING = np.uint64(2**64 - 1)

_DEFAULT_REMEDY = "write it again, or copy the object again if it was transferred."


def crc32c(data: Any) -> int:
    """The crc32c of ``data`` (bytes, a memoryview or a uint8 array)."""
    import google_crc32c

    return int(google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data))


def crc_bytes(data: Any) -> bytes:
    """The 4 little-endian bytes that the crc32c codec appends to ``data``."""
    return crc32c(data).to_bytes(4, "little")


def check_crc(data: Any) -> bool:
    """True when ``data`` ends with the crc32c of what comes before (a chunk or an index)."""
    return len(data) >= 4 and crc32c(data[:-4]) == int.from_bytes(bytes(data[-4:]), "little")


def index_size(chunks_per_shard: int) -> int:
    """Bytes of a shard index: an offset and a length per chunk, and a crc32c."""
    return 16 * int(chunks_per_shard) + 4


def encode_index(sizes: Sequence[int]) -> bytes:
    """The index (at the start of the shard) of chunks of ``sizes`` bytes stored in order.

    A size of 0 marks an absent chunk. The chunks follow the index, so the first one
    starts at :func:`index_size`.
    """
    lengths = np.asarray(sizes, dtype="<u8")
    index = np.empty((len(lengths), 2), dtype="<u8")
    offsets = index_size(len(lengths)) + np.concatenate([[0], np.cumsum(lengths[:-1])])
    index[:, 0] = offsets.astype("<u8")
    index[:, 1] = lengths
    index[lengths == 0] = MISSING
    raw = index.tobytes()
    return raw + crc_bytes(raw)


def index_problem(raw: Any, size: int = 0) -> str | None:
    """What is wrong with shard index bytes ``raw`` (None: a valid index).

    ``size``: the bytes it must have (0: any whole number of entries and a crc32c).
    """
    if (size and len(raw) != size) or len(raw) < 4 or (len(raw) - 4) % 16:
        expected = f"a {size}-byte shard index" if size else "16 bytes per chunk and a crc32c"
        return f"is {len(raw)} bytes, expected {expected}"
    if not check_crc(raw):
        return "fails its crc32c check"
    return None


def parse_index(
    raw: Any, *, where: str, name: str, key: str, remedy: str = _DEFAULT_REMEDY, size: int = 0
) -> np.ndarray:
    """The ``(chunks, 2)`` offset/length table of a shard from its index bytes, checked.

    Parameters
    ----------
    raw : bytes-like
        The index bytes.
    where, name, key : str
        The store, the array and the shard's object, for the message.
    remedy : str
        What to do about damage, ending the message.
    size : int
        Bytes the index must have (0: any whole number of entries and a crc32c).

    Raises
    ------
    StoreCorruptError
        The index has the wrong size or fails its crc32c check.
    """
    raw = bytes(raw)
    what = index_problem(raw, size)
    if what is not None:
        raise StoreCorruptError(
            f"{where}: the index of shard {key!r} of array {name!r} {what}. "
            f"The store is damaged; {remedy}"
        )
    return np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)


def object_key(array: str, coord: int, row_dims: int) -> str:
    """Key of stored object ``coord`` along the rows of ``array`` (a shard or a chunk)."""
    return f"{array}/c/{int(coord)}" + "/0" * int(row_dims)
