"""Self-test of ``atari_zarr_testkit.proxy.CountingProxy`` (and its ports).

Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fsspec
import pytest
from atari_zarr_testkit import proxy as proxy_module
from atari_zarr_testkit.gcs import FakeGCSServer
from atari_zarr_testkit.ports import claim_port
from atari_zarr_testkit.proxy import CountingProxy

from atari_zarr.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(300)

BUCKET = "atari-proxy"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeGCSServer]:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


class _Upstream(BaseHTTPRequestHandler):
    """A small target: sized, empty, chunked and truncated bodies, uploads, HEAD."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Location", f"http://{self.headers['Host']}/moved")
            self.end_headers()
            for piece in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/truncated":
            # promises 1000 bytes, sends 10 and hangs up
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"0123456789")
            return
        size = int(self.path.rsplit("/", 1)[-1])
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        self.wfile.write(b"z" * size)

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


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client (the proxy) that hangs up early is no news here


@pytest.fixture()
def upstream() -> Iterator[str]:
    httpd = _QuietServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _connect(proxy: CountingProxy) -> contextlib.closing[http.client.HTTPConnection]:
    """A keep-alive client connection to the proxy, closed when the block ends."""
    return contextlib.closing(http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60))


# --------------------------------------------------------------------------- #
# counting is complete when the client has its response (defect 8)
# --------------------------------------------------------------------------- #


class _HoldAfterResponse:
    """The proxy's writer to its client, frozen right after a response's last byte.

    After the write that completes a response (headers with ``Content-Length: 0``,
    the last byte of a sized body, the last chunk of a chunked one), the proxy thread
    signals ``held`` and waits for ``gate``: whatever the proxy did not count before
    that write is missing while the test looks at the counters, every time.
    """

    def __init__(self, raw: Any, held: threading.Semaphore, gate: threading.Semaphore) -> None:
        self._raw = raw
        self._held = held
        self._gate = gate
        self._remaining: int | None = None
        self._chunked = False

    def write(self, data: bytes) -> int:
        written = self._raw.write(data)
        data = bytes(data)
        if data.startswith(b"HTTP/"):
            head = data.split(b"\r\n\r\n", 1)[0].lower()
            self._chunked = b"transfer-encoding: chunked" in head
            length = re.search(rb"\r\ncontent-length: *(\d+)", head)
            self._remaining = int(length.group(1)) if length else None
            complete = self._remaining == 0
        elif self._chunked:
            complete = data.endswith(b"0\r\n\r\n")
        else:
            self._remaining = (self._remaining or 0) - len(data)
            complete = self._remaining <= 0
        if complete:
            self._held.release()
            assert self._gate.acquire(timeout=60), "the test never let the proxy go on"
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


@pytest.fixture()
def frozen_after_each_response(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Semaphore, threading.Semaphore]]:
    held, gate = threading.Semaphore(0), threading.Semaphore(0)
    setup = proxy_module._ProxyHandler.setup

    def holding_setup(handler: Any) -> None:
        setup(handler)
        handler.wfile = _HoldAfterResponse(handler.wfile, held, gate)

    monkeypatch.setattr(proxy_module._ProxyHandler, "setup", holding_setup)
    try:
        yield held, gate
    finally:
        gate.release(1000)  # never leave a proxy thread waiting


