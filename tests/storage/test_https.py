"""Stores read over plain http(s): a public bucket's object URLs, here fake-gcs-server's.

``http://127.0.0.1:PORT/bucket/Pong/1.zarr`` is how a public bucket is read without
credentials or a cloud SDK (``https://storage.googleapis.com/bucket/...`` for real).
Zarr needs no listing: the root ``zarr.json`` carries the consolidated metadata.
Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import RemoteAccessError, StoreWriteError
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.remote import open_zarr_store

pytestmark = pytest.mark.timeout(300)

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


def test_a_connection_dropped_mid_body_is_retried(public) -> None:
    """A reset after half the body is transient, as for gs:// and s3://: retried, exact."""
    proxy = public["proxy"]
    local = AtariZarrDataset(public["local"])
    ds = AtariZarrDataset(public["url"])
    rows = np.array([5, 250, 430])
    proxy.reset()
    proxy.drop_next(2)
    _same(ds[rows], local[rows])
    statuses = [(e[2], e[3]) for e in proxy.log]
    assert len(proxy.log) >= 3, statuses  # two cut, then whole
    # an epoch of the stream with a drop in its middle is still every row once, exact
    remote = AtariZarrDataset(public["url"])
    stream = iter(remote.stream(100, seed=1))
    got = [next(stream)]
    proxy.drop_next(1)
    got.extend(stream)
    want = list(local.stream(100, seed=1))
    for a, b in zip(got, want, strict=True):
        _same(a, b)


def test_the_proxy_answers_head_without_a_body(public) -> None:
    import socket
    import urllib.parse

    proxy = public["proxy"]
    proxy.fail_next(1, 503)
    url = urllib.parse.urlsplit(public["url"] + "/zarr.json")
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(f"HEAD {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(4096)
        head, rest = data.split(b"\r\n\r\n", 1)
        sock.settimeout(0.5)
        try:
            rest += sock.recv(4096)
        except TimeoutError:
            pass
    assert head.startswith(b"HTTP/1.1 503") or head.startswith(b"HTTP/1.0 503"), head
    assert rest == b"", rest  # a HEAD answer has no body


def test_reading_verbs_work_over_http(public, capsys) -> None:
    """info and verify answer over http(s) as over gs://; ls of one store answers its row,
    ls of a root is a clear error (http has no listing), a refused connection is not
    "does not exist"."""
    from atari_zarr_testkit.ports import fresh_port

    from atari_zarr.cli import main

    url = public["url"]
    assert main(["info", "--json", url]) == 0
    import json

    info = json.loads(capsys.readouterr().out)
    assert info["complete"] is True and info["transitions"] == len(AtariZarrDataset(url))
    assert main(["verify", "-q", url]) == 0, capsys.readouterr()
    out = capsys.readouterr()
    assert "missing" not in out.out + out.err
    assert main(["ls", "--json", url]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["status"] == "complete" and row["transitions"] == info["transitions"]
    root = url.rsplit("/Pong/", 1)[0]
    assert main(["ls", root]) == 1
    err = capsys.readouterr().err
    assert "cannot be listed" in err and "no stores found" not in err
    dead = f"http://127.0.0.1:{fresh_port()}/b/Pong/1.zarr"
    assert main(["info", dead, "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert "does not exist" not in err and "Cannot connect" in err, err


def test_bytes_changed_in_transit_are_fetched_again_before_damage(public) -> None:
    from atari_zarr.errors import StoreCorruptError

    proxy = public["proxy"]
    local = AtariZarrDataset(public["local"])
    ds = AtariZarrDataset(public["url"])
    rows = np.array([150])  # one chunk: the changed byte lands in it
    ds[np.array([0])]  # the shard indexes are known: the next requests are chunk bytes
    proxy.reset()
    proxy.corrupt_next(1)
    _same(ds[rows], local[rows])  # a changed byte once: fetched again, exact
    assert proxy.requests >= 2
    # changed every time: damage, after the second fetch
    ds = AtariZarrDataset(public["url"])
    ds[np.array([0])]
    proxy.corrupt_next(50)
    with pytest.raises(StoreCorruptError, match="crc32c"):
        ds[np.array([300])]
    proxy.reset()


def test_a_server_that_ignores_range_is_named_not_the_store(tmp_path) -> None:
    """``python -m http.server`` answers a ranged GET with 200 and the whole object: the
    store was called damaged ("write it again"). The server is named as not serving
    byte ranges, and the store as not damaged."""
    import torch
    from atari_zarr_testkit import write_two_runs
    from atari_zarr_testkit.web import DirectoryServer

    from atari_zarr.errors import RemoteAccessError, StoreCorruptError

    root = write_two_runs(tmp_path)
    with DirectoryServer(root) as server:
        ds = AtariZarrDataset(f"{server.endpoint_url}/Pong/1.zarr")
        with pytest.raises(RemoteAccessError) as info:
            ds.sample(8, generator=torch.Generator().manual_seed(0))
    text = str(info.value)
    assert not isinstance(info.value, StoreCorruptError)
    assert "\n" not in text and "does not serve byte ranges" in text, text
    assert "not damaged" in text and "Pong/1.zarr/" in text


# entries of a crafted shard index (valid crc32c, fingerprints recorded again): a range
# ending past 2**64, one starting far past the object (a 416), half an absent marker
_CRAFTED = {
    "wraps": (2**64 - 50, 60),
    "far": (2**40, 100),
    "half-absent": (2**64 - 1, 100),
}


def test_a_crafted_shard_index_over_http_is_damage_named_in_one_line(
    pong_store, tmp_path: Path
) -> None:
    """Over http, an entry no object can satisfy is never sent as a range a server
    ignores (then "does not serve byte ranges; the store is not damaged") nor met as a
    416 (then a network failure): the chunk is cut short, and every read says so in one
    line naming the shard's object, as it does locally."""
    from atari_zarr_testkit import craft_index_entry

    from atari_zarr.errors import StoreCorruptError
    from atari_zarr.verify import verify_store

    with FakeGCSServer() as server:
        server.create_bucket(BUCKET)
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
        for name, entry in _CRAFTED.items():
            local = tmp_path / name
            shutil.copytree(pong_store.url, local)
            craft_index_entry(local, "observation", 0, 3, entry)
            fs.put(str(local), f"{BUCKET}/{name}/Pong/1.zarr", recursive=True)
        for name in _CRAFTED:
            for url in (str(tmp_path / name), f"{server.endpoint_url}/{BUCKET}/{name}/Pong/1.zarr"):
                ds = AtariZarrDataset(url)
                for read in (
                    lambda ds=ds: ds[np.arange(40, 70)],
                    lambda ds=ds: list(ds.stream(64, seed=1)),
                ):
                    with pytest.raises(StoreCorruptError) as err:
                        read()
                    text = str(err.value)
                    assert "\n" not in text and "'observation/c/0/0/0'" in text, (name, url, text)
                    assert "is cut short" in text and "is damaged" in text, (name, url, text)
                report = verify_store(url).format()
                assert "rows [48]" in report and "is cut short" in report, (name, url, report)
