"""Which consumer this process is: rank and world size, DataLoader worker."""

from __future__ import annotations

import pytest
import torch

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.consumer import Consumer, check_rank


def test_rank_and_workers_make_one_number():
    c = Consumer(rank=2, world_size=3, worker=1, workers=4)
    assert (c.index, c.count) == (9, 12)


def test_current_reads_torch_distributed(monkeypatch):
    assert Consumer.current() == Consumer(0, 1, 0, 1)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    assert Consumer.current() == Consumer(1, 4, 0, 1)
    assert Consumer.current(rank=3) == Consumer(3, 4, 0, 1)
    assert Consumer.current(workers=2).count == 8  # a DataLoader's main process


def test_a_rank_outside_the_world_is_refused():
    check_rank(1, 2, "s.zarr")
    with pytest.raises(InvalidArgumentError, match=r"rank must be in \[0, world_size\).*s.zarr"):
        check_rank(2, 2, "s.zarr")
