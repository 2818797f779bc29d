"""Where this process stands in a job: one answer for the stream, the cache and the pull."""

from __future__ import annotations

import pytest
import torch

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.place import Place, check_rank, current_place


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_one_process_is_rank_0_of_1_and_pulls():
    assert current_place() == Place(0, 1, 0)
    assert current_place().pulls


def test_a_launchers_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    place = current_place()
    assert (place.rank, place.world_size, place.local_rank) == (3, 4, 3)
    assert not place.pulls and place.describe() == "rank 3 ($RANK)"
    monkeypatch.setenv("LOCAL_RANK", "0")  # rank 0 of its machine: it pulls into its cache
    place = current_place()
    assert place.pulls and place.rank == 3 and place.describe() == "rank 0 ($LOCAL_RANK)"
    monkeypatch.setenv("RANK", "7")  # not below WORLD_SIZE: not a launcher's split
    assert current_place().told_by == "" and current_place().world_size == 1
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("RANK", "1")  # a rank alone splits nothing, but does not pull
    place = current_place()
    assert (place.rank, place.world_size) == (0, 1)
    assert not place.pulls and place.describe() == "rank 1 ($RANK)"


def test_torch_distributed_first(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    place = current_place()
    assert (place.rank, place.world_size, place.told_by) == (1, 2, "torch.distributed")


class _Places(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return current_place()


def _first(items):
    return items[0]


def test_a_dataloader_worker_knows_it_is_one():
    loader = torch.utils.data.DataLoader(
        _Places(), num_workers=2, collate_fn=_first, multiprocessing_context="fork"
    )
    places = list(loader)
    assert sorted(p.worker for p in places) == [0, 1]
    assert all(p.workers == 2 and not p.pulls for p in places)
    assert places[0].describe().startswith("DataLoader worker ")


def test_the_stream_splits_by_a_launchers_ranks(monkeypatch, tmp_path):
    """Under torchrun (RANK and WORLD_SIZE set) the stream reads this rank's part, as
    with rank= and world_size= given."""
    from atari_zarr import AtariZarrDataset
    from tests.read.test_stream import rows_of, write_store

    url = write_store(str(tmp_path / "s.zarr"), 2048)
    ds = AtariZarrDataset(url)
    explicit = rows_of(list(ds.stream(256, seed=0, rank=1, world_size=2, unit_rows=512)))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    mine = rows_of(list(ds.stream(256, seed=0, unit_rows=512)))
    assert mine.tolist() == explicit.tolist() and 0 < len(mine) < len(ds)


def test_rank_and_workers_make_one_consumer_number():
    place = Place(rank=2, world_size=3, local_rank=2, worker=1, workers=4)
    assert (place.consumer, place.consumers) == (9, 12)


def test_a_streams_own_rank_and_a_loaders_workers_stand_for_the_jobs(monkeypatch):
    assert (current_place().consumer, current_place().consumers) == (0, 1)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    assert (current_place().consumer, current_place().consumers) == (1, 4)
    assert current_place(3).consumer == 3
    main = current_place(loader_workers=2)  # a DataLoader's main process counts its workers'
    assert (main.consumers, main.worker, main.pulls) == (8, None, False)


def test_a_rank_outside_the_world_is_refused():
    check_rank(1, 2, "s.zarr")
    with pytest.raises(InvalidArgumentError, match=r"rank must be in \[0, world_size\).*s.zarr"):
        check_rank(2, 2, "s.zarr")
