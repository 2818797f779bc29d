"""Where this process stands in a job: its rank among ranks, and its DataLoader worker.

One answer for every part that asks: the epoch stream splits an epoch among consumers
(every DataLoader worker of every rank: consumer ``rank * workers + worker`` of
``world_size * workers``), the decoded-frame cache divides its memory among the workers
of a process, and a pull is started by one process per machine while the others wait.

* Rank and world size: ``torch.distributed``'s when it is initialised, else what a
  launcher sets in the environment (``RANK`` and ``WORLD_SIZE`` both: torchrun,
  Lightning, accelerate), else rank 0 of 1.
* The rank on this machine: ``LOCAL_RANK`` when set (a cache is per machine), else the
  rank, else ``RANK`` set alone (it splits no epoch, but says who pulls).
* The DataLoader worker: ``torch.utils.data.get_worker_info()`` (worker 0 of 1 outside
  a DataLoader's workers).

torch is asked only once something imported it: a process that never imported torch
is no part of a torch job.

Examples
--------
>>> place = current_place()  # one process, no launcher
>>> place.rank, place.world_size, place.worker, place.workers
(0, 1, None, 1)
>>> place.pulls, place.describe()
(True, 'rank 0 of 1')
>>> place = current_place(1, 2, loader_workers=2)  # a DataLoader's main process
>>> place.consumer, place.consumers
(2, 4)
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass, replace

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError

__all__ = ["Place", "check_rank", "current_place", "quiet_worker_exit"]

# Seconds a spawned worker gives its queue's feeder thread to finish the batch it is
# handing over, as it exits.
_FEEDER_GRACE_S = 2.0
_exit_hook = False


@dataclass(frozen=True)
class Place:
    """This process's rank, rank on this machine and DataLoader worker."""

    rank: int
    world_size: int
    local_rank: int
    #: The DataLoader worker this process is (None: not a worker) and how many there are.
    worker: int | None = None
    workers: int = 1
    #: Where the rank came from: ``"torch.distributed"``, ``"$RANK"`` or ``""`` (one process).
    told_by: str = ""
    #: Where the rank on this machine came from: ``"$LOCAL_RANK"``, else as :attr:`told_by`.
    local_told_by: str = ""

    @property
    def consumer(self) -> int:
        """This reader's number among an epoch's consumers, ``rank * workers + worker``."""
        return self.rank * self.workers + (self.worker or 0)

    @property
    def consumers(self) -> int:
        """How many consumers read an epoch, ``world_size * workers``."""
        return self.world_size * self.workers

    @property
    def pulls(self) -> bool:
        """This process starts a pull: the main process of rank 0 on its machine."""
        return self.worker is None and self.local_rank == 0

    def describe(self) -> str:
        """Who this is, for messages: ``"rank 1 ($RANK)"``, ``"DataLoader worker 0"``."""
        if self.worker is not None:
            return f"DataLoader worker {self.worker}"
        if self.local_told_by:
            return f"rank {self.local_rank} ({self.local_told_by})"
        return f"rank {self.rank} of {self.world_size}"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def current_place(
    given_rank: int | None = None,
    given_world: int | None = None,
    *,
    loader_workers: int | None = None,
) -> Place:
    """This process's :class:`Place`, asked anew (a forked worker is another place).

    ``given_rank`` and ``given_world`` (a stream's own ``rank`` and ``world_size``)
    stand for the job's; ``loader_workers`` given makes this the main process of a
    DataLoader with that many workers (which counts its workers' batches).
    """
    rank, world, told = 0, 1, ""
    worker, workers = None, 1
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if dist is not None and dist.is_available() and dist.is_initialized():
        rank, world, told = int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed"
    elif env_rank is not None and env_world is not None and env_rank < env_world:
        rank, world, told = env_rank, env_world, "$RANK"  # a launcher's: both are set
    local = _env_int("LOCAL_RANK")
    if local is not None:
        local_rank, local_told = local, "$LOCAL_RANK"
    elif told:
        local_rank, local_told = rank, told
    elif env_rank is not None:  # a rank alone splits nothing, but says who pulls
        local_rank, local_told = env_rank, "$RANK"
    else:
        local_rank, local_told = 0, ""
    if torch is not None:
        info = torch.utils.data.get_worker_info()
        if info is not None:
            worker, workers = int(info.id), int(info.num_workers)
    place = Place(rank, world, local_rank, worker, workers, told, local_told)
    if given_rank is not None or given_world is not None:
        place = replace(
            place,
            rank=place.rank if given_rank is None else int(given_rank),
            world_size=place.world_size if given_world is None else int(given_world),
        )
    if loader_workers is not None:
        place = replace(place, worker=None, workers=max(1, int(loader_workers)))
    return place


def check_rank(
    rank: int | None, world_size: int | None, where: str
) -> tuple[int | None, int | None]:
    """``(rank, world_size)`` as ints, or one line naming ``where``: whole numbers, the
    rank in ``[0, world_size)``, and both given unless the job says the other.

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
    torch = sys.modules.get("torch")  # asked per batch: the worker alone, not the place
    if _exit_hook or torch is None or torch.utils.data.get_worker_info() is None:
        return

    def wait_for_feeder() -> None:
        for thread in threading.enumerate():
            if thread.name == "QueueFeederThread" and thread is not threading.current_thread():
                thread.join(timeout=_FEEDER_GRACE_S)

    atexit.register(wait_for_feeder)
    _exit_hook = True
