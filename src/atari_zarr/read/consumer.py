"""Which part of an epoch this process reads: :class:`Consumer`, the one value for it.

An epoch is split among *consumers*: every DataLoader worker of every rank. Consumer
``rank * num_workers + worker`` of ``world_size * num_workers`` reads its share
(:mod:`atari_zarr.read.epoch` deals the units). Rank and world size come from the
caller, else from ``torch.distributed`` when it is initialised; the worker from
``torch.utils.data.get_worker_info()``.

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

from atari_zarr.errors import InvalidArgumentError

__all__ = ["Consumer", "check_rank"]


def check_rank(rank: int | None, world_size: int | None, where: str) -> None:
    """Refuse a rank outside ``[0, world_size)`` in one line naming ``where``."""
    if rank is not None and world_size is not None and not 0 <= rank < world_size:
        raise InvalidArgumentError(
            f"rank must be in [0, world_size); got rank={rank}, world_size={world_size} for {where}"
        )


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
        """This process: the rank given (else ``torch.distributed``'s) and its DataLoader worker.

        ``workers`` overrides the number of workers (the main process of a DataLoader
        that counts its workers' batches).
        """
        r, w = _distributed(rank, world_size)
        if workers is not None:
            return cls(r, w, 0, max(1, int(workers)))
        info = torch.utils.data.get_worker_info()
        if info is None:
            return cls(r, w, 0, 1)
        return cls(r, w, int(info.id), int(info.num_workers))


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return (
            int(dist.get_rank()) if rank is None else int(rank),
            int(dist.get_world_size()) if world_size is None else int(world_size),
        )
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))
