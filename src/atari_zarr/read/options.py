"""How a store is read: :class:`ReadOptions`, one frozen value passed to every reader.

Every tunable of the readers lives here, and nowhere else: the bound on decoded
frame chunks, how far apart two chunks may lie to be fetched with one request, the
bound on the encoded bytes kept in memory, how many batches ``sample_iter`` draws
ahead, the deadline of a remote request and the decoding threads. A dataset takes
one as ``options=`` and hands it down (its store, its engine, its workers after
pickling); nothing reads a class attribute a user could change for every reader
at once.

Examples
--------
>>> opts = ReadOptions(frame_cache_bytes="25%", coalesce_gap=-1)
>>> opts.frame_cache_limit() > 0, opts.coalesce_gap
(True, -1)
>>> ReadOptions(prefetch=-1)
Traceback (most recent call last):
    ...
atari_zarr.errors.InvalidArgumentError: prefetch must be a non-negative integer (batches); got -1 \
for ReadOptions. Pass an int 0 or more
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.budget import Budget
from atari_zarr.resources import process_memory
from atari_zarr.storage.deadline import resolve_timeout
from atari_zarr.storage.kept import DEFAULT_KEPT_BYTES
from atari_zarr.storage.ranges import DEFAULT_COALESCE_GAP

__all__ = ["DEFAULT_FRAME_CACHE", "ReadOptions"]

#: Default bound on decoded frame chunks kept between batches: a quarter of this
#: machine's memory per dataset, shared by its DataLoader workers and its stores.
DEFAULT_FRAME_CACHE = "25%"
_WHERE = "ReadOptions"


@dataclass(frozen=True)
class ReadOptions:
    """How a store is read; frozen, so one value can be shared by every reader.

    Parameters
    ----------
    frame_cache_bytes : int or str
        Bound on the decoded frame chunks kept between batches, per process, for the
        whole dataset: bytes, or a share of this machine's memory (default ``"25%"``),
        which its DataLoader workers divide among themselves (a share of memory) and,
        in a ``MultiGameDataset``, its stores (bytes and shares alike). 0 keeps none. A
        random batch of a store that fits decodes nothing. Memory is taken as chunks
        are decoded, never beyond the bound: 128 MB first, then one more chunk's room
        per 8 chunks decoded (a fresh page costs more than a decode).
    coalesce_gap : int
        Remote stores: chunks of one shard at most this many bytes apart are
        fetched with one request (-1: each chunk by itself). The default is the
        cost model :func:`~atari_zarr.storage.ranges.gap_for` for a bucket 20 ms away
        at 50 MB/s (16 KB); ``gap_for(latency, bandwidth)`` gives it for another
        network.
    kept_bytes : int
        Remote stores: bound on the encoded bytes requests brought that are kept in
        memory (one cache per array, in its engine), so that no byte is fetched twice
        while kept; what :meth:`~atari_zarr.AtariZarrDataset.sample_iter` fetches
        ahead waits there too. In a ``MultiGameDataset`` its stores' frames share one
        such cache of this bound, whatever the number of stores.
    prefetch : int
        Batches :meth:`~atari_zarr.AtariZarrDataset.sample_iter` draws ahead by
        default (0: none).
    timeout : float, None or "default"
        Seconds each request to a remote store may take, retries included
        (``"default"``: ``$ATARI_ZARR_TIMEOUT``, else 60 s); 0 or ``None`` for no
        limit; a negative number or NaN is refused.
    threads : int, optional
        Threads of a reader's pool (default: one per core), named ``atari_zarr-read``
        and stopped by ``close()``: they decode ahead of a sequential reader, and share
        the chunks of one large batch where each chunk decodes long enough to pay for
        handing the GIL over (256 KiB decoded; an Atari chunk of 16 frames is decoded
        on the calling thread, ``docs/benchmarks/cores.md``).
    budget : Budget, optional
        Readers given one budget share one decoded-frame cache and one encoded-byte
        cache in each process (:class:`~atari_zarr.read.budget.Budget`), each bounded
        by the sum of their shares (``frame_cache_bytes``, ``kept_bytes``).
        :meth:`divided` gives a ``MultiGameDataset``'s stores one; None (the
        default): caches of the reader's own.

    Raises
    ------
    InvalidArgumentError
        A value out of range, in one line naming it.
    """

    frame_cache_bytes: int | str = DEFAULT_FRAME_CACHE
    coalesce_gap: int = DEFAULT_COALESCE_GAP
    kept_bytes: int = DEFAULT_KEPT_BYTES
    prefetch: int = 4
    timeout: float | str | None = "default"
    threads: int | None = None
    budget: Budget | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.frame_cache_limit()  # checks it
        whole_number(self.coalesce_gap, "coalesce_gap", _WHERE, low=-1, unit="bytes")
        whole_number(self.kept_bytes, "kept_bytes", _WHERE, low=0, unit="bytes")
        whole_number(self.prefetch, "prefetch", _WHERE, low=0, unit="batches")
        if self.threads is not None:
            whole_number(self.threads, "threads", _WHERE, unit="threads, or None")
        object.__setattr__(self, "timeout", resolve_timeout(self.timeout))

    def frame_cache_limit(self, sharers: int = 1) -> int:
        """``frame_cache_bytes`` in bytes for one of ``sharers`` readers (a share of
        memory is worked out on this machine and divided among them; bytes are not)."""
        value = self.frame_cache_bytes
        if isinstance(value, str):
            text = value.strip()
            try:
                share = float(text[:-1]) if text.endswith("%") else -1.0
            except ValueError:
                share = -1.0
            if not 0 <= share <= 100:
                raise InvalidArgumentError(
                    f"ReadOptions: frame_cache_bytes must be bytes or a share of memory such "
                    f"as '25%'; got {value!r}. Pass an int, or a percentage from 0% to 100%"
                )
            return int(process_memory() * share / 100) // max(1, int(sharers))
        return whole_number(value, "frame_cache_bytes", _WHERE, low=0, unit="bytes, or a share")

    def divided(self, parts: int) -> ReadOptions:
        """These options for one of ``parts`` stores sharing a dataset's memory: a share
        of memory for decoded frames, and the encoded bytes kept, divided among them.
        The stores share one decoded-frame cache and one encoded-byte cache (one
        ``budget``), whose bounds are the sums of their shares: the dataset's.

        Examples
        --------
        >>> one = ReadOptions(kept_bytes=64 << 20).divided(4)
        >>> one.frame_cache_bytes, one.kept_bytes == 16 << 20, one.budget is not None
        ('6.25%', True, True)
        >>> ReadOptions(frame_cache_bytes=1 << 30).divided(4).frame_cache_bytes == 1 << 28
        True
        """
        if parts <= 1:
            return self
        changes: dict[str, Any] = {
            "kept_bytes": self.kept_bytes // parts,
            "budget": self.budget or Budget(),
        }
        value = self.frame_cache_bytes
        if isinstance(value, str):
            self.frame_cache_limit()  # checked
            changes["frame_cache_bytes"] = f"{float(value.strip()[:-1]) / parts!r}%"
        else:
            changes["frame_cache_bytes"] = self.frame_cache_limit() // parts
        return self.replace(**changes)

    def replace(self, **changes: Any) -> ReadOptions:
        """A copy with ``changes`` (the options are frozen)."""
        return replace(self, **changes)

    @classmethod
    def of(cls, options: Any, where: str) -> ReadOptions:
        """``options`` as :class:`ReadOptions`: None gives the defaults, a mapping its
        fields (``{"prefetch": 2}``); anything else is one line naming ``where``.

        Examples
        --------
        >>> ReadOptions.of({"prefetch": 2}, "s.zarr").prefetch
        2
        >>> ReadOptions.of({"prefetc": 2}, "s.zarr")
        Traceback (most recent call last):
            ...
        atari_zarr.errors.InvalidArgumentError: options for s.zarr has no field 'prefetc'; ...
        """
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if isinstance(options, Mapping):
            unknown = sorted(set(options) - {f.name for f in fields(cls)})
            if unknown:
                raise InvalidArgumentError(
                    f"options for {where} has no field {unknown[0]!r}; expected ReadOptions "
                    f"fields {[f.name for f in fields(cls)]}. Pass ReadOptions(...) or a dict "
                    f"of those"
                )
            return cls(**options)
        raise InvalidArgumentError(
            f"options for {where} must be ReadOptions (or a dict of its fields); got "
            f"{type(options).__name__}. Pass ReadOptions(...)"
        )
