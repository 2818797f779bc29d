"""Many stored chunks checked and decoded in one call, off the GIL.

A chunk of Atari frames decodes in about 8 µs. Called one at a time, even with the GIL
released for each call, two threads decode no more than one: each call hands the GIL
over twice, and the handover costs as much as the call (``docs/benchmarks/cores.md``).
This module's loop takes a whole list of chunks (addresses, lengths, destinations) and,
for each, checks its crc32c and Blosc header and decodes it with c-blosc2, all in one
ctypes call: the GIL is released once per list, so two threads, each with half of a
batch's chunks, decode on two cores at once.

The loop is a few lines of C (``_chunk_loop.c``), built when the package is installed
and loaded with :mod:`ctypes`; it calls c-blosc2's ``blosc2_decompress_ctx`` (the
library python-blosc2 ships, :class:`~atari_zarr.storage.blosc.LibBlosc2`) and
google-crc32c's ``crc32c_value`` through function pointers. Where the loop was not
built (no compiler at install), or a library or the self-check at first use fails,
:func:`chunk_loop` is None and chunks decode one call each, as before.

A chunk the loop does not decode is reported, not judged: its status is not
:data:`DECODED`, and the caller reads it again the careful way, which names what is
wrong (:meth:`~atari_zarr.storage.engine.ChunkEngine.decode`).

Examples
--------
>>> import numpy as np, google_crc32c
>>> from numcodecs import Blosc
>>> loop = chunk_loop()
>>> want = np.arange(4096, dtype=np.uint8)
>>> body = Blosc(cname="zstd").encode(want)
>>> src = np.frombuffer(body + google_crc32c.value(body).to_bytes(4, "little"), np.uint8)
>>> out = np.zeros((2, 4096), dtype=np.uint8)
>>> status = loop.run(
...     np.array([src.ctypes.data] * 2, dtype=np.uint64), np.array([src.size, 9]),
...     np.array([out[0].ctypes.data, out[1].ctypes.data], dtype=np.uint64), 4096,
...     checksum=True)
>>> status.tolist(), bool((out[0] == want).all())
([0, 1], True)
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import itertools
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from atari_zarr.storage.blosc import LibBlosc2, libblosc2

__all__ = ["DECODED", "ChunkLoop", "Destinations", "RowCopies", "built_library", "chunk_loop"]

log = logging.getLogger("atari_zarr")

#: A chunk's status when the loop decoded it; any other status sends it the careful way.
DECODED = 0
_MODULE = "atari_zarr.storage._chunk_loop"


class ChunkLoop:
    """The compiled loop, bound to c-blosc2 and crc32c.

    Parameters
    ----------
    loop : ctypes.CDLL
        The loaded ``_chunk_loop`` library.
    blosc : LibBlosc2
        c-blosc2, for its decoding call and this thread's context.
    crc : int
        Address of google-crc32c's ``crc32c_value``.
    """

    def __init__(self, loop: ctypes.CDLL, blosc: LibBlosc2, crc: int) -> None:
        fn = loop.atari_zarr_decode_chunks
        ptr = ctypes.c_void_p
        fn.argtypes = [ptr, ptr, ptr, ctypes.c_int64, ptr, ptr, ptr, ctypes.c_int32, ptr]
        fn.restype = ctypes.c_int64
        self._fn, self._blosc, self._crc = fn, blosc, crc
        self._decompress = blosc.decompress_ctx
        rows = getattr(loop, "atari_zarr_decode_rows", None)  # None: a loop built before it
        if rows is not None:
            rows.argtypes = [ptr, ptr, ptr, ctypes.c_int64, ptr, ptr, ctypes.c_int32]
            rows.argtypes += [ptr, ptr, ptr, ptr, ptr, ctypes.c_int64, ptr]
            rows.restype = ctypes.c_int64
        self._rows_fn = rows

    def run(
        self,
        src: np.ndarray,
        srclen: np.ndarray,
        dest: np.ndarray,
        destsize: int,
        *,
        checksum: bool,
    ) -> np.ndarray:
        """Check and decode chunk ``i`` (``srclen[i]`` bytes at address ``src[i]``) into
        the ``destsize`` bytes at address ``dest[i]``, for every ``i``, in one call.

        The caller keeps every source and destination alive (and the destinations
        writable) until the call returns. With ``checksum`` each chunk ends in its
        crc32c, which is checked first (zarr's ``crc32c`` codec after Blosc).

        Returns
        -------
        numpy.ndarray
            ``int8`` status of each chunk, :data:`DECODED` where it decoded.
        """
        n = len(src)
        src = np.ascontiguousarray(src, dtype=np.uint64)
        srclen = np.ascontiguousarray(srclen, dtype=np.int64)
        dest = np.ascontiguousarray(dest, dtype=np.uint64)
        if len(srclen) != n or len(dest) != n:
            raise ValueError(f"{n} sources, {len(srclen)} lengths and {len(dest)} destinations")
        status = np.empty(n, dtype=np.int8)
        if n:
            self._fn(
                self._decompress,
                self._blosc.context(),
                self._crc if checksum else None,
                n,
                src.ctypes.data,
                srclen.ctypes.data,
                dest.ctypes.data,
                int(destsize),
                status.ctypes.data,
            )
        return status

    @property
    def copies_rows(self) -> bool:
        """True where this build of the loop has :meth:`run_rows` (a loop built before
        it decodes whole chunks only, until the package is installed again)."""
        return self._rows_fn is not None

    def run_rows(
        self,
        src: np.ndarray,
        srclen: np.ndarray,
        destsize: int,
        copies: RowCopies,
        *,
        checksum: bool,
    ) -> np.ndarray:
        """Check and decode chunk ``i`` as :meth:`run` does, but into a buffer of this
        thread's that stays in the processor's cache, and copy out only the rows
        ``copies`` wants of it; ``copies.done`` is set for each chunk copied out.

        Returns
        -------
        numpy.ndarray
            ``int8`` status of each chunk, :data:`DECODED` where it decoded (and its
            rows were copied).
        """
        if self._rows_fn is None:
            raise RuntimeError(
                "the chunk loop built here has no row copies (atari_zarr_decode_rows), or "
                "they failed its check; install atari-zarr again to rebuild it"
            )
        n = len(src)
        src = np.ascontiguousarray(src, dtype=np.uint64)
        srclen = np.ascontiguousarray(srclen, dtype=np.int64)
        first = np.ascontiguousarray(copies.first, dtype=np.int64)
        count = np.ascontiguousarray(copies.count, dtype=np.int64)
        if len(srclen) != n or len(first) != n or len(count) != n:
            raise ValueError(f"{n} sources, {len(srclen)} lengths and {len(first)} row lists")
        status = np.empty(n, dtype=np.int8)
        if n:
            scratch = _thread_scratch(destsize)
            self._rows_fn(
                self._decompress,
                self._blosc.context(),
                self._crc if checksum else None,
                n,
                src.ctypes.data,
                srclen.ctypes.data,
                int(destsize),
                scratch.ctypes.data,
                first.ctypes.data,
                count.ctypes.data,
                copies.within.ctypes.data,
                copies.out.ctypes.data,
                copies.row_bytes,
                status.ctypes.data,
            )
            copies.done[copies.origin[status == DECODED]] = True
        return status

    def run_parts(
        self,
        src: np.ndarray,
        srclen: np.ndarray,
        dests: Destinations | np.ndarray,
        destsize: int,
        *,
        checksum: bool,
        executor: Executor | None = None,
        parts: int = 1,
    ) -> np.ndarray:
        """:meth:`run` into ``dests`` (addresses, or :class:`Destinations`; with
        :attr:`Destinations.copies`, :meth:`run_rows`), the chunks split into
        ``parts`` runs of about equal encoded bytes: the first on the calling thread,
        the others on ``executor``'s threads, all at once."""
        n = len(src)
        copies = dests.copies if isinstance(dests, Destinations) else None
        if copies is not None and self._rows_fn is not None:

            def run(a: int, b: int) -> np.ndarray:
                part = copies.take(slice(a, b))
                return self.run_rows(src[a:b], srclen[a:b], destsize, part, checksum=checksum)

        else:
            at = dests.addresses() if isinstance(dests, Destinations) else dests

            def run(a: int, b: int) -> np.ndarray:
                return self.run(src[a:b], srclen[a:b], at[a:b], destsize, checksum=checksum)

        if executor is None or parts <= 1 or n < 2:
            return run(0, n)
        parts = min(parts, n)
        # decoding time follows the encoded bytes more than the count of chunks
        cum = np.cumsum(srclen, dtype=np.float64)
        cuts = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts).tolist()
        bounds = [0, *cuts, n]
        futs = [executor.submit(run, a, b) for a, b in itertools.pairwise(bounds[1:])]
        first = run(0, bounds[1])
        return np.concatenate([first, *(f.result() for f in futs)])


