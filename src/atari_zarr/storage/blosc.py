"""Blosc decoding of one buffer into a preallocated array: which library, and off the GIL.

Every chunk of a store is a Blosc1 buffer (zstd). Three decoders read them:

* ``"libblosc2"``: c-blosc2's own call, ``blosc2_decompress_ctx``, with one decoding
  context per thread, through :mod:`ctypes`, which releases the GIL for the call. The
  library is the one python-blosc2 (a base dependency) ships. Threads decode at once:
  two decode 1.9x what one does on two cores, as two processes do
  (``docs/benchmarks/threads.md``), at python-blosc2's speed per chunk.
* ``"blosc2"``: python-blosc2's ``decompress``, the same library, but it holds the GIL
  while it decodes, so a second thread only waits.
* ``"numcodecs"``: numcodecs' c-blosc1, which releases the GIL but makes a zstd context
  per call: about half the speed.

:func:`blosc_decoder` gives the first that works here. ``libblosc2`` is checked once per
process before it is used (a known buffer decoded and compared); a library that will
not load, lacks the call or decodes wrongly leaves the choice to the next. Only the
decompression parameters' first field (threads, 1) is set; every other is zero, which
c-blosc2 reads as its default, and the structure is passed with room to spare, so a
release that appends fields reads zeros.

Examples
--------
>>> from numcodecs import Blosc
>>> data = Blosc(cname="zstd").encode(np.arange(64, dtype=np.uint8))
>>> out = np.empty(64, dtype=np.uint8)
>>> _ = blosc_decoder()(data, out)
>>> int(out[-1]), blosc_decoder_name() in ("libblosc2", "blosc2", "numcodecs")
(63, True)
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DECODERS",
    "LibBlosc2",
    "blosc_decoder",
    "blosc_decoder_name",
    "libblosc2",
    "libblosc2_decoder",
]

log = logging.getLogger("atari_zarr")

#: The decoders :func:`blosc_decoder` knows, fastest first.
DECODERS = ("libblosc2", "blosc2", "numcodecs")
# blosc2_dparams is 40 bytes in c-blosc2 3.x (32 in 2.x); passed by value, a larger
# structure of zeros after ``nthreads`` reads as the defaults in either.
_DPARAMS_BYTES = 128


class _DParams(ctypes.Structure):
    _fields_ = [("nthreads", ctypes.c_int16), ("rest", ctypes.c_byte * (_DPARAMS_BYTES - 8))]
    _pack_ = 8


def blosc_decoder(name: str | None = None) -> Callable[[Any, np.ndarray], Any]:
    """The function that decodes one Blosc buffer into a preallocated array.

    Parameters
    ----------
    name : {"libblosc2", "blosc2", "numcodecs"}, optional
        Which decoder; default the first of :data:`DECODERS` that works here
        (:func:`blosc_decoder_name`).

    Returns
    -------
    callable
        ``decode(src, dest)``: ``src`` any bytes-like Blosc buffer, ``dest`` a
        C-contiguous array of its decoded size. Raises ``ValueError`` on a buffer
        that does not decode.

    Examples
    --------
    >>> from numcodecs import Blosc
    >>> data = Blosc(cname="zstd").encode(np.arange(16, dtype=np.uint8))
    >>> out = np.empty(16, dtype=np.uint8)
    >>> _ = blosc_decoder("numcodecs")(data, out)
    >>> int(out[-1])
    15
    """
    return _decoder(name or blosc_decoder_name())


@functools.cache
def blosc_decoder_name() -> str:
    """The decoder :func:`blosc_decoder` uses by default: python-blosc2 where it is
    installed (the base install), else numcodecs.

    ``libblosc2`` is not the default for a thread decoding alone: it costs about 1 µs
    more a chunk in the call, and gains only where another thread runs beside it
    (:func:`~atari_zarr.storage.engine.background_decoder`)."""
    return "blosc2" if importlib.util.find_spec("blosc2") is not None else "numcodecs"


@functools.cache
def _decoder(name: str) -> Callable[[Any, np.ndarray], Any]:
    if name == "libblosc2":
        decode = libblosc2_decoder()
        if decode is None:
            raise ValueError("c-blosc2's library could not be loaded; use 'blosc2'")
        return decode
    if name == "blosc2":
        import blosc2

        return lambda src, dest: blosc2.decompress(src, dst=dest)
    if name == "numcodecs":
        from numcodecs import blosc

        return blosc.decompress  # type: ignore[no-any-return]
    raise ValueError(f"unknown Blosc decoder {name!r}; expected one of {DECODERS}")


@functools.cache
def libblosc2_decoder() -> Callable[[Any, np.ndarray], int] | None:
    """c-blosc2's ``blosc2_decompress_ctx`` through ctypes (the GIL released while it
    decodes, one context per thread), or None where it does not load or decode right."""
    lib = libblosc2()
    return None if lib is None else lib.decode


@functools.cache
def libblosc2() -> LibBlosc2 | None:
    """c-blosc2's library bound through ctypes and checked on a known buffer, or None
    where it does not load or decode right (the reason is logged at DEBUG)."""
    try:
        lib = LibBlosc2(_library())
        _self_test(lib.decode)
    except Exception as exc:  # any failure leaves the choice to the next decoder
        log.debug("c-blosc2 through ctypes is not used: %s", exc)
        return None
    return lib


def _library() -> ctypes.CDLL:
    spec = importlib.util.find_spec("blosc2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("python-blosc2 is not installed")
    for folder in spec.submodule_search_locations:
        lib = Path(folder) / "lib"
        for pattern in ("libblosc2.so*", "libblosc2*.dylib", "*blosc2*.dll"):
            for path in sorted(lib.glob(pattern)):
                return ctypes.CDLL(str(path))
    raise ImportError("python-blosc2 ships no libblosc2 here")


class _Context:
    """One thread's decoding context, freed with the thread's locals."""

    __slots__ = ("free", "ptr")

    def __init__(self, create: Any, free: Any) -> None:
        self.free = free
        self.ptr = create(_DParams(nthreads=1))
        if not self.ptr:
            raise MemoryError("c-blosc2 made no decoding context")

    def __del__(self) -> None:
        if self.ptr:
            self.free(self.ptr)
            self.ptr = None


class LibBlosc2:
    """c-blosc2's decoding call and one decoding context per thread.

    Parameters
    ----------
    lib : ctypes.CDLL
        The loaded library.

    Attributes
    ----------
    decompress_ctx : int
        The address of ``blosc2_decompress_ctx``, for a compiled loop that calls it
        (:mod:`atari_zarr.storage.chunk_loop`).
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.blosc2_init.restype = None
        lib.blosc2_init()
        create, free, run = lib.blosc2_create_dctx, lib.blosc2_free_ctx, lib.blosc2_decompress_ctx
        create.argtypes, create.restype = [_DParams], ctypes.c_void_p
        free.argtypes, free.restype = [ctypes.c_void_p], None
        run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]
        run.argtypes.append(ctypes.c_int32)
        run.restype = ctypes.c_int
        self._lib, self._create, self._free, self._run = lib, create, free, run
        self.decompress_ctx = int(ctypes.cast(run, ctypes.c_void_p).value or 0)
        self._local = threading.local()

    def context(self) -> int:
        """This thread's decoding context (made on first use, freed with the thread)."""
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = _Context(self._create, self._free)
        return int(ctx.ptr)

    def decode(self, src: Any, dest: np.ndarray) -> int:
        """Decode the Blosc buffer ``src`` into the C-contiguous array ``dest``;
        ``ValueError`` where it does not decode."""
        if not (dest.flags.c_contiguous and dest.flags.writeable):
            raise ValueError("the destination is not a writable C-contiguous array")
        if not isinstance(src, bytes):
            src = np.frombuffer(src, dtype=np.uint8)  # held until the call returns
            n, addr = src.nbytes, src.ctypes.data
        else:
            n, addr = len(src), src
        got = self._run(self.context(), addr, n, dest.ctypes.data, dest.nbytes)
        if got < 0:
            raise ValueError(f"c-blosc2 error {got}")
        return int(got)


def _self_test(decode: Callable[[Any, np.ndarray], int]) -> None:
    from numcodecs import Blosc

    want = (np.arange(70_000, dtype=np.int64) % 251).astype(np.uint8)
    data = Blosc(cname="zstd", clevel=5, shuffle=Blosc.NOSHUFFLE).encode(want)
    for src in (data, memoryview(data), np.frombuffer(data, dtype=np.uint8)):
        out = np.zeros_like(want)
        if decode(src, out) != want.nbytes or not np.array_equal(out, want):
            raise ValueError("decoded a known buffer wrongly")
    try:
        decode(data[:-7], np.zeros_like(want))
    except ValueError:
        return
    raise ValueError("took a cut buffer")
