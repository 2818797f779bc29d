"""Which part of an epoch this process reads: :class:`Consumer`, the one value for it.

An epoch is split among *consumers*: every DataLoader worker of every rank. Consumer
``rank * num_workers + worker`` of ``world_size * num_workers`` reads its share
(:mod:`atari_zarr.read.epoch` deals the units). Rank and world size come from the
caller, else from :func:`~atari_zarr.place.current_place` (``torch.distributed`` when
it is initialised, else ``RANK`` and ``WORLD_SIZE``), as does the DataLoader worker.

Examples
--------
>>> c = Consumer(rank=1, world_size=2, worker=0, workers=2)
>>> c.index, c.count
(2, 4)
>>> Consumer.current(rank=0, world_size=1)
Consumer(rank=0, world_size=1, worker=0, workers=1)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.place import current_place

__all__ = ["Consumer", "check_rank", "quiet_worker_exit"]

# Seconds a spawned worker gives its queue's feeder thread to finish the batch it is
# handing over, as it exits.
_FEEDER_GRACE_S = 2.0
_exit_hook = False


def quiet_worker_exit() -> None:
    """In a DataLoader worker, let the batch being handed over finish before the exit.

    A worker broken out of (``break`` in the training loop) exits while its queue's
    feeder thread may still be handing over a prefetched batch: pickling a tensor into
    shared memory is C++ code, and a spawned worker's interpreter, ending, stops the
    thread inside it, which aborts the worker ("terminate called without an active
    exception") and makes the DataLoader print a traceback. This registers, once per
    worker process, an exit hook that waits up to 2 s for the feeder: it finishes the
    batch and then blocks in a plain write, where stopping it is harmless.
    """
    global _exit_hook
    if _exit_hook or torch.utils.data.get_worker_info() is None:
        return
    import atexit
    import threading

    def wait_for_feeder() -> None:
        for thread in threading.enumerate():
            if thread.name == "QueueFeederThread" and thread is not threading.current_thread():
                thread.join(timeout=_FEEDER_GRACE_S)

    atexit.register(wait_for_feeder)
    _exit_hook = True


def check_rank(
    rank: int | None, world_size: int | None, where: str
) -> tuple[int | None, int | None]:
    """``(rank, world_size)`` as ints, or one line naming ``where``: whole numbers, the
    rank in ``[0, world_size)``, and both given unless the job says the other
    (:func:`~atari_zarr.place.current_place`).

    Examples
    --------
    >>> check_rank(1, 2, "s.zarr")
    (1, 2)
    >>> check_rank(None, 2, "s.zarr")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: rank=None and world_size=2 for s.zarr: ...
    """
    r = None if rank is None else whole_number(rank, "rank", where, low=0)
    w = None if world_size is None else whole_number(world_size, "world_size", where)
    if (r is None) != (w is None) and not current_place().told_by:
        raise InvalidArgumentError(
            f"rank={rank!r} and world_size={world_size!r} for {where}: expected both (this "
            f"process's rank among world_size processes) or neither (one process, "
            f"torch.distributed initialised, or RANK and WORLD_SIZE set). Pass both"
        )
    if r is not None and w is not None and not r < w:
        raise InvalidArgumentError(
            f"rank must be in [0, world_size); got rank={rank}, world_size={world_size} for {where}"
        )
    return r, w


@dataclass(frozen=True)
class Consumer:
    """One reader of an epoch: a DataLoader worker of a rank."""

    rank: int
    world_size: int
    worker: int
    workers: int

    @property
    def index(self) -> int:
        """This consumer's number, ``rank * workers + worker``."""
        return self.rank * self.workers + self.worker

    @property
    def count(self) -> int:
        """How many consumers read the epoch, ``world_size * workers``."""
        return self.world_size * self.workers

    @classmethod
    def current(
        cls, rank: int | None = None, world_size: int | None = None, *, workers: int | None = None
    ) -> Consumer:
        """This process: the rank given (else :func:`~atari_zarr.place.current_place`'s)
        and its DataLoader worker.

        ``workers`` overrides the number of workers (the main process of a DataLoader
        that counts its workers' batches).
        """
        place = current_place()
        r = place.rank if rank is None else int(rank)
        w = place.world_size if world_size is None else int(world_size)
        if workers is not None:
            return cls(r, w, 0, max(1, int(workers)))
        if place.worker is None:
            return cls(r, w, 0, 1)
        return cls(r, w, place.worker, place.workers)
