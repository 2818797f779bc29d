"""Byte ranges of stored objects, and which of them to fetch together. Pure: no I/O.

Every reader of this package asks for the bytes of chunks as :class:`ByteRange`
values: a whole object, a ``[start, stop)`` range, or the last ``n`` bytes of an
object (a shard index stored at its end). :func:`coalesce_ranges` merges ranges of
one object that lie close together into one request, because over a network a
request costs far more than the bytes between two chunks; the engine
(:mod:`atari_zarr.storage.engine`) fetches what it returns and keeps what came
(:mod:`atari_zarr.storage.kept`). How far apart two ranges may lie is a cost model,
:func:`gap_for`: a gap is worth bridging when its bytes take less time to transfer than
a request costs.

Examples
--------
>>> ByteRange("s/0", 0, 100), ByteRange.whole("s/0"), ByteRange.suffix("s/0", 20)
(ByteRange(key='s/0', start=0, stop=100), ByteRange(key='s/0', start=None, stop=None), \
ByteRange(key='s/0', start=-20, stop=None))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

__all__ = [
    "DEFAULT_BANDWIDTH",
    "DEFAULT_COALESCE_GAP",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_LATENCY",
    "DEFAULT_OVERHEAD",
    "MAX_COALESCED",
    "ByteRange",
    "coalesce_ranges",
    "gap_for",
]

#: A merged request never grows beyond this many bytes (unless one range is larger).
MAX_COALESCED = 16 << 20
#: Seconds a bucket takes to answer a request (its first byte), for :func:`gap_for`.
DEFAULT_LATENCY = 0.02
#: Bytes per second one connection carries, for :func:`gap_for`.
DEFAULT_BANDWIDTH = 50e6
#: Requests one round has in flight at once, for :func:`gap_for`.
DEFAULT_CONCURRENCY = 64
#: Seconds of client and server work per request, whatever the latency, for :func:`gap_for`.
DEFAULT_OVERHEAD = 0.0003


def gap_for(
    latency: float = DEFAULT_LATENCY,
    bandwidth: float = DEFAULT_BANDWIDTH,
    concurrency: int = DEFAULT_CONCURRENCY,
    overhead: float = DEFAULT_OVERHEAD,
) -> int:
    """The largest gap worth bridging: the bytes a connection carries in the time a request costs.

    A batch's requests go out as one round, ``concurrency`` at a time, so a request
    costs the round ``latency / concurrency`` seconds, and never less than its
    ``overhead`` (the client's and the server's work). Fetching ``g`` unrequested
    bytes instead costs ``g / bandwidth`` seconds; bridging pays while ``g`` is
    smaller than the request's cost times ``bandwidth``. The bytes bridged are kept
    (:mod:`atari_zarr.storage.kept`), so a later read does not fetch them again.

    Parameters
    ----------
    latency : float
        Seconds to a request's first byte.
    bandwidth : float
        Bytes per second of one connection.
    concurrency : int
        Requests in flight at once.
    overhead : float
        Seconds of work per request on the client and the server.

    Returns
    -------
    int
        The gap in bytes, at most :data:`MAX_COALESCED`.

    Examples
    --------
    >>> gap_for()  # a bucket 20 ms away, 50 MB/s, 64 requests at once: the default
    15625
    >>> gap_for(latency=0.1, concurrency=8)  # far away, few connections
    625000
    """
    cost = max(float(latency) / max(int(concurrency), 1), float(overhead))
    return int(min(max(cost * float(bandwidth), 0.0), MAX_COALESCED))


#: Ranges of one object at most this many bytes apart are fetched with one request.
DEFAULT_COALESCE_GAP = gap_for()


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
    requests: Sequence[tuple[str, int, int]],
    gap: int,
    max_bytes: int = MAX_COALESCED,
    held: Callable[[str, int, int], bool] | None = None,
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
    held : callable, optional
        ``held(key, start, stop)`` is True when some of those bytes are already at
        hand; a merged range never bridges them.

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
    >>> merged, _ = coalesce_ranges([("s/0", 0, 90), ("s/0", 100, 200)], gap=64,
    ...                             held=lambda key, a, b: a <= 95 < b)  # bytes 95.. at hand
    >>> [tuple(m) for m in merged]
    [('s/0', 0, 90), ('s/0', 100, 200)]
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
                and (held is None or start <= mstop or not held(key, mstop, start))
            ):
                merged[-1] = ByteRange(mkey, mstart, max(stop, mstop))
                parts[i] = (len(merged) - 1, start - mstart, stop - start)
                continue
        merged.append(ByteRange(key, start, stop))
        parts[i] = (len(merged) - 1, 0, stop - start)
    return merged, parts
