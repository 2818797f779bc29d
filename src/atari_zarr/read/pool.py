"""Memory for batches, reused once no tensor refers to it: :class:`BufferPool`; and
large buffers made resident at once: :func:`resident`.

A batch of 256 transitions with their next frames is 3.6 MB of frames. Gathering
them into fresh arrays costs a page fault for every 4 KB page touched the first
time, which on one core costs more than the gather itself (``docs/streaming.md``).
A pool hands out arrays carved from a few blocks of memory and gives a block out
again only when nothing refers to it any more: every array, tensor and view made
from a block keeps a reference to it (``torch.from_numpy`` keeps the NumPy array
alive, and views keep their base), so its reference count shows whether a batch
handed out earlier is still held somewhere. A batch that is kept is never
overwritten; a batch that was dropped costs no new memory.

Examples
--------
>>> pool = BufferPool(keep=2)
>>> a = pool.take((2, 3))
>>> b = pool.take((2, 3))
>>> a.base is b.base  # a is still held: b comes from another block
False
>>> block = id(a.base)
>>> del a
>>> id(pool.take((3, 2)).base) == block  # a was dropped: its block is used again
True
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import sys
import threading
from typing import Any

import numpy as np

from atari_zarr.forks import after_fork
from atari_zarr.resources import cpu_count

__all__ = ["BufferPool", "resident"]

# Below this size a buffer is allocated as usual (its pages are few).
_RESIDENT_MIN = 1 << 20


def resident(shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
    """An uninitialised array of ``shape`` whose pages are made resident at once.

    A page written for the first time costs a fault. On the 2-core VMs of
    ``docs/benchmarks/cores.md`` a fault per 4 KB page gave fresh memory at 0.5 GB/s,
    and the same memory mapped populated (Linux's ``MAP_POPULATE``) at 2.8 GB/s: a
    stream's first epoch, which writes its slab of units for the first time, spent
    most of its time in those faults. Those pages are made resident on every core
    (:func:`_populate`): a stream's slab of 260 MB in 42 to 48 ms on two cores, against
    78 to 109 ms on one (``benchmarks/bench_stream_ceiling.py``). Where
    ``MAP_POPULATE`` does not exist, or below 1 MB, this is ``np.empty``. The memory is
    freed with the array.

    Examples
    --------
    >>> a = resident((300, 84, 84))
    >>> a.shape, a.dtype.name, a.flags.writeable
    ((300, 84, 84), 'uint8', True)
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if not populate or nbytes < _RESIDENT_MIN:
        return np.empty(shape, dtype=dtype)
    try:
        memory = _populate(nbytes)
        if memory is None:
            memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    except (OSError, ValueError):  # no memory to map at once: pages as they are written
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


# Below this size one thread makes the pages resident (a thread costs more than it saves).
_SPLIT_MIN = 32 << 20
# Linux's advice to fault a range in, writable, at once (5.14 on).
_MADV_POPULATE_WRITE = 23


def _populate(nbytes: int) -> mmap.mmap | None:
    """``nbytes`` of anonymous memory made resident by a thread per core, each faulting in
    its part (``madvise(MADV_POPULATE_WRITE)``, the GIL released); None where one
    thread will do or the kernel cannot (then the caller maps it ``MAP_POPULATE``)."""
    parts = min(cpu_count(), nbytes // _SPLIT_MIN)
    if parts < 2:
        return None
    libc = _libc()
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(memory, dtype=np.uint8).ctypes.data
    cuts = [(nbytes * i // parts) & ~4095 for i in range(parts)] + [nbytes]
    failed: list[int] = []

    def part(i: int) -> None:
        if libc.madvise(base + cuts[i], cuts[i + 1] - cuts[i], _MADV_POPULATE_WRITE):
            failed.append(ctypes.get_errno())

    others = []
    for i in range(1, parts):
        th = threading.Thread(target=part, args=(i,), name="atari_zarr-populate", daemon=True)
        try:
            th.start()
        except RuntimeError:  # no thread to be had: this part on the calling thread
            part(i)
            continue
        others.append(th)
    part(0)
    for th in others:
        th.join()
    if failed:  # an older kernel (EINVAL), or no memory for it: the caller maps it
        memory.close()
        return None
    return memory


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


class BufferPool:
    """Blocks of memory for batches, each given out again once nothing refers to it.

    Parameters
    ----------
    keep : int
        Blocks kept for reuse. A batch held by the caller keeps its block busy; with
        more batches held than ``keep``, new ones get fresh memory that is not kept.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = int(keep)
        self._blocks: list[np.ndarray] = []
        self._lock = threading.Lock()
        after_fork(self._renew_lock)

    def _renew_lock(self) -> None:
        """In a forked child: a lock a reading thread of the parent held stays held."""
        self._lock = threading.Lock()

    def _free_block(self, nbytes: int) -> np.ndarray | None:
        """The smallest block of at least ``nbytes`` that nothing refers to, or None."""
        best = None
        for i in range(len(self._blocks)):
            block = self._blocks[i]
            # references: the list, ``block``, getrefcount's argument
            if block.nbytes >= nbytes and sys.getrefcount(block) <= 3:
                if best is None or block.nbytes < best.nbytes:
                    best = block
        return best

    def take(self, shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` (contents undefined) that nothing else uses."""
        dtype = np.dtype(dtype)
        # math.prod: numpy's reduction of a tuple costs ~10 us, a batch's Python time
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:
            block = self._free_block(nbytes)
            if block is None:
                block = np.empty(max(nbytes, 1), dtype=np.uint8)
                if len(self._blocks) < self.keep:
                    self._blocks.append(block)
                else:
                    # keep the newest size: replace the smallest block nothing holds
                    idle = [
                        i for i in range(len(self._blocks)) if sys.getrefcount(self._blocks[i]) <= 2
                    ]
                    if idle:
                        smallest = min(idle, key=lambda i: self._blocks[i].nbytes)
                        self._blocks[smallest] = block
            # the view refers to the block before the lock is released
            return block[:nbytes].view(dtype).reshape(shape)
