"""Where this process stands in a job: its rank among ranks, and its DataLoader worker.

One answer for every part that asks: the epoch stream splits an epoch among consumers
(ranks times workers), the decoded-frame cache divides its memory among the workers of
a process, and a pull is started by one process per machine while the others wait.

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
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

__all__ = ["Place", "current_place"]


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


def current_place() -> Place:
    """This process's :class:`Place`, asked anew (a forked worker is another place)."""
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
    return Place(rank, world, local_rank, worker, workers, told, local_told)
