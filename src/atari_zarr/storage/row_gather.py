"""Rows gathered from a large array into a batch by a thread that needs no GIL.

A stream's batch of 256 transitions is 512 frames of 7 KB picked from a slab of
hundreds of MB (its decoded units). ``np.take`` copies them on the calling thread,
which meanwhile does nothing else; that copy was the larger part of a batch's time
(``docs/benchmarks/cores.md``). A :class:`Gatherer` is a thread of the compiled loop
(``atari_zarr_gatherer_*`` in ``_chunk_loop.c``) that copies the rows while the
calling thread goes on: :meth:`Gatherer.submit` queues a gather and returns at once,
and the :class:`PendingGather` it returns waits for it, copying the rows still left
itself meanwhile, so both cores gather. The thread takes no GIL, so no Python thread
ever waits for it to hand the GIL over.

The thread is bounded (one per gatherer), named ``atari_zarr-rows``, and stopped by
:meth:`Gatherer.close` once what is queued is done. In a process forked from the one
that started it, the thread does not exist: there the gatherer forgets it
(:func:`~atari_zarr.forks.after_fork`), never waits for it nor stops it, and starts a
thread of the child's own at its next gather. A gather the parent had queued (a
stream's next batch, say) may have been copied in part, or not at all, when the
process forked: in the child its :meth:`PendingGather.wait` gathers it again, whole,
with numpy, so the child's rows are exactly the parent's.

Where the loop was not built or fails its self-check (or the arrays are not
C-contiguous rows of one dtype), :meth:`Gatherer.submit` gathers with ``np.take``
before it returns, which gives the same rows.

Examples
--------
>>> src = np.arange(24, dtype=np.uint8).reshape(6, 2, 2)
>>> out = np.empty((3, 2, 2), dtype=np.uint8)
>>> with gatherer() as rows:
...     pending = rows.submit(src, np.array([5, 0, 5]), out)
...     pending.wait()  # out may be read from here on
>>> out[:, 0, 0].tolist()
[20, 0, 20]
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any

import numpy as np

from atari_zarr.forks import after_fork
from atari_zarr.storage.chunk_loop import built_library

__all__ = ["Gatherer", "PendingGather", "gatherer"]

log = logging.getLogger("atari_zarr")


class _Calls:
    """The compiled gatherer's four calls, typed."""

    def __init__(self, library: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self.new = library.atari_zarr_gatherer_new
        self.new.argtypes, self.new.restype = [], ptr
        # queuing takes microseconds: called keeping the GIL (a PyDLL's call), so the
        # caller does not wait to take it back from the threads that run meanwhile
        self.submit = ctypes.PyDLL(library._name).atari_zarr_gatherer_submit
        self.submit.argtypes = [ptr, ptr, i64, i64, ptr, i64, ptr]
        self.submit.restype = i64
        self.wait = library.atari_zarr_gatherer_wait
        self.wait.argtypes, self.wait.restype = [ptr, i64], None
        self.free = library.atari_zarr_gatherer_free
        self.free.argtypes, self.free.restype = [ptr], None


@functools.cache
def _calls() -> _Calls | None:
    """The compiled calls, checked once per process on known rows; None where they were
    not built or fail the check (the reason is logged at DEBUG)."""
    try:
        calls = _Calls(built_library())
        handle = calls.new()
        if not handle:
            raise OSError("no thread could be started for it")
        try:
            src = np.arange(5 * 3, dtype=np.int16).reshape(5, 3)
            index = np.array([4, 0, 2, 2, 9, -1, 1], dtype=np.int64)
            outs = [np.zeros((7, 3), dtype=np.int16) for _ in range(12)]  # more than queued
            numbers = [
                calls.submit(handle, src.ctypes.data, 5, 6, index.ctypes.data, 7, o.ctypes.data)
                for o in outs
            ]
            calls.wait(handle, numbers[-1])
        finally:
            calls.free(handle)
        want = src[np.clip(index, 0, 4)]
        if numbers != list(range(1, 13)) or not all(np.array_equal(o, want) for o in outs):
            raise ValueError("gathered known rows wrongly")
    except Exception as exc:
        log.debug("rows are gathered by numpy on the calling thread: %s", exc)
        return None
    return calls


class PendingGather:
    """A gather queued by :meth:`Gatherer.submit`: its rows are in ``out`` once
    :meth:`wait` returns. It holds the arrays the gather reads and writes until then."""

    def __init__(self, owner: Gatherer | None, number: int, arrays: tuple[np.ndarray, ...]) -> None:
        self._owner = owner
        self._number = number
        self._arrays: tuple[np.ndarray, ...] | None = arrays
        #: The owner's forks when queued: another count means a forked child, where the
        #: thread it was queued on never ran.
        self._forks = owner._forks if owner is not None else 0

    @property
    def _stranded(self) -> bool:
        """Queued on the thread of a process this one was forked from."""
        return self._owner is not None and self._owner._forks != self._forks

    def wait(self) -> None:
        """Return once every row is in ``out`` (at once after the first time)."""
        stranded, owner, self._owner = self._stranded, self._owner, None
        if stranded and self._arrays:
            # the parent's thread copied some rows, or none, before the fork: all again
            src, index, out = self._arrays
            np.take(src, index, axis=0, out=out, mode="clip")
        elif owner is not None:
            owner._wait(self._number)
        self._arrays = None

    def __del__(self) -> None:
        if self._owner is not None and not self._stranded:  # stranded: nobody reads out
            self.wait()


class Gatherer:
    """A thread that gathers rows while its owner goes on (:func:`gatherer` makes one).

    A context manager: leaving it (or :meth:`close`) stops the thread once what is
    queued is done.
    """

    def __init__(self, calls: _Calls | None) -> None:
        self._calls = calls
        self._handle = calls.new() if calls is not None else None
        #: Forks since it was made (a gather queued before one is redone in the child).
        self._forks = 0
        #: A thread to start at the next gather (forked from a process that had one).
        self._restart = False
        after_fork(self._forget)

    def _forget(self) -> None:
        """In a forked child: the thread is the parent's alone (and its lock may be held
        for ever), so it is never waited for nor stopped here; the gathers queued on
        it are redone by their waits, and the next gather starts the child's thread."""
        self._restart = self._restart or bool(self._handle)
        self._handle = None
        self._forks += 1

    @property
    def threaded(self) -> bool:
        """True where gathers run on the thread (False: on the caller's, by numpy)."""
        return bool(self._handle)

    def submit(self, src: np.ndarray, index: Any, out: np.ndarray) -> PendingGather:
        """Start ``out[i] = src[index[i]]`` for every ``i`` (rows out of range clipped, as
        ``np.take(..., mode="clip")``) and return at once.

        Until the result's :meth:`~PendingGather.wait` returns, ``out`` must not be read
        nor ``src`` written. Where the thread cannot do it, the rows are gathered by
        ``np.take`` before this returns.
        """
        index = np.ascontiguousarray(index, dtype=np.int64)
        if self._restart and self._calls is not None:  # forked: a thread of this process
            self._restart = False
            self._handle = self._calls.new()
        if not (
            self.threaded
            and src.flags.c_contiguous
            and out.flags.c_contiguous
            and out.flags.writeable
            and src.dtype == out.dtype
            and src.shape[1:] == out.shape[1:]
            and len(out) == len(index)
            and len(src)
        ):
            np.take(src, index, axis=0, out=out, mode="clip")
            return PendingGather(None, 0, ())
        assert self._calls is not None
        number = self._calls.submit(
            self._handle,
            src.ctypes.data,
            len(src),
            src.strides[0],
            index.ctypes.data,
            len(index),
            out.ctypes.data,
        )
        return PendingGather(self, number, (src, index, out))

    def _wait(self, number: int) -> None:
        if self.threaded:
            assert self._calls is not None
            self._calls.wait(self._handle, number)

    def close(self) -> None:
        """Finish what is queued and stop the thread."""
        handle, self._handle = self._handle, None
        self._restart = False
        if handle:
            assert self._calls is not None
            self._calls.free(handle)

    def __enter__(self) -> Gatherer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self._handle:
            self.close()


def gatherer() -> Gatherer:
    """A :class:`Gatherer`: its own thread where the compiled loop was built and passes
    its check, else one that gathers with numpy on the caller's thread."""
    return Gatherer(_calls())
