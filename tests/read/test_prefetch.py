"""Random batches with the next batches fetched ahead: the same batches, fewer requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from atari_zarr import AtariZarrDataset
from atari_zarr.errors import InvalidArgumentError

KEYS = ("observation", ("next", "observation"), "action", ("next", "reward"), "index", "episode")


def _same(a, b) -> None:
    for key in KEYS:
        assert torch.equal(a[key], b[key]), key


def _memory_copy(store_url: str, name: str) -> str:
    """The store copied into fsspec's memory file system: a remote store without a server."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for path in Path(store_url).rglob("*"):
        if path.is_file():
            fs.pipe(f"/{name}/{path.relative_to(store_url)}", path.read_bytes())
    return f"memory://{name}"


@pytest.mark.parametrize("frame_stack", [1, 4])
def test_prefetch_gives_the_batches_of_sample(pong_store, frame_stack):
    url = _memory_copy(pong_store.url, f"prefetch-{frame_stack}")
    try:
        remote = AtariZarrDataset(url, frame_stack=frame_stack)
        local = AtariZarrDataset(pong_store.url, frame_stack=frame_stack)
        g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        ahead = list(remote.sample_iter(32, batches=7, prefetch=3, generator=g1))
        plain = [local.sample(32, generator=g2) for _ in range(7)]
        assert len(ahead) == 7
        for a, b in zip(ahead, plain, strict=True):
            _same(a, b)
        # the generator is where the plain calls left it: nothing drawn beyond the 7 batches
        assert torch.equal(g1.get_state(), g2.get_state())
        stats = remote._store.frames.stats
        assert stats["fetched_ahead"] > 0
        # fetched ahead, so the reads found their bytes: fewer requests than chunks decoded
        assert stats["requests"] < stats["decoded"]
    finally:
        import fsspec

        fsspec.filesystem("memory").rm(url[len("memory://") :], recursive=True)


def test_prefetch_zero_and_local_stores(pong_store):
    ds = AtariZarrDataset(pong_store.url)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for prefetch in (0, 2):
        got = list(ds.sample_iter(16, batches=3, prefetch=prefetch, generator=g1))
        want = [ds.sample(16, generator=g2) for _ in range(3)]
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    assert ds._store.frames.stats["fetched_ahead"] == 0  # a local store is a memory map
    endless = ds.sample_iter(8, prefetch=1)
    assert [len(next(endless)) for _ in range(5)] == [8] * 5


@pytest.mark.parametrize("prefetch", [-1, 1.5, True])
def test_prefetch_must_be_a_count(pong_store, prefetch):
    ds = AtariZarrDataset(pong_store.url)
    with pytest.raises(InvalidArgumentError, match="prefetch must be a non-negative integer"):
        next(ds.sample_iter(8, prefetch=prefetch))


def test_a_failed_prefetch_is_reported_by_the_read(pong_store, monkeypatch):
    """Bytes that could not be fetched ahead are asked for again by the read itself."""
    import fsspec

    url = _memory_copy(pong_store.url, "prefetch-fail")
    try:
        ds = AtariZarrDataset(url)
        frames = ds._store.frames
        rows = np.array([1, 200, 400])
        real_fetch = frames.engine.fetch

        def refuse(cids):
            raise OSError("connection reset")

        monkeypatch.setattr(frames.engine, "fetch", refuse)
        assert frames.fetch_ahead(rows).result() is None  # the failure is not raised here
        with pytest.raises(OSError, match="connection reset"):
            ds[rows]  # the read asks again, and reports the failure itself
        monkeypatch.setattr(frames.engine, "fetch", real_fetch)
        _same(ds[rows], AtariZarrDataset(pong_store.url)[rows])
    finally:
        fsspec.filesystem("memory").rm("/prefetch-fail", recursive=True)


def test_mixture_prefetch_gives_the_batches_of_sample(pong_store):
    import fsspec

    from atari_zarr.read.mixing import MultiGameDataset

    url = _memory_copy(pong_store.url, "prefetch-mix")
    try:
        remote = MultiGameDataset([url, pong_store.url], weights=[0.7, 0.3])
        local = MultiGameDataset([pong_store.url, pong_store.url], weights=[0.7, 0.3])
        g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        got = list(remote.sample_iter(32, batches=5, prefetch=2, generator=g1))
        for a in got:
            b = local.sample(32, generator=g2)
            _same(a, b)
            assert torch.equal(a["game_id"], b["game_id"])
        assert torch.equal(g1.get_state(), g2.get_state())
        assert remote.datasets[0]._store.frames.stats["fetched_ahead"] > 0
        with pytest.raises(InvalidArgumentError, match="prefetch must be"):
            next(remote.sample_iter(8, prefetch=-2))
    finally:
        fsspec.filesystem("memory").rm("/prefetch-mix", recursive=True)


def test_the_local_range_cache_serves_other_rows_of_fetched_chunks(pong_store, tmp_path):
    """Through cache=, ranges stay one per chunk: any later batch finds its chunks there."""
    import fsspec

    url = _memory_copy(pong_store.url, "prefetch-cache")
    try:
        rows = np.random.default_rng(4).integers(0, 430, 200)
        first = AtariZarrDataset(url, cache=tmp_path / "cache")
        first[rows]
        again = AtariZarrDataset(url, cache=tmp_path / "cache")
        store = again._store.frames.array.store_path.store
        before = store.misses
        _same(again[rows[::3]], AtariZarrDataset(pong_store.url)[rows[::3]])
        assert store.misses == before  # every chunk (and shard index) came from the cache
    finally:
        fsspec.filesystem("memory").rm("/prefetch-cache", recursive=True)
