"""The Grain source: Grain's own MapDataset and DataLoader read it, record for record as
the dataset reads it, in threads and in worker processes."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from atari_zarr import AtariZarrDataset, MultiGameDataset
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.grain import AtariZarrSource

grain = pytest.importorskip("grain")


def _same(record: dict, item) -> None:
    """A record equals the TensorDict item of the dataset, key by key."""
    for key, value in record.items():
        if isinstance(value, dict):
            _same(value, item[key])
        else:
            np.testing.assert_array_equal(value, item[key].numpy(), err_msg=key)


def test_grain_reads_the_records_the_dataset_reads(pong_store) -> None:
    source = AtariZarrSource(pong_store.url, frame_stack=4)
    ds = AtariZarrDataset(pong_store.url, frame_stack=4)
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    assert len(source) == len(ds)
    batches = list(grain.MapDataset.source(source).shuffle(seed=0).batch(16))
    seen = np.concatenate([b["index"] for b in batches])
    assert sorted(seen.tolist()) == list(range(len(ds)))  # each record once
    first = batches[0]
    assert first["observation"].shape == (16, 4, 84, 84)
    assert set(first["next"]) == {"observation", "reward", "terminated", "truncated", "done"}
    for k in range(16):
        _same({key: _pick(v, k) for key, v in first.items()}, ds[int(first["index"][k])])


def _pick(tree, k):
    return {key: _pick(v, k) for key, v in tree.items()} if isinstance(tree, dict) else tree[k]


def test_batched_reads_threads_and_pickling(pong_store) -> None:
    source = AtariZarrSource(pong_store.url, frame_stack=2)
    ds = AtariZarrDataset(pong_store.url, frame_stack=2)
    rows = [7, 3, 250, 3]
    for row, record in zip(rows, source._getitems(rows), strict=True):
        _same(record, ds[row])
    # Grain's threads call __getitem__ at once: every record is still its own
    read = grain.MapDataset.source(source).to_iter_dataset(grain.ReadOptions(num_threads=4))
    indices = [int(r["index"]) for r in read]
    assert indices == list(range(len(ds)))
    again = pickle.loads(pickle.dumps(source))
    _same(again[11], ds[11])
    assert repr(again) == repr(source) and "frame_stack=2" in repr(source)


def test_windows_and_mixtures(pong_store, tmp_path: Path) -> None:
    windows = AtariZarrSource(pong_store.url, frame_stack=4, window=8)
    w = AtariZarrDataset(pong_store.url, frame_stack=4).windows(8)
    assert len(windows) == len(w)
    record = windows[5]
    assert record["observation"].shape == (8, 4, 84, 84)
    _same(record, w[5])
    mix = AtariZarrSource([pong_store.url, pong_store.url], frame_stack=1)
    both = MultiGameDataset([pong_store.url, pong_store.url], frame_stack=1)
    assert len(mix) == len(both)
    last = mix[len(mix) - 1]
    assert "game_id" in last  # a mixture's records say their game
    _same(last, both[len(both) - 1])


def test_a_grain_dataloader_reads_it_in_worker_processes(pong_store) -> None:
    """Grain's DataLoader pickles the source into its worker processes."""
    source = AtariZarrSource(pong_store.url, frame_stack=4)
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=0,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[grain.transforms.Batch(batch_size=32, drop_remainder=False)],
        worker_count=2,
    )
    batches = list(loader)
    seen = np.concatenate([batch["index"] for batch in batches])
    assert sorted(seen.tolist()) == list(range(len(source)))
    # each record with its own frames, read in the workers
    local = AtariZarrDataset(pong_store.url, frame_stack=4)
    for batch in batches:
        want = local[np.asarray(batch["index"])]
        np.testing.assert_array_equal(batch["observation"], want["observation"].numpy())
        np.testing.assert_array_equal(
            batch["next"]["observation"], want["next", "observation"].numpy()
        )