def test_counts_are_complete_when_the_client_has_the_response(
    upstream: str, frozen_after_each_response: tuple[threading.Semaphore, threading.Semaphore]
) -> None:
    """Every counter and the log entry are in place before the response's last byte."""
    held, gate = frozen_after_each_response
    with CountingProxy(upstream) as proxy:
        with _connect(proxy) as conn:
            expected_received = expected_sent = 0
            log: list[tuple[str, str, int, int]] = []

            def check(method: str, path: str, status: int, nbytes: int, sent: int = 0) -> None:
                nonlocal expected_received, expected_sent
                expected_received += nbytes
                expected_sent += sent
                log.append((method, path, status, nbytes))
                # the proxy thread is frozen right after its last write to us
                assert proxy.requests == len(log), (proxy.requests, log)
                assert proxy.bytes_received == expected_received, log
                assert proxy.bytes_sent == expected_sent, log
                assert proxy.log == log

            for _ in range(3):
                for size in (1, 100, 5000, 0, 200_000):  # 200,000: several pieces
                    conn.request("GET", f"/bytes/{size}")
                    resp = conn.getresponse()
                    assert (resp.status, resp.read()) == (200, b"z" * size)
                    check("GET", f"/bytes/{size}", 200, size)
                    assert held.acquire(timeout=60)
                    gate.release()

                conn.request("GET", "/chunked")
                resp = conn.getresponse()
                assert resp.read() == b"hello chunked world"
                check("GET", "/chunked", 200, len(b"hello chunked world"))
                assert held.acquire(timeout=60)
                gate.release()

                conn.request("PUT", "/up", body=b"a" * 1000, headers={"X-Test": "hdr"})
                resp = conn.getresponse()
                assert (resp.status, resp.read()) == (201, b"hdr:1000")
                check("PUT", "/up", 201, len(b"hdr:1000"), sent=1000)
                assert held.acquire(timeout=60)
                gate.release()

                proxy.fail_next(1, 503)
                conn.request("GET", "/bytes/7")
                resp = conn.getresponse()
                assert (resp.status, resp.read()) == (503, b"injected failure")
                check("GET", "/bytes/7", 503, 0)
                assert held.acquire(timeout=60)
                gate.release()


def test_target_down_gives_502_logged_before_the_client_has_it(
    frozen_after_each_response: tuple[threading.Semaphore, threading.Semaphore],
) -> None:
    held, gate = frozen_after_each_response
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        target = f"http://127.0.0.1:{bound.getsockname()[1]}"
        with CountingProxy(target) as proxy:
            for i in range(1, 4):
                with _connect(proxy) as conn:
                    conn.request("GET", "/storage/v1/b")
                    resp = conn.getresponse()
                    assert resp.status == 502
                    assert f"upstream {target} unreachable".encode() in resp.read()
                    assert proxy.requests == i
                    assert proxy.log == [("GET", "/storage/v1/b", 502, 0)] * i
                    assert held.acquire(timeout=60)
                    gate.release()


def test_many_small_reads_are_counted_one_by_one(server: FakeGCSServer) -> None:
    """gcsfs through the proxy: each count is exact right after each call returns."""
    plain = fsspec.filesystem("gs", **server.storage_options())
    payload = os.urandom(4096)
    plain.pipe(f"{BUCKET}/small.bin", payload)
    with CountingProxy(server.endpoint_url) as proxy:
        opts = server.storage_options(endpoint_url=proxy.endpoint_url)
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **opts)
        total = 0
        for i in range(300):
            start, end = i % 97, i % 97 + 1 + (i * 37) % 3000
            assert fs.cat_file(f"{BUCKET}/small.bin", start=start, end=end) == payload[start:end]
            total += end - start
            assert proxy.requests == i + 1
            assert proxy.bytes_received == total
            assert len(proxy.log) == i + 1 and proxy.log[-1][2:] == (206, end - start)


# --------------------------------------------------------------------------- #
# forwarding
# --------------------------------------------------------------------------- #


# aiohttp warns about >1 MiB raw-bytes bodies; gcsfs sends resumable chunks that way.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
def test_proxy_counts_reads_and_resumable_uploads(server: FakeGCSServer) -> None:
    with CountingProxy(server.endpoint_url) as proxy:
        fs = fsspec.filesystem("gs", **server.storage_options(endpoint_url=proxy.endpoint_url))
        # more than one block -> a resumable upload of 2 chunks (blocks of 256 KiB, the
        # smallest GCS takes: small enough that a loaded machine answers well in time)
        data = os.urandom(2**18 + 123)
        with fs.open(f"{BUCKET}/proxy/big.bin", "wb", block_size=2**18) as f:
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


