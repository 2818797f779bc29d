"""s3:// stores on moto's S3 server: conversion into a bucket, random batches and the
epoch stream out of it, faults with clear errors and no credentials in them.

Everything talks to 127.0.0.1 only (moto's server, started by the module fixture).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from atari_zarr_testkit import write_fixture_run
from atari_zarr_testkit.proxy import CountingProxy
from atari_zarr_testkit.s3 import SECRET_KEY, MotoS3Server

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.catalog import list_stores, store_state
from atari_zarr.errors import RemoteAccessError, RemoteTimeoutError

pytestmark = pytest.mark.timeout(300)

BUCKET = "atari-s3"
KEYS = ("observation", ("next", "observation"), "action", ("next", "reward"), "index", "episode")


def _same(a: Any, b: Any) -> None:
    for key in KEYS:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two checkpoints of a small run converted into the bucket (and locally, to compare)."""
    root = tmp_path_factory.mktemp("s3-src")
    run = write_fixture_run(str(root), "Pong", "1", capacity=64, steps=200, seed=4)
    local_root = str(tmp_path_factory.mktemp("s3-local"))
    [local] = convert(str(root), local_root, checkpoints="0-1", progress=False)
    with MotoS3Server() as server:
        server.create_bucket(BUCKET)
        opts = server.storage_options()
        [store] = convert(
            str(root),
            f"s3://{BUCKET}/stores",
            checkpoints="0-1",
            progress=False,
            storage_options=opts,
            source_storage_options={},
        )
        yield {
            "server": server,
            "opts": opts,
            "store": store,
            "local": local.url,
            "truth": run.truth([0, 1]),
        }


def test_convert_into_s3_and_read_back(s3: dict[str, Any]) -> None:
    store, opts = s3["store"], s3["opts"]
    assert store.url == f"s3://{BUCKET}/stores/Pong/1.zarr"
    assert store_state(store.url, opts) == "complete"
    [row] = list_stores(f"s3://{BUCKET}/stores", opts)
    assert (row["game"], row["run"], row["status"]) == ("Pong", "1", "complete")
    truth = s3["truth"]
    ds = AtariZarrDataset(store.url, storage_options=opts)
    assert len(ds) == len(truth) == store.transitions
    batch = ds[:]
    np.testing.assert_array_equal(batch["observation"].numpy(), truth.observation)
    np.testing.assert_array_equal(batch["next", "observation"].numpy(), truth.next_observation)
    np.testing.assert_array_equal(batch["action"].numpy(), truth.action)


def test_random_batches_and_stream_from_s3_equal_local(s3: dict[str, Any]) -> None:
    remote = AtariZarrDataset(s3["store"].url, storage_options=s3["opts"], frame_stack=4)
    local = AtariZarrDataset(s3["local"], frame_stack=4)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for batch in remote.sample_iter(32, batches=4, prefetch=2, generator=g1):
        _same(batch, local.sample(32, generator=g2))
    got = list(remote.stream(64, seed=1))
    want = list(local.stream(64, seed=1))
    assert len(got) == len(want) > 1
    for a, b in zip(got, want, strict=True):
        _same(a, b)
    assert sorted(torch.cat([b["index"] for b in got]).tolist()) == list(range(len(local)))


def test_s3_errors_are_clear_and_bounded(s3: dict[str, Any]) -> None:
    server: MotoS3Server = s3["server"]
    url = s3["store"].url
    with CountingProxy(server.endpoint_url) as proxy:
        opts = server.storage_options(endpoint_url=proxy.endpoint_url)
        ds = AtariZarrDataset(url, storage_options=opts, timeout=3)
        proxy.fail_next(1, 403)
        with pytest.raises(RemoteAccessError, match=rf"reading {url}/observation") as info:
            ds[[len(ds) - 2]]
        assert SECRET_KEY not in str(info.value)
        ds[[len(ds) - 2]]  # the next read works again
    # the proxy is gone: connections are refused. s3fs retries; the read ends by the
    # deadline at the latest, as a timeout, or earlier when s3fs gives up first (how
    # fast refusals come back decides which): one line naming the URL either way
    started = time.monotonic()
    with pytest.raises((RemoteTimeoutError, RemoteAccessError)) as info:
        ds[[20]]
    assert time.monotonic() - started < 3 + 2
    text = str(info.value)
    assert url in text and SECRET_KEY not in text and "\n" not in text
    if isinstance(info.value, RemoteTimeoutError):
        assert "within 3 s" in text


def test_missing_object_is_not_a_store(s3: dict[str, Any]) -> None:
    url = f"s3://{BUCKET}/absent/Pong/1.zarr"
    assert store_state(url, s3["opts"]) == "absent"
    with pytest.raises(FileNotFoundError, match="1.zarr does not exist: expected"):
        AtariZarrDataset(url, storage_options=s3["opts"])
    assert Path(s3["local"]).exists()