def test_bad_input_is_one_line() -> None:
    for bad in ([], 5, None):
        with pytest.raises(InvalidArgumentError) as info:
            AtariZarrSource(bad)
        assert "\n" not in str(info.value)


def test_grain_batches_of_indices_are_read_with_read_batch(pong_store) -> None:
    """``MapDataset.range(n).shuffle().batch(B).map(source.read_batch)``: an epoch of
    shuffled batches, each read at once, every index once, each with its own frames."""
    source = AtariZarrSource(pong_store.url, frame_stack=4)
    local = AtariZarrDataset(pong_store.url, frame_stack=4)
    batches = grain.MapDataset.range(len(source)).shuffle(seed=0).batch(64).map(source.read_batch)
    seen = []
    for batch in batches:
        rows = np.asarray(batch["index"])
        seen.extend(rows.tolist())
        np.testing.assert_array_equal(batch["observation"], local[rows]["observation"].numpy())
    assert sorted(seen) == list(range(len(source))) and seen != sorted(seen)


def test_an_index_is_never_rounded_nor_coerced(pong_store) -> None:
    """``src[1.5]`` read record 1, ``_getitems([1.5, 2])`` records 1 and 2, ``src["3"]``
    record 3 and ``src[True]`` record 1: the source cast every index to int64 where the
    dataset refuses it. Now both refuse the same indices with the same errors."""
    source = AtariZarrSource(pong_store.url, frame_stack=1)
    ds = AtariZarrDataset(pong_store.url, frame_stack=1)
    for bad in (1.5, "3", True, np.float32(2.0), None):
        with pytest.raises((TypeError, IndexError)) as ours:
            source[bad]
        with pytest.raises(type(ours.value)) as theirs:
            ds[bad]
        assert str(ours.value) == str(theirs.value) and "\n" not in str(ours.value)
    for bad in ([1.5, 2], ["3"], np.array([0.0, 1.0]), [len(ds)]):
        for read in (source._getitems, source.read_batch):
            with pytest.raises((TypeError, IndexError)) as ours:
                read(bad)
            with pytest.raises(type(ours.value)) as theirs:
                ds[bad]
            assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match="one record"):
        source[[1, 2]]  # several records: _getitems or read_batch
    # what the dataset takes, the source takes: numpy integers, negative ones
    _same(source[np.int64(-1)], ds[-1])
    assert [int(r["index"]) for r in source._getitems(np.array([4, -2]))] == [4, len(ds) - 2]


def test_a_pickled_source_refuses_a_store_replaced_since(tmp_path: Path) -> None:
    """A source pickled into a Grain worker kept only its URLs and read whatever store
    was there by then, while its process read the old one. Now it carries which store
    it opened, and a worker that finds another refuses in one line, as the datasets do."""
    import shutil

    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert
    from atari_zarr.errors import StoreChangedError

    for name, seed in (("a", 1), ("b", 2)):
        write_fixture_run(str(tmp_path / name), "Pong", "1", capacity=64, steps=300, seed=seed)
    [store] = convert(str(tmp_path / "a"), str(tmp_path / "out"), progress=False)
    for urls in (store.url, [store.url, store.url]):
        for window in (None, 4):
            source = AtariZarrSource(urls, frame_stack=2, window=window)
            unopened = pickle.dumps(source)
            len(source)  # opened here, as Grain does to learn its length
            handed = pickle.dumps(source)
            again = pickle.loads(handed)  # the same store: reopened, silently
            _same(again[3], source._open()[3])
    shutil.rmtree(store.url)
    convert(str(tmp_path / "b"), str(tmp_path / "out"), progress=False)
    with pytest.raises(StoreChangedError) as info:
        len(pickle.loads(handed))
    text = str(info.value)
    assert "\n" not in text and "was replaced since this dataset was opened" in text
    # a source never opened where it was pickled has nothing to compare: it opens the
    # store that is there
    assert len(pickle.loads(unopened)) == len(AtariZarrSource(urls, frame_stack=2, window=4))
