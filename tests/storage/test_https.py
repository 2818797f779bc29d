"""Stores read over plain http(s): a public bucket's object URLs, here fake-gcs-server's.

``http://127.0.0.1:PORT/bucket/Pong/1.zarr`` is how a public bucket is read without
credentials or a cloud SDK (``https://storage.googleapis.com/bucket/...`` for real).
Zarr needs no listing: the root ``zarr.json`` carries the consolidated metadata.
Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import RemoteAccessError, StoreWriteError
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.remote import open_zarr_store
from atari_zarr.testing.gcs import CountingProxy, FakeGCSServer

pytestmark = pytest.mark.timeout(180)

BUCKET = "public-atari"
KEYS = ("observation", ("next", "observation"), "action", ("next", "reward"), "index", "episode")


def _same(a, b) -> None:
    for key in KEYS:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def public(pong_store) -> Iterator[dict]:
    """The session's store uploaded to the emulator, read through a counting proxy."""
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket(BUCKET)
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
        fs.put(pong_store.url, f"{BUCKET}/Pong/1.zarr", recursive=True)
        yield {
            "url": f"{proxy.endpoint_url}/{BUCKET}/Pong/1.zarr",
            "proxy": proxy,
            "local": pong_store.url,
        }


def test_read_over_http_equals_local(public) -> None:
    proxy = public["proxy"]
    proxy.reset()
    ds = AtariZarrDataset(public["url"])
    opened = [e[1] for e in proxy.log]
    assert opened[0].endswith("/Pong/1.zarr/zarr.json"), opened  # no listing, no v2 probes
    assert len(opened) <= 6, opened
    local = AtariZarrDataset(public["local"])
    rows = np.random.default_rng(0).integers(0, len(ds), 64)
    _same(ds[rows], local[rows])
    _same(ds[:], local[:])


def test_random_batches_with_prefetch_over_http(public) -> None:
    proxy = public["proxy"]
    ds = AtariZarrDataset(public["url"])
    local = AtariZarrDataset(public["local"])
    g1, g2 = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    proxy.reset()
    for a in ds.sample_iter(64, batches=6, prefetch=3, generator=g1):
        _same(a, local.sample(64, generator=g2))
    frame_gets = [e for e in proxy.log if "/observation/" in e[1]]
    # one shard: its index, then merged ranges, never one request per chunk
    assert 0 < len(frame_gets) <= 4, frame_gets
    assert all(e[2] == 206 for e in frame_gets), frame_gets


def test_stream_one_epoch_over_http(public) -> None:
    remote = AtariZarrDataset(public["url"], frame_stack=4)
    local = AtariZarrDataset(public["local"], frame_stack=4)
    got = list(remote.stream(100, seed=3))
    want = list(local.stream(100, seed=3))
    assert len(got) == len(want) > 1
    for a, b in zip(got, want, strict=True):
        _same(a, b)
    seen = torch.cat([b["index"] for b in got])
    assert sorted(seen.tolist()) == list(range(len(remote)))


def test_transient_errors_are_retried_and_permanent_ones_clear(public) -> None:
    proxy = public["proxy"]
    local = AtariZarrDataset(public["local"])
    ds = AtariZarrDataset(public["url"])
    rows = np.array([3, 333])
    proxy.reset()
    proxy.fail_next(2, 503)
    _same(ds[rows], local[rows])
    assert [e[2] for e in proxy.log].count(503) == 2, proxy.log
    ds = AtariZarrDataset(public["url"])
    proxy.fail_next(1, 403)
    with pytest.raises(RemoteAccessError, match=r"reading http://127\.0\.0\.1:\d+/public-atari/"):
        ds[[7]]
    ds[[7]]  # the next read works again


def test_writing_over_http_is_refused(public, pong_source) -> None:
    dest = public["url"].rsplit("/Pong/", 1)[0] + "/written"
    root = str(Path(pong_source.url).parents[1])
    proxy = public["proxy"]
    proxy.reset()
    with pytest.raises(StoreWriteError, match=r"http:// is read-only") as info:
        convert(root, dest, progress=False)
    assert "\n" not in str(info.value) and dest in str(info.value)
    assert not [e for e in proxy.log if e[0] in ("PUT", "POST", "DELETE")], proxy.log
    with pytest.raises(StoreWriteError, match="read-only"):
        open_zarr_store(public["url"], read_only=False)
    fs, path = get_fs(dest)
    with pytest.raises(StoreWriteError, match="read-only"):
        fs.pipe_file(f"{path}/x", b"1")
    with pytest.raises(StoreWriteError, match="read-only"):
        fs.open(f"{path}/x", "wb")