_local = threading.local()


def _thread_scratch(nbytes: int) -> np.ndarray:
    """This thread's buffer of at least ``nbytes``, reused from call to call."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.size < nbytes:
        buf = _local.scratch = np.empty(nbytes, dtype=np.uint8)
    return buf  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RowCopies:
    """Rows of decoded chunks wanted elsewhere, copied out as each chunk decodes
    (:meth:`ChunkLoop.run_rows`): chunk ``i``'s rows ``within[p]``, for ``p`` in
    ``first[i] : first[i] + count[i]``, go to address ``out[p]``, ``row_bytes``
    each, and ``done[origin[i]]`` is set once they are.

    Examples
    --------
    >>> out = np.zeros((3, 2), dtype=np.uint8)
    >>> row = out.strides[0]
    >>> c = RowCopies.of(np.array([1, 0, 1]), np.array([0, 1, 1]), np.array([0, 1]),
    ...                  out, done=np.zeros(2, dtype=bool))
    >>> c.first.tolist(), c.count.tolist(), c.within.tolist()
    ([0, 1], [1, 2], [1, 0, 1])
    >>> (c.out - out.ctypes.data).tolist() == [row, 0, 2 * row]
    True
    """

    first: np.ndarray
    count: np.ndarray
    origin: np.ndarray
    within: np.ndarray
    out: np.ndarray
    row_bytes: int
    done: np.ndarray

    @classmethod
    def of(
        cls,
        chunk: np.ndarray,
        within: np.ndarray,
        chunks: np.ndarray,
        out: np.ndarray,
        *,
        done: np.ndarray,
    ) -> RowCopies:
        """Row ``j`` of ``out`` (C-contiguous) is row ``within[j]`` of chunk
        ``chunk[j]``: the copies of the chunks numbered ``chunks``, in that order."""
        row_bytes = int(out.strides[0]) if out.ndim else int(out.itemsize)
        at = np.uint64(out.ctypes.data) + (np.arange(len(chunk)) * row_bytes).astype(np.uint64)
        return cls.to(chunk, within, at, row_bytes, done=done).take(chunks)

    @classmethod
    def to(
        cls,
        chunk: np.ndarray,
        within: np.ndarray,
        at: np.ndarray,
        row_bytes: int,
        *,
        done: np.ndarray,
    ) -> RowCopies:
        """Row ``within[j]`` of chunk ``chunk[j]`` copied to address ``at[j]``, for every
        ``j``: the copies of chunks ``0 .. len(done) - 1``, in that order."""
        chunk = np.asarray(chunk, dtype=np.int64)
        order = np.argsort(chunk, kind="stable")
        count = np.bincount(chunk, minlength=len(done))
        return cls(
            np.cumsum(count) - count,
            count,
            np.arange(len(done), dtype=np.int64),
            np.ascontiguousarray(np.asarray(within, dtype=np.int64)[order]),
            np.ascontiguousarray(np.asarray(at, dtype=np.uint64)[order]),
            int(row_bytes),
            done,
        )

    def take(self, which: Any) -> RowCopies:
        """The copies of chunks ``which`` (positions, or a slice)."""
        return RowCopies(
            self.first[which],
            self.count[which],
            self.origin[which],
            self.within,
            self.out,
            self.row_bytes,
            self.done,
        )


class Destinations(Sequence[np.ndarray]):
    """Where decoded chunks go: chunk ``i`` fills ``rows[starts[i] : starts[i] + chunk_rows]``.

    A sequence of those views (what a decoding call takes one by one) that also gives
    their addresses at once (:meth:`addresses`), for :class:`ChunkLoop`.

    Parameters
    ----------
    rows : numpy.ndarray
        C-contiguous array whose first axis is rows: a cache's slab, a batch's scratch,
        the output of a range read.
    starts : array-like of int
        First row of each chunk's place.
    chunk_rows : int
        Rows of a chunk.

    Examples
    --------
    >>> buf = np.zeros((6, 2), dtype=np.int16)
    >>> d = Destinations(buf, [4, 0], 2)
    >>> len(d), d[0].shape, d.addresses().tolist() == [buf.ctypes.data + 16, buf.ctypes.data]
    (2, (2, 2), True)
    >>> d[1:][0][...] = 7
    >>> buf[:, 0].tolist()
    [7, 7, 0, 0, 0, 0]
    """

    def __init__(
        self, rows: np.ndarray, starts: Any, chunk_rows: int, copies: RowCopies | None = None
    ) -> None:
        if not rows.flags.c_contiguous:
            raise ValueError("decoded chunks go to a C-contiguous array")
        self.rows = rows
        self.starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        self.chunk_rows = int(chunk_rows)
        #: Where only some rows of each chunk are wanted: those rows, copied out by the
        #: loop as it decodes (the chunk then never reaches its place here). A chunk
        #: decoded any other way fills its place, and its ``done`` stays unset.
        self.copies = copies

    @classmethod
    def slots(cls, chunks: np.ndarray, at: Any) -> Destinations:
        """Slots ``at`` of ``chunks``, a C-contiguous ``(n, chunk_rows, ...)`` array (a
        cache's slab, a batch's scratch).

        Examples
        --------
        >>> slab = np.zeros((3, 2, 4), dtype=np.uint8)
        >>> d = Destinations.slots(slab, [2, 0])
        >>> d[0][...] = 1
        >>> slab[:, 0, 0].tolist(), d.chunk_rows
        ([0, 0, 1], 2)
        """
        rows = chunks.shape[1]
        return cls(chunks.reshape(-1, *chunks.shape[2:]), np.asarray(at) * rows, rows)

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> Destinations: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | Destinations:
        if isinstance(i, slice):
            copies = None if self.copies is None else self.copies.take(i)
            return Destinations(self.rows, self.starts[i], self.chunk_rows, copies)
        at = int(self.starts[i])
        return self.rows[at : at + self.chunk_rows]

    def take(self, which: Any) -> Destinations:
        """The places of chunks ``which`` (positions in this sequence)."""
        which = np.asarray(which, dtype=np.int64)
        copies = None if self.copies is None else self.copies.take(which)
        return Destinations(self.rows, self.starts[which], self.chunk_rows, copies)

    def addresses(self) -> np.ndarray:
        """``uint64`` address of each chunk's first byte."""
        row_bytes = self.rows.strides[0] if self.rows.ndim else self.rows.itemsize
        at = np.uint64(self.rows.ctypes.data) + (self.starts * row_bytes).astype(np.uint64)
        return at  # type: ignore[no-any-return]