def test_proxy_chunked_methods_and_location(upstream: str) -> None:
    with CountingProxy(upstream) as proxy:
        with _connect(proxy) as conn:
            conn.request("GET", "/chunked")
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
            assert proxy.log[-1] == ("HEAD", "/z", 200, 0)
            conn.request("GET", "/bytes/3")
            assert conn.getresponse().read() == b"zzz"
        assert proxy.requests == 4
        assert proxy.bytes_received == len(b"hello chunked world") + len(b"hdr:1000") + 3
        assert proxy.bytes_sent == 1000


def test_truncated_upstream_aborts_the_client_and_is_logged(upstream: str) -> None:
    with CountingProxy(upstream) as proxy:
        with _connect(proxy) as conn:
            conn.request("GET", "/truncated")
            resp = conn.getresponse()
            with pytest.raises(http.client.IncompleteRead):
                resp.read()
        assert proxy.log == [("GET", "/truncated", 200, 10)]
        assert proxy.bytes_received == 10


def test_fail_next_and_reset(upstream: str) -> None:
    with CountingProxy(upstream) as proxy:
        with _connect(proxy) as conn:
            proxy.fail_next(2, 429)
            statuses = []
            for _ in range(3):
                conn.request("GET", "/bytes/5")
                resp = conn.getresponse()
                resp.read()
                statuses.append(resp.status)
            assert statuses == [429, 429, 200]
            proxy.fail_next(5, 503)
            proxy.reset()  # drops the pending failures too
            conn.request("GET", "/bytes/5")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"zzzzz")
        assert [e[2] for e in proxy.log] == [200]


def test_delay_holds_every_request_and_can_change_while_running(upstream: str) -> None:
    """Each request, failures included, takes at least the delay current when it arrives."""
    with CountingProxy(upstream, delay=0.05) as proxy, _connect(proxy) as conn:

        def timed_get(path: str) -> tuple[float, int, bytes]:
            t0 = time.perf_counter()
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            return time.perf_counter() - t0, resp.status, body

        for _ in range(4):  # one keep-alive connection: one round trip per request
            elapsed, status, body = timed_get("/100")
            assert (status, len(body)) == (200, 100)
            assert elapsed >= 0.05
        proxy.delay = 0.12
        elapsed, status, _ = timed_get("/10")
        assert status == 200 and elapsed >= 0.12
        proxy.fail_next(1)
        elapsed, status, _ = timed_get("/10")
        assert status == 503 and elapsed >= 0.12
        proxy.delay = 0
        assert timed_get("/10")[1] == 200
        assert proxy.requests == 7
        durations = proxy.durations
        assert len(durations) == len(proxy.log) == 7
        assert min(durations[:4]) >= 0.05 and min(durations[4:6]) >= 0.12


@pytest.mark.parametrize("delay", [-0.01, float("nan"), float("inf")])
def test_bad_delays_are_refused(delay: float) -> None:
    with pytest.raises(InvalidArgumentError, match="delay"):
        CountingProxy("http://127.0.0.1:1", delay=delay)
    proxy = CountingProxy("http://127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match="delay"):
        proxy.delay = delay
    assert proxy.delay == 0.0


def test_bad_targets_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="not an http:// URL"):
        CountingProxy("https://127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match="has a path"):
        CountingProxy("http://127.0.0.1:1/bucket")


# --------------------------------------------------------------------------- #
# ports
# --------------------------------------------------------------------------- #


def test_proxies_never_share_a_port(upstream: str) -> None:
    """fsspec caches a file system per endpoint URL: a reused port would share one."""
    ports = []
    for _ in range(20):
        with CountingProxy(upstream) as proxy:
            ports.append(proxy.port)
    assert len(set(ports)) == 20
    assert not any(claim_port(port) for port in ports)  # all recorded as used
