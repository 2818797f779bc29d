"""The stream from a bucket (fake-gcs-server on 127.0.0.1) and under faults.

Remote equals local; a 503 mid-stream is retried and the epoch stays exact; a server
that disappears gives a clear error within the deadline; a damaged chunk names its
shard and chunk; a process killed mid-epoch is resumed by another from its saved state
(resuming in-process is in ``test_stream.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

from atari_zarr import AtariZarrDataset
from atari_zarr.errors import RemoteAccessError, StoreCorruptError
from tests.read.test_stream import rows_of, write_store

pytestmark = pytest.mark.timeout(300)

BUCKET = "atari-stream"
UNIT = 1024  # rows per read unit: several units per shard of the small store


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_store(str(tmp_path_factory.mktemp("faults") / "Pong" / "1.zarr"), 9000)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeGCSServer]:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


@pytest.fixture(scope="module")
def remote(server: FakeGCSServer, local_store: str) -> Iterator[dict[str, Any]]:
    """The local store uploaded to the bucket, read through a counting proxy."""
    fs = fsspec.filesystem("gs", **server.storage_options())
    fs.put(local_store, f"{BUCKET}/stores/Pong/1.zarr", recursive=True)
    fs.invalidate_cache()
    size = fs.du(f"{BUCKET}/stores/Pong/1.zarr")
    with CountingProxy(server.endpoint_url) as proxy:
        yield {
            "url": f"gs://{BUCKET}/stores/Pong/1.zarr",
            "opts": server.storage_options(endpoint_url=proxy.endpoint_url),
            "proxy": proxy,
            "size": size,
        }


def same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key in y.keys(include_nested=True, leaves_only=True):
            np.testing.assert_array_equal(x[key].numpy(), y[key].numpy(), err_msg=str(key))


def test_remote_stream_equals_local_with_whole_shard_requests(
    remote: dict[str, Any], local_store: str
) -> None:
    proxy: CountingProxy = remote["proxy"]
    want = list(AtariZarrDataset(local_store, frame_stack=2).stream(1000, seed=3))
    ds = AtariZarrDataset(remote["url"], storage_options=remote["opts"], frame_stack=2)
    proxy.reset()
    got = list(ds.stream(1000, seed=3))
    same_batches(got, want)
    frames = [e for e in proxy.log if "%2Fobservation%2F" in e[1]]
    whole = [e for e in frames if e[2] == 200]
    assert len(whole) == 3  # 9000 frames: three shards, each one whole-object request
    # and around each, a shard index and a chunk: the frames just outside the unit
    assert len(frames) <= 3 + 2 * 4, frames
    # everything fetched: the shards once, the frames around them, the per-step arrays
    assert proxy.bytes_received <= 1.05 * remote["size"], (proxy.bytes_received, remote["size"])


def test_a_503_mid_stream_is_retried_and_the_epoch_is_exact(
    remote: dict[str, Any], local_store: str
) -> None:
    proxy: CountingProxy = remote["proxy"]
    opts = {"seed": 8, "unit_rows": UNIT, "units_ahead": 1, "shuffle_buffer": 2 * UNIT}
    want = list(AtariZarrDataset(local_store).stream(300, **opts))
    ds = AtariZarrDataset(remote["url"], storage_options=remote["opts"])
    got = []
    proxy.reset()
    for batch in ds.stream(300, **opts):  # 2 units mixed, 1 fetched ahead
        got.append(batch)
        if len(got) == 1:
            proxy.fail_next(1, 503)
    assert [e[2] for e in proxy.log].count(503) == 1, proxy.log
    same_batches(got, want)
    assert sorted(rows_of(got).tolist()) == list(range(len(ds)))


def test_server_gone_mid_stream_fails_clearly_within_the_deadline(local_store: str) -> None:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        fs = fsspec.filesystem("gs", **srv.storage_options())
        fs.put(local_store, f"{BUCKET}/gone/Pong/1.zarr", recursive=True)
        ds = AtariZarrDataset(
            f"gs://{BUCKET}/gone/Pong/1.zarr", storage_options=srv.storage_options(), timeout=2
        )
        stream = iter(ds.stream(256, seed=0, unit_rows=UNIT, units_ahead=1, shuffle_buffer=UNIT))
        next(stream)
        srv.kill()
        started = time.monotonic()
        with pytest.raises(RemoteAccessError, match=rf"gs://{BUCKET}/gone/Pong/1\.zarr"):
            for _ in stream:
                pass
        # a timeout or a refused connection, well before gcsfs's own ~32 s of retries
        assert time.monotonic() - started < 20


def test_a_damaged_chunk_names_its_shard_and_chunk(tmp_path: Path) -> None:
    path = write_store(str(tmp_path / "bad.zarr"), 5000, final=False)
    shard = Path(path) / "observation" / "c" / "1" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(raw[: 16 * 256]), dtype="<u8").reshape(-1, 2)
    off, nb = (int(x) for x in index[5])
    raw[off + nb // 2] ^= 0xFF  # inside chunk 5 of shard 1: global chunk 256 + 5
    shard.write_bytes(bytes(raw))
    ds = AtariZarrDataset(path)
    with pytest.raises(StoreCorruptError, match=r"chunk 261 of array 'observation'.*c/1/0/0"):
        list(ds.stream(512, seed=0))
    with pytest.raises(StoreCorruptError, match=r"fails its crc32c check"):
        list(ds.stream(512, seed=0, unit_rows=UNIT))


# A training job: each batch's rows go to a log, the model trains, then the stream's state
# and every row seen so far go to one checkpoint, replaced atomically. The checkpoint is the
# truth; the log may hold one batch more (emitted, not yet checkpointed: sent again).
TRAINER = """
import json, os, sys, time
from atari_zarr import AtariZarrDataset