@functools.cache
def chunk_loop() -> ChunkLoop | None:
    """The compiled loop, checked once per process on known chunks; None where it was not
    built, a library is missing, or the check fails (the reason is logged at DEBUG)."""
    try:
        blosc = libblosc2()
        if blosc is None:
            raise ImportError("c-blosc2 is not loaded through ctypes")
        loop = ChunkLoop(built_library(), blosc, _crc32c_value())
        _self_test(loop)
    except Exception as exc:
        log.debug("chunks decode one call each: %s", exc)
        return None
    return loop


@functools.cache
def built_library() -> ctypes.CDLL:
    """The compiled ``_chunk_loop`` library, loaded with :mod:`ctypes` (its decoding
    loop here, its row gather in :mod:`~atari_zarr.storage.row_gather`).

    Raises
    ------
    ImportError
        The package was installed without it (no compiler).
    """
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or spec.origin is None:
        raise ImportError("the chunk loop was not built with the package")
    return ctypes.CDLL(str(Path(spec.origin)))


def _crc32c_value() -> int:
    """The address of ``crc32c_value`` in the library google-crc32c ships."""
    spec = importlib.util.find_spec("google_crc32c")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("google-crc32c is not installed")
    for folder in map(Path, spec.submodule_search_locations):
        for where in (folder.parent / "google_crc32c.libs", folder / ".dylibs", folder):
            for pattern in ("libcrc32c*.so*", "libcrc32c*.dylib", "crc32c*.dll"):
                for path in sorted(where.glob(pattern)):
                    fn = ctypes.CDLL(str(path)).crc32c_value
                    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)
    raise ImportError("google-crc32c ships no crc32c library here")


