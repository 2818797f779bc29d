"""Byte ranges of stored objects, and which of them to fetch together. Pure: no I/O.

Every reader of this package asks for the bytes of chunks as :class:`ByteRange`
values: a whole object, a ``[start, stop)`` range, or the last ``n`` bytes of an
object (a shard index stored at its end). :func:`coalesce_ranges` merges ranges of
one object that lie close together into one request, because over a network a
request costs far more than the bytes between two chunks; the engine
(:mod:`atari_zarr.read.engine`) fetches what it returns.

Examples
--------
>>> ByteRange("s/0", 0, 100), ByteRange.whole("s/0"), ByteRange.suffix("s/0", 20)
(ByteRange(key='s/0', start=0, stop=100), ByteRange(key='s/0', start=None, stop=None), \
ByteRange(key='s/0', start=-20, stop=None))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["DEFAULT_COALESCE_GAP", "MAX_COALESCED", "ByteRange", "coalesce_ranges"]

#: Ranges of one object at most this many bytes apart are fetched with one request.
DEFAULT_COALESCE_GAP = 64 << 10
#: A merged request never grows beyond this many bytes (unless one range is larger).
MAX_COALESCED = 16 << 20


class ByteRange(NamedTuple):
    """Bytes of one stored object.

    ``start`` and ``stop`` as in a slice: ``(key, None, None)`` is the whole
    object, ``(key, a, b)`` bytes ``a .. b - 1``, and ``(key, -n, None)`` the last
    ``n`` bytes.
    """

    key: str
    start: int | None = None
    stop: int | None = None

    @classmethod
    def whole(cls, key: str) -> ByteRange:
        """The whole object ``key``."""
        return cls(key, None, None)

    @classmethod
    def suffix(cls, key: str, n: int) -> ByteRange:
        """The last ``n`` bytes of ``key``."""
        return cls(key, -int(n), None)

    @property
    def bounded(self) -> bool:
        """True for a ``[start, stop)`` range (one that can be merged with others)."""
        return self.start is not None and self.stop is not None and self.start >= 0


def coalesce_ranges(
    requests: Sequence[tuple[str, int, int]], gap: int, max_bytes: int = MAX_COALESCED
) -> tuple[list[ByteRange], list[tuple[int, int, int]]]:
    """Merge byte ranges of one object that are at most ``gap`` bytes apart.

    Parameters
    ----------
    requests : sequence of (key, start, stop)
        Bounded byte ranges, in any order; overlapping and repeated ranges are allowed.
    gap : int
        Largest number of unrequested bytes a merged range may span between two
        requested ones (0: merge only touching or overlapping ranges; negative:
        merge nothing).
    max_bytes : int
        A merged range stops growing at this size (a single larger range is kept).

    Returns
    -------
    merged : list of ByteRange
        The ranges to fetch, sorted by key and offset.
    parts : list of (merged index, offset, length)
        Where each of ``requests`` lies in the merged ranges, in the order given.

    Examples
    --------
    >>> merged, parts = coalesce_ranges(
    ...     [("s/0", 100, 200), ("s/0", 0, 90), ("s/1", 0, 10), ("s/0", 5000, 5100)], gap=64)
    >>> [tuple(m) for m in merged]
    [('s/0', 0, 200), ('s/0', 5000, 5100), ('s/1', 0, 10)]
    >>> parts
    [(0, 100, 100), (0, 0, 90), (2, 0, 10), (1, 0, 100)]
    """
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], requests[i][1]))
    merged: list[ByteRange] = []
    parts: list[tuple[int, int, int]] = [(0, 0, 0)] * len(requests)
    for i in order:
        key, start, stop = requests[i]
        if merged:
            mkey, mstart, mstop = merged[-1]
            assert mstart is not None and mstop is not None
            if (
                gap >= 0
                and mkey == key
                and start - mstop <= gap
                and max(stop, mstop) - mstart <= max_bytes
            ):
                merged[-1] = ByteRange(mkey, mstart, max(stop, mstop))
                parts[i] = (len(merged) - 1, start - mstart, stop - start)
                continue
        merged.append(ByteRange(key, start, stop))
        parts[i] = (len(merged) - 1, 0, stop - start)
    return merged, parts
