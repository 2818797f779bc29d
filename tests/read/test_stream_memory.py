"""The stream's resident memory stays under its documented bound over a whole epoch."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import pytest

from atari_zarr import AtariZarrDataset
from atari_zarr.read.stream import stream_memory_bound
from tests.read.test_stream import write_store

SHARDS = 24  # 98,304 transitions: 693 MB of decoded frames
ROWS = SHARDS * 4096


def status(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def epoch_rss_growth(ds: Any, options: dict[str, int]) -> tuple[int, int]:
    """Stream one epoch of ``ds`` (``stream(256, **options)``): its transitions, and how
    far resident memory rose above where it was after a warm-up batch loaded every code
    path (polled after every batch)."""
    next(iter(ds.stream(256, seed=1, **options)))
    gc.collect()
    base = peak = status("VmRSS")
    rows = 0
    for batch in ds.stream(256, seed=0, **options):
        rows += len(batch)
        peak = max(peak, status("VmRSS"))
        del batch
    return rows, peak - base


@pytest.fixture(scope="module")
def large_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store of 24 frame shards, made fast: one shard written, its object copied."""
    path = Path(write_store(str(tmp_path_factory.mktemp("memory") / "big.zarr"), ROWS, frames=4096))
    first = path / "observation" / "c" / "0" / "0" / "0"
    for s in range(1, SHARDS):
        target = path / "observation" / "c" / str(s) / "0" / "0"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(first, target)
    return str(path)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_rss_stays_under_the_bound_over_an_epoch(large_store: str) -> None:
    """RSS grows by at most the bound (+ a fixed allowance) while an epoch streams.

    Measured in this process: the baseline is taken right before the epoch, after a
    warm-up batch loaded every code path; polled after every batch.
    """
    options = {"shuffle_buffer": 4096, "units_ahead": 1}
    ds = AtariZarrDataset(large_store)
    rows, growth = epoch_rss_growth(ds, options)
    assert rows == ROWS
    bound = stream_memory_bound(1, **options)
    # on top of the bound: batches alive in the loop, thread stacks, the per-step
    # columns of 98k rows, allocator slack
    allowance = 48 << 20
    assert growth <= bound + allowance, (growth, bound)
    # far below what holding the store's frames would take
    assert len(ds) * 84 * 84 > 4 * (bound + allowance)