def _self_test(loop: ChunkLoop) -> None:
    """Decode known chunks, one of them with a wrong crc32c, from two threads."""
    import google_crc32c
    from numcodecs import Blosc

    want = (np.arange(3 * 70_000, dtype=np.int64) % 251).astype(np.uint8).reshape(3, -1)
    bodies = [Blosc(cname="zstd", clevel=5).encode(w) for w in want]
    stored = [b + google_crc32c.value(b).to_bytes(4, "little") for b in bodies]
    stored[1] = stored[1][:-1] + bytes([stored[1][-1] ^ 1])
    srcs = [np.frombuffer(s, dtype=np.uint8) for s in stored]
    addrs = np.array([s.ctypes.data for s in srcs], dtype=np.uint64)
    lens = np.array([s.size for s in srcs], dtype=np.int64)
    results: list[bool] = []

    def check() -> None:
        out = np.zeros_like(want)
        dests = np.array([o.ctypes.data for o in out], dtype=np.uint64)
        status = loop.run(addrs, lens, dests, want.shape[1], checksum=True)
        results.append(
            status.tolist() == [DECODED, 2, DECODED]
            and np.array_equal(out[[0, 2]], want[[0, 2]])
            and not out[1].any()
        )

    threads = [threading.Thread(target=check) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if results != [True, True]:
        raise ValueError("decoded known chunks wrongly")
    if loop.copies_rows:  # rows copied out as chunks decode: checked the same way
        out = np.zeros((4, 1000), dtype=np.uint8)
        done = np.zeros(3, dtype=bool)
        chunk, within = np.array([2, 0, 1, 2]), np.array([69, 3, 0, 0])
        rows = want.reshape(3, 70, 1000)
        copies = RowCopies.of(chunk, within, np.arange(3), out, done=done)
        status = loop.run_rows(addrs, lens, want.shape[1], copies, checksum=True)
        good = chunk != 1
        if not (
            status.tolist() == [DECODED, 2, DECODED]
            and done.tolist() == [True, False, True]
            and np.array_equal(out[good], rows[chunk[good], within[good]])
        ):
            log.debug("chunks decode whole: the loop's row copies failed their check")
            loop._rows_fn = None
