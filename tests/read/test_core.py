"""The one dataset behind every front door, and the one frozen ReadOptions it is read with.

Random access (``StoreReader.read_items``) and the stream (``UnitReader``) gather their
frames and steps in their own ways and assemble batches with one function: every item of
every door, on every fixture kind, is the same key by key whichever way it was read, and
after pickling.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from atari_zarr_testkit import write_fixture_rlu

from atari_zarr import AtariZarrDataset, MultiGameDataset, ReadOptions, convert
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.core import ItemDataset
from tests.read.test_prefetch import _memory_copy


@pytest.fixture(scope="module")
def rlu_url(tmp_path_factory) -> str:
    """RL Unplugged shards (terminal frames kept in final_observation), converted."""
    fixture = write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=2, present=(0, 1))
    [store] = convert(
        fixture.root, str(tmp_path_factory.mktemp("rlu-out")), progress=False,
        scheduler="synchronous",
    )
    return store.url


@pytest.fixture(scope="module")
def collected_url(tmp_path_factory) -> str:
    """Real ALE play recorded by the collector (final frames kept, episodes truncated)."""
    from atari_zarr import collect
    from atari_zarr.ale import make_dqn_env

    path = str(tmp_path_factory.mktemp("collected") / "breakout.zarr")
    collect(make_dqn_env("Breakout", max_episode_steps=90), path, steps=400, seed=3).close()
    return path


def _door(name: str, pong: str, rlu: str, kind: str, collected: str = ""):
    url = {"dqn_replay": pong, "rl_unplugged": rlu, "collected": collected}[kind]
    if name == "transitions":
        return AtariZarrDataset(url)
    if name == "stacked":
        return AtariZarrDataset(url, frame_stack=4)
    if name == "windows":
        return AtariZarrDataset(url, frame_stack=3).windows(5, pad=True)
    if name == "multi":
        return MultiGameDataset([url, pong, rlu], weights=[1, 3, 2], frame_stack=2)
    if name == "multi-windows":
        return MultiGameDataset([url, pong], frame_stack=2).windows(4)
    raise AssertionError(name)


def _keys(td) -> list:
    return sorted(td.keys(include_nested=True, leaves_only=True), key=str)


def _same(a, b) -> None:
    assert _keys(a) == _keys(b)
    for key in _keys(a):
        x, y = a[key], b[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x.contiguous(), y.contiguous()), key


def _by_item(td):
    """Batch rows sorted by the global index of their first row (unique per item)."""
    first = td["index"] if td["index"].ndim == 1 else td["index"][:, 0]
    return td[torch.argsort(first)]


DOORS = ["transitions", "stacked", "windows", "multi", "multi-windows"]


@pytest.mark.parametrize("kind", ["dqn_replay", "rl_unplugged", "collected"])
@pytest.mark.parametrize("door", DOORS)
def test_every_door_reads_an_item_alike_at_random_in_the_stream_and_after_pickling(
    pong_store, rlu_url, collected_url, door, kind
) -> None:
    ds = _door(door, pong_store.url, rlu_url, kind, collected_url)
    assert isinstance(ds, ItemDataset)
    every = ds[np.arange(len(ds))]
    # the stream (units read whole, items gathered from a slab) against random access
    streamed = torch.cat(list(ds.stream(37, seed=3, unit_rows=64)))
    assert len(streamed) == len(ds)
    _same(_by_item(streamed), _by_item(every))
    # random batches, in any order, with repeats
    rows = torch.randint(0, len(ds), (50,), generator=torch.Generator().manual_seed(1))
    batch = ds[rows]
    _same(batch, every[rows])
    # what a DataLoader worker gets: the dataset pickled, its stores opened again
    again = pickle.loads(pickle.dumps(ds))
    assert type(again) is type(ds) and len(again) == len(ds)
    _same(again[rows], batch)
    _same(again.sample(16, generator=torch.Generator().manual_seed(4)),
          ds.sample(16, generator=torch.Generator().manual_seed(4)))


def test_the_doors_are_thin_constructors_of_one_core() -> None:
    from atari_zarr.read.mixing import MultiGameDataset as Multi
    from atari_zarr.read.windows import WindowDataset

    for door in (AtariZarrDataset, WindowDataset, Multi):
        assert issubclass(door, ItemDataset)
        for name in ("sample", "sample_iter", "stream", "__getitem__", "__getitems__",
                     "__getstate__", "fetch_ahead"):
            assert name not in vars(door), f"{door.__name__} re-implements {name}"


def test_read_options_are_frozen_and_no_class_attribute_tunes_every_reader(pong_store) -> None:
    opts = ReadOptions(frame_cache_bytes=1 << 20, kept_bytes=0, prefetch=2, threads=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.prefetch = 3  # type: ignore[misc]
    for attr in ("frame_cache_bytes", "coalesce_gap", "kept_bytes"):
        assert not hasattr(AtariZarrDataset, attr)
    ds = AtariZarrDataset(pong_store.url, options=opts, timeout=7)
    assert ds.options.timeout == 7 and ds.options.prefetch == 2
    assert ds._store.frames.cache_bytes == 1 << 20 and ds._store.frames.threads == 1
    # a worker opens the store again with the same options
    again = pickle.loads(pickle.dumps(ds))
    assert again.options == ds.options and again._store.frames.cache_bytes == 1 << 20
    # another dataset is not touched: it has the default, a quarter of memory
    quarter = ReadOptions(frame_cache_bytes="25%").frame_cache_limit()
    assert AtariZarrDataset(pong_store.url)._store.frames.cache_bytes == quarter
    # which a MultiGameDataset's stores divide among themselves
    mix = MultiGameDataset([pong_store.url] * 4)
    assert all(abs(d._store.frames.cache_bytes - quarter // 4) <= 1 for d in mix.datasets)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"frame_cache_bytes": "lots"}, "frame_cache_bytes"),
        ({"frame_cache_bytes": "120%"}, "frame_cache_bytes"),
        ({"frame_cache_bytes": -1}, "frame_cache_bytes"),
        ({"coalesce_gap": -2}, "coalesce_gap"),
        ({"kept_bytes": 1.5}, "kept_bytes"),
        ({"prefetch": -1}, "prefetch"),
        ({"threads": 0}, "threads"),
    ],
)
def test_bad_read_options_are_one_line(kwargs, named) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        ReadOptions(**kwargs)
    message = str(err.value)
    assert "\n" not in message and named in message and "Pass" in message


def test_a_share_of_memory_is_worked_out_here_and_divided_among_workers(pong_store) -> None:
    from atari_zarr.resources import memory_bytes

    assert memory_bytes() > 0
    assert ReadOptions(frame_cache_bytes="25%").frame_cache_limit() == memory_bytes() // 4
    assert ReadOptions(frame_cache_bytes="0%").frame_cache_limit() == 0
    assert ReadOptions(frame_cache_bytes="25%").frame_cache_limit(2) == memory_bytes() // 8
    assert ReadOptions(frame_cache_bytes=1000).frame_cache_limit(2) == 1000  # bytes are bytes
    # in a DataLoader worker of two, the store's readers get half the dataset's share
    ds = AtariZarrDataset(pong_store.url)
    loader = torch.utils.data.DataLoader(
        _CacheSize(ds), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    assert set(loader) == {ReadOptions().frame_cache_limit(2)}


class _CacheSize(torch.utils.data.Dataset):
    def __init__(self, ds) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        return self.ds._store.frames.cache_bytes


def test_memory_stays_within_read_options(pong_store) -> None:
    """Decoded chunks and encoded bytes each stay within their bound, after many reads
    and fetches ahead; fetched bytes are held once, by the engine."""
    import fsspec

    url = _memory_copy(pong_store.url, "core-bounds")
    try:
        probe = AtariZarrDataset(url)
        grid = probe._store.frames.grid
        chunk_bytes = grid.chunk_nbytes
        opts = ReadOptions(frame_cache_bytes=3 * chunk_bytes, kept_bytes=5000, prefetch=3)
        ds = AtariZarrDataset(url, frame_stack=4, options=opts)
        g = torch.Generator().manual_seed(0)
        for batch in ds.sample_iter(16, batches=20, generator=g):
            frames, engine = ds._store.frames, ds._store.engine
            assert frames.cached_chunks <= 3
            slab = None if frames._cache is None else frames._cache.slab
            assert slab is None or slab.nbytes <= 3 * chunk_bytes
            assert engine.kept.nbytes <= 5000
            assert len(batch) == 16
        assert not hasattr(ds._store.frames, "_fetched")  # the reader keeps decoded chunks only
        # with room, what was fetched ahead is read from the engine's cache: no request
        roomy = AtariZarrDataset(url, options=ReadOptions(frame_cache_bytes=0))
        rows = np.arange(0, len(roomy), 7)
        roomy.fetch_ahead(rows)
        roomy._store.frames._sources([])  # nothing to wait for
        for fut in list(roomy._store.frames._fetching.values()):
            fut.result()
        before = roomy._store.engine.stats["requests"]
        roomy[rows]
        assert roomy._store.engine.stats["requests"] == before
        assert roomy._store.engine.stats["kept_hits"] > 0
    finally:
        fsspec.filesystem("memory").rm("/core-bounds", recursive=True)
