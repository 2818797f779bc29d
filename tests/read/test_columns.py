"""Per-step columns: lazy, compact, and equal to the arrays."""

from __future__ import annotations

import numpy as np
import zarr

from atari_zarr import AtariZarrDataset
from atari_zarr.layout import (
    ACTION,
    ATTRS_KEY,
    EPISODE,
    REWARD,
    TERMINATED,
    TRUNCATED,
    create_store,
    for_writing,
)
from atari_zarr.read.columns import StepColumn, open_step_columns


def test_step_column_compacts_and_widens():
    a = zarr.create_array({}, shape=(100,), chunks=(16,), dtype="int32")
    a[:] = np.arange(100) % 7
    col = StepColumn(a, where="mem")
    assert col.compact_dtype == np.int8
    rows = np.array([99, 0, 50, 50])
    out = col[rows]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a[:][rows])
    a[60] = 100_000  # does not fit int8: the column widens to int32, nothing is lost
    col = StepColumn(a, where="mem")
    np.testing.assert_array_equal(col[np.array([0, 60, 99])], a.oindex[[0, 60, 99]])
    np.testing.assert_array_equal(col.to_numpy(), a[:])
    f = zarr.create_array({}, shape=(10,), chunks=(4,), dtype="float32")
    f[:] = np.array([-0.0, 1, -1, 0, 0.25, 1, 1, 0, 0, np.nan], dtype=np.float32)
    np.testing.assert_array_equal(
        StepColumn(f, where="m").to_numpy().view(np.uint32), f[:].view(np.uint32)
    )


def test_step_columns_from_episode_table_equal_arrays(pong_store):
    """Episode id and ends derived from the attributes equal the stored arrays (gaps included)."""
    store = pong_store  # shared, read-only
    group = zarr.open_group(store.url, mode="r")
    meta = group.attrs[ATTRS_KEY]
    cols = open_step_columns(group, meta, store.url)
    assert not isinstance(cols[EPISODE], StepColumn)  # derived from the table
    rows = np.arange(group[ACTION].shape[0])
    assert meta["conversion"]["gaps"], "the fixture should include a missed log"
    for name in (ACTION, EPISODE, REWARD, TERMINATED, TRUNCATED):
        np.testing.assert_array_equal(cols[name][rows], group[name][:], err_msg=name)
    np.testing.assert_array_equal(cols["done"][rows], group[TERMINATED][:] | group[TRUNCATED][:])
    # without a usable table the arrays are read instead
    bad = {**meta, "episodes": {"length": [1], "terminated": [True]}}
    cols = open_step_columns(group, bad, store.url)
    assert isinstance(cols[EPISODE], StepColumn)
    for name in (EPISODE, TERMINATED, TRUNCATED):
        np.testing.assert_array_equal(cols[name][rows[::-1]], group[name][:][::-1], err_msg=name)


def test_open_does_not_read_per_step_chunks(tmp_path):
    """A store whose metadata says 2M rows opens without reading per-step data."""
    n = 2_000_000
    lengths = [1000] * (n // 1000)
    meta = {"episodes": {"length": lengths, "terminated": [True] * len(lengths)}, "complete": True}
    group = create_store(zarr.storage.LocalStore(tmp_path / "big.zarr"), n, meta)
    # a complete store holds every chunk; only those the batch reads are written here
    for name in ("observation", "action", "next/reward"):
        array = for_writing(group[name])
        step = int(array.shards[0] if array.shards else array.chunks[0])
        for lo in (0, (n - 1) // step * step):
            hi = min(lo + step, n)
            array[lo:hi] = np.zeros((hi - lo, *array.shape[1:]), dtype=array.dtype)
    group.attrs[ATTRS_KEY] = {**group.attrs[ATTRS_KEY], "complete": True}
    ds = AtariZarrDataset(str(tmp_path / "big.zarr"))
    assert len(ds) == n
    assert not ds._store.action._loaded.any()
    b = ds[[0, 999, n - 1]]
    assert b["observation"].sum() == 0
    assert b["episode"].tolist() == [0, 0, len(lengths) - 1]
    assert b["next", "terminated"][:, 0].tolist() == [False, True, True]
    assert int(ds._store.action._loaded.sum()) == 2


def test_step_columns_are_read_with_the_stores_options(pong_store):
    """The user's options reach the columns' engines (coalescing, encoded bytes kept),
    and a mixture's columns never join its shared frame cache."""
    from atari_zarr.read.options import ReadOptions
    from atari_zarr.read.store import StoreReader

    options = ReadOptions(coalesce_gap=12_345).divided(4)
    store = StoreReader(pong_store.url, options=options)
    for name in ("action", "next/reward"):
        reader = store.columns[name].reader
        assert reader.engine.coalesce_gap == 12_345
        assert reader._cache is None and reader._budget is None
    assert store.frames._budget is options.budget
