"""The stream's resident memory stays under its documented bound over a whole epoch, and
what a stream keeps from one epoch to the next: its slab, or every unit decoded."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atari_zarr import AtariZarrDataset, ReadOptions
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.stream import stream_memory_bound
from atari_zarr.read.units import kept_units_bytes
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


def resident_bytes(array: np.ndarray) -> int:
    """Resident bytes of the memory mappings that hold ``array``, from /proc/self/smaps
    (a large array is mapped apart from other memory, in one mapping or a few)."""
    start = array.__array_interface__["data"][0]
    end = start + array.nbytes
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < end and start < hi
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def rss_growth_per_epoch(
    ds: Any, stream: Any, options: dict[str, int], epochs: int = 1
) -> list[tuple[int, int]]:
    """Stream epochs ``0 .. epochs - 1`` of ``stream`` (one of ``ds``'s): for each, its
    transitions, and how far resident memory rose above where it was after a warm-up
    batch (``stream(256, **options)``) loaded every code path (polled after every
    batch)."""
    next(iter(ds.stream(256, seed=1, **options)))
    gc.collect()
    base = status("VmRSS")
    out = []
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        rows, peak = 0, base
        for batch in stream:
            rows += len(batch)
            peak = max(peak, status("VmRSS"))
            del batch
        out.append((rows, peak - base))
    return out


def epoch_rss_growth(ds: Any, options: dict[str, int]) -> tuple[int, int]:
    """Stream one epoch of ``ds`` (``stream(256, **options)``): its transitions, and how
    far resident memory rose (:func:`rss_growth_per_epoch`)."""
    [(rows, growth)] = rss_growth_per_epoch(ds, ds.stream(256, seed=0, **options), options)
    return rows, growth


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
    assert not ds.stream(256, **options).keeps_units()  # by default, no unit is kept
    rows, growth = epoch_rss_growth(ds, options)
    assert rows == ROWS
    bound = stream_memory_bound(1, **options)
    # on top of the bound: batches alive in the loop, thread stacks, the per-step
    # columns of 98k rows, allocator slack
    allowance = 48 << 20
    assert growth <= bound + allowance, (growth, bound)
    # far below what holding the store's frames would take
    assert len(ds) * 84 * 84 > 4 * (bound + allowance)


@pytest.fixture(scope="module")
def three_shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """10,000 transitions in 3 frame shards, final observations kept."""
    return write_store(str(tmp_path_factory.mktemp("reuse") / "s.zarr"), 10_000)


def leaves_equal(a: Any, b: Any) -> None:
    for key in b.keys(include_nested=True, leaves_only=True):
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=str(key))


def test_the_next_epoch_reuses_the_slab_and_leaves_held_batches_alone(three_shards: str) -> None:
    """An epoch's reader hands its slab to the next epoch's, whose batches are those of a
    fresh stream; batches still held from the epoch before are not written over."""
    ds = AtariZarrDataset(three_shards, frame_stack=4)
    options = {"seed": 5, "unit_rows": 1024, "shuffle_buffer": 2048, "keep_units": False}
    stream = ds.stream(100, **options)
    first = list(stream)  # held: their memory must stay theirs
    copies = [b.clone() for b in first]
    kept = stream._memory._held
    assert kept is not None  # the finished reader gave its slots back

    stream.set_epoch(1)
    batches = iter(stream)
    second = [next(batches)]
    assert stream._memory._held is None  # taken by this epoch's reader
    second += list(batches)
    assert stream._memory._held[1] is kept[1]  # the same memory, given back again

    fresh = ds.stream(100, epoch=1, **options)
    want = list(fresh)
    assert len(second) == len(want)
    for got, ref in zip(second, want, strict=True):
        leaves_equal(got, ref)
    for held, copy in zip(first, copies, strict=True):
        leaves_equal(held, copy)


@pytest.mark.parametrize("keep", [False, True], ids=["window", "kept"])
def test_an_epoch_left_early_then_a_whole_one_reads_every_row_right(
    three_shards: str, keep: bool
) -> None:
    """A reader closed in the middle of its epoch (units still being decoded) gives the
    next one no memory that a decode may still write into: the next epoch is exact."""
    ds = AtariZarrDataset(three_shards, frame_stack=2)
    kwargs = {"seed": 2, "unit_rows": 512, "shuffle_buffer": 1024}
    stream = ds.stream(64, keep_units=keep, **kwargs)
    assert stream.keeps_units() is keep
    for _ in range(3):
        batches = iter(stream)
        next(batches)
        batches.close()  # left early: the reader closes with units in flight
    stream.set_epoch(3)
    got = list(stream)
    want = list(AtariZarrDataset(three_shards, frame_stack=2).stream(64, epoch=3, **kwargs))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        leaves_equal(a, b)


def test_a_pickled_stream_keeps_no_memory(three_shards: str) -> None:
    """A DataLoader worker's copy of the stream starts with nothing kept, and reads."""
    import pickle

    for keep in (False, True):
        stream = AtariZarrDataset(three_shards).stream(500, seed=1, keep_units=keep)
        list(stream)
        assert stream._memory._held is not None and stream._memory._held[0] is keep
        copy = pickle.loads(pickle.dumps(stream))
        assert copy._memory._held is None
        copy.set_epoch(1)
        assert sum(len(b) for b in copy) == 10_000


def test_kept_units_are_read_once_and_the_later_epochs_are_exact(
    three_shards: str, tmp_path: Path
) -> None:
    """A stream that keeps its units decodes the store in the first epoch only: the
    later epochs read nothing from it (here it is gone), and give the batches a stream
    reading every unit again gives."""
    path = shutil.copytree(three_shards, tmp_path / "s.zarr")
    kwargs = {"seed": 4, "unit_rows": 1024, "shuffle_buffer": 2048}
    stream = AtariZarrDataset(path, frame_stack=4).stream(100, keep_units=True, **kwargs)
    assert stream.keeps_units()
    first = list(stream)
    copies = [b.clone() for b in first]
    kept = stream._memory._held[1]
    assert kept is not None and kept.loaded.all()

    gone = path.rename(tmp_path / "gone.zarr")
    later = []
    for epoch in (1, 2):
        stream.set_epoch(epoch)
        later.append(list(stream))
    assert stream._memory._held[1] is kept  # the same units, given back again
    gone.rename(path)

    window = AtariZarrDataset(path, frame_stack=4)
    for epoch, got in enumerate([first, *later]):
        want = list(window.stream(100, epoch=epoch, keep_units=False, **kwargs))
        assert len(got) == len(want) == 100
        for a, b in zip(got, want, strict=True):
            leaves_equal(a, b)
    for held, copy in zip(first, copies, strict=True):  # batches handed out stay theirs
        leaves_equal(held, copy)


def test_units_are_kept_as_asked_and_within_the_budget(three_shards: str) -> None:
    """Units are kept only when asked, and then when their frames fit
    ``frame_cache_bytes`` (a share of memory divided among DataLoader workers); else
    the epoch stops with one line saying what to do."""
    ds = AtariZarrDataset(three_shards, frame_stack=4)
    assert not ds.stream(100).keeps_units()  # however small the store

    stream = ds.stream(100, unit_rows=1024, keep_units=True)
    need = kept_units_bytes(stream.units, 4)
    assert need == (10_000 + 10 * (3 + 1)) * 84 * 84  # each unit's rows, with its halo

    def asked(budget: int | str, workers: int = 1) -> bool:
        options = ReadOptions(frame_cache_bytes=budget)
        kept = AtariZarrDataset(three_shards, frame_stack=4, options=options)
        return kept.stream(100, unit_rows=1024, keep_units=True).keeps_units(workers)

    assert asked(need)
    most = ReadOptions(frame_cache_bytes="25%").frame_cache_limit() // need  # workers it fits
    assert asked("25%", workers=most)
    for budget, workers in ((need - 1, 1), ("25%", most + 1)):
        with pytest.raises(InvalidArgumentError, match="keep_units=True.*frame_cache_bytes") as err:
            asked(budget, workers)
        assert "\n" not in str(err.value) and "s.zarr" in str(err.value)
    for bad in (None, 1, "yes"):
        with pytest.raises(InvalidArgumentError, match="keep_units must be True or False"):
            ds.stream(100, keep_units=bad)


def test_kept_units_of_small_stores_are_counted_at_their_size(tmp_path: Path) -> None:
    """A small store's one unit is counted at its rows, not as a whole 4,096-row shard:
    60 stores of 200 rows fit a budget their frames fit (before, 16 times too much)."""
    from atari_zarr import MultiGameDataset

    stores = [
        write_store(str(tmp_path / f"s{i}.zarr"), 200, seed=i, name=i, max_len=50)
        for i in range(60)
    ]
    frames = 60 * (200 + 3 + 1) * 84 * 84  # each unit with its halo, at frame stack 4
    options = ReadOptions(frame_cache_bytes=frames + 60)  # the mixture's, divided among them
    mix = MultiGameDataset(stores, frame_stack=4, options=options)
    stream = mix.stream(100, keep_units=True)
    assert kept_units_bytes(stream.units, 4) == frames
    assert stream.keeps_units()
    rows = np.concatenate([b["index"].numpy() for b in stream])
    assert sorted(rows.tolist()) == list(range(len(mix)))  # and the epoch reads right


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_kept_units_hold_the_store_once(large_store: str) -> None:
    """With a budget the store's units fit, resident memory grows by their frames (not by
    a stream's bound per epoch), and not at all in the epochs after the first."""
    options = {"shuffle_buffer": 4096, "units_ahead": 1}
    probe = AtariZarrDataset(large_store).stream(256, **options)
    need = kept_units_bytes(probe.units)
    ds = AtariZarrDataset(large_store, options=ReadOptions(frame_cache_bytes=need))
    stream = ds.stream(256, seed=0, keep_units=True, **options)
    assert stream.keeps_units()
    epochs = rss_growth_per_epoch(ds, stream, options, epochs=2)
    assert [rows for rows, _ in epochs] == [ROWS, ROWS]
    peaks = [growth for _, growth in epochs]
    allowance = 48 << 20  # as the bound's test
    assert peaks[0] <= need + allowance, (peaks, need)
    assert peaks[1] <= peaks[0] + (8 << 20), peaks  # nothing decoded again
    kept = stream._memory._held[1]
    assert kept is not None and kept.loaded.all()
    assert resident_bytes(kept.slab) > need // 2  # the units, held