url, out, batch_size, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ds = AtariZarrDataset(url)
stream = ds.stream(batch_size, seed=seed, shuffle=True, unit_rows=64, shuffle_buffer=128)
seen = []
for batch in stream:
    rows = batch["index"].tolist()
    with open(os.path.join(out, "emitted.jsonl"), "a") as log:
        log.write(json.dumps(rows) + "\\n")
    time.sleep(0.05)  # the training step: a kill here loses a batch the model has seen
    seen += rows
    tmp = os.path.join(out, "checkpoint.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"state": stream.state_dict(), "seen": seen}, f)
    os.replace(tmp, os.path.join(out, "checkpoint.json"))
"""


@pytest.mark.slow
def test_a_process_killed_mid_epoch_is_resumed_by_another_with_every_row_once(
    pong_store, tmp_path: Path
) -> None:
    batch_size, seed = 16, 11
    options = {"shuffle": True, "unit_rows": 64, "shuffle_buffer": 128}
    checkpoint = tmp_path / "checkpoint.json"
    with open(tmp_path / "stderr.txt", "wb") as err:
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                TRAINER,
                pong_store.url,
                str(tmp_path),
                str(batch_size),
                str(seed),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60  # the child imports torch first
        while not checkpoint.exists() or len(json.loads(checkpoint.read_text())["seen"]) < 80:
            assert child.poll() is None, (tmp_path / "stderr.txt").read_text()
            assert time.monotonic() < deadline, "the child emitted no batches within 60 s"
            time.sleep(0.005)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    ds = AtariZarrDataset(pong_store.url)
    n = len(ds)
    saved = json.loads(checkpoint.read_text())
    seen, state = saved["seen"], saved["state"]
    assert 80 <= len(seen) < n, "killed mid-epoch"
    assert state["positions"] == {"0": len(seen)} and state["consumers"] == 1
    lines = (tmp_path / "emitted.jsonl").read_text().split("\n")[:-1]  # whole lines only
    emitted = [r for line in lines for r in json.loads(line)]
    assert emitted[: len(seen)] == seen and len(emitted) - len(seen) in (0, batch_size)

    # another process (this one) resumes from the checkpoint: the seed comes with the state
    resumed = ds.stream(batch_size, seed=0, **options)
    resumed.load_state_dict(state)
    rest = rows_of(list(resumed)).tolist()
    assert sorted(seen + rest) == list(range(n))  # every row once: none repeated, none missing
    assert resumed.state_dict()["positions"] == {0: n}
    # what was emitted after the checkpoint is sent again, the same rows in the same order,
    # and the two halves are the uninterrupted epoch
    assert rest[: len(emitted) - len(seen)] == emitted[len(seen) :]
    assert seen + rest == rows_of(list(ds.stream(batch_size, seed=seed, **options))).tolist()

    # the state of one consumer resumes on two ranks just as well: the rest, each row once
    halves = []
    for rank in range(2):
        ranks = ds.stream(batch_size, rank=rank, world_size=2, **options)
        ranks.load_state_dict(state)
        halves.append(rows_of(list(ranks)).tolist())
    both = seen + halves[0] + halves[1]
    assert set(both) == set(range(n)) and len(both) - n <= 1  # one repeat pads a short rank
