"""A reverse proxy on 127.0.0.1 that counts the requests and bytes passing through it.

:class:`CountingProxy` forwards every request to one target (the GCS emulator of
:mod:`atari_zarr_testkit.gcs`, or any ``http://`` server) and counts what flows:
requests, request body bytes, response body bytes, one log entry per request. It can
also answer the next requests with an error instead of forwarding them
(:meth:`CountingProxy.fail_next`), to test retries, and hold every request for a fixed
time before forwarding it (:attr:`CountingProxy.delay`), to emulate a network's round
trip on loopback.

Every count of a request is complete before its client has the last byte of the
response, so a test may read the counters right after a call returns. What the proxy
rewrites and what it does not, and why, is in ``docs/gcs-emulator.md``.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from atari_zarr.errors import InvalidArgumentError
from atari_zarr_testkit.ports import LOOPBACK, claim_port
from atari_zarr_testkit.process import StartStop

__all__ = ["CountingProxy"]

logger = logging.getLogger("atari_zarr")

# Hop-by-hop headers (RFC 9110 section 7.6.1) are never forwarded by the proxy.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


# the failures of drop_next and corrupt_next: a response cut mid-body, a byte changed
_DROP = 0
_FLIP = -1


class _ProxyHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that remembers its proxy and open connections."""

    daemon_threads = True
    # Clients open dozens of connections at once (many requests in flight): a short
    # listen backlog drops SYNs, and each drop costs a 1-3 s retry.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], proxy: CountingProxy) -> None:
        self.proxy = proxy
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _ProxyHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints tracebacks to stderr by default
        logger.debug("proxy: error serving %s", client_address, exc_info=True)

    def close_all_connections(self) -> None:
        """Abort every open client connection."""
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _UpstreamError(Exception):
    """The target could not be reached or broke before answering."""


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forward one client connection's requests to the proxy target.

    Counting rule: every counter and the log entry of a request are updated before
    the last byte of its response is written to the client (and before an aborted
    connection is shut down). A client that has its response therefore always sees
    complete counts; the proxy thread may still be finishing, but has nothing left
    to count.
    """

    protocol_version = "HTTP/1.1"
    server: _ProxyHTTPServer
    # Idle keep-alive client connections are dropped after this many seconds.
    timeout = 60
    # Headers and body go out in separate writes; with Nagle's algorithm the body
    # would wait for the client's delayed ACK (about 40 ms per response).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self._upstream: http.client.HTTPConnection | None = None
        self._upstream_used = False

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._close_upstream()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("proxy %s: " + format, self.address_string(), *args)

    def __getattr__(self, name: str) -> Any:
        # BaseHTTPRequestHandler dispatches to do_<METHOD>; accept any method.
        if name.startswith("do_") and name[3:].isupper():
            return self._forward
        raise AttributeError(name)

    # -- upstream connection ------------------------------------------------ #

    def _close_upstream(self) -> None:
        if self._upstream is not None:
            with contextlib.suppress(OSError):
                self._upstream.close()
            self._upstream = None
            self._upstream_used = False

    def _connection(self) -> http.client.HTTPConnection:
        if self._upstream is None:
            proxy = self.server.proxy
            self._upstream = http.client.HTTPConnection(
                proxy.target_host, proxy.target_port, timeout=proxy.upstream_timeout
            )
            self._upstream_used = False
        return self._upstream

    # -- request handling --------------------------------------------------- #

    def _read_request_body(self) -> bytes | None:
        """Read the request body (de-chunking if needed)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # trailers, terminated by an empty line
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(3)
            return b"".join(parts)
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length))
        return None

    def _send_upstream(self, body: bytes | None) -> http.client.HTTPResponse:
        """Send the request, retrying once on a stale keep-alive connection."""
        proxy = self.server.proxy
        headers = [
            (k, v)
            for k, v in self.headers.items()
            if k.lower() not in _HOP_BY_HOP
            and k.lower() not in ("host", "content-length", "expect")
        ]
        for attempt in (0, 1):
            conn = self._connection()
            reused = self._upstream_used
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                conn.putheader("Host", proxy.target_netloc)
                for key, value in headers:
                    conn.putheader(key, value)
                if body is not None or self.command in ("POST", "PUT", "PATCH"):
                    conn.putheader("Content-Length", str(len(body or b"")))
                conn.endheaders(body or None)
                resp = conn.getresponse()
                self._upstream_used = True
                return resp
            except (http.client.HTTPException, OSError) as exc:
                self._close_upstream()
                # only a kept-alive connection the target closed meanwhile is retried:
                # the request never reached it
                stale = isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError))
                if reused and attempt == 0 and stale:
                    logger.debug("proxy: stale upstream connection (%r), retrying", exc)
                    continue
                raise _UpstreamError(repr(exc)) from exc
        raise AssertionError("unreachable")

    def _answer_locally(self, status: int, message: bytes, *, close: bool) -> None:
        """Answer without the target (injected failure, target down): log, then write.

        A HEAD request gets the headers only, as HTTP has it.
        """
        self.server.proxy._record(self.command, self.path, status, 0, self._arrived)
        if close:
            self.close_connection = True
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(message)))
            if close:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(message)

    def _cut(self, resp: http.client.HTTPResponse, *, flip: bool = False) -> None:
        """Relay ``resp``'s headers and half its body, then drop the connection; with
        ``flip``, the whole body with its middle byte changed (the connection kept)."""
        body = resp.read()
        if flip:
            mid = len(body) // 2
            sent = body[:mid] + bytes([body[mid] ^ 0xFF]) + body[mid + 1 :] if body else body
        else:
            self._close_upstream()
            sent = body[: len(body) // 2]
        self.server.proxy._count_received(len(sent))
        self.server.proxy._record(self.command, self.path, resp.status, len(sent), self._arrived)
        self.close_connection = not flip
        with contextlib.suppress(OSError):
            self.send_response_only(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            # the whole body's length: a cut body is then visibly short
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(sent)
            self.wfile.flush()
            if not flip:
                self.connection.shutdown(socket.SHUT_RDWR)

    def _forward(self) -> None:
        proxy = self.server.proxy
        self._arrived = time.perf_counter()
        proxy._count_request()
        body = self._read_request_body()
        proxy._count_sent(len(body or b""))
        delay = proxy.delay
        if delay > 0:
            # One round trip per request, held before anything is answered.
            time.sleep(delay)
        injected = proxy._take_failure(
            has_body=self.command not in ("HEAD", "DELETE"), path=self.path
        )
        if injected is not None and injected not in (_DROP, _FLIP):
            # A transient server error, answered without asking the target.
            self._answer_locally(injected, b"injected failure", close=False)
            return
        try:
            resp = self._send_upstream(body)
        except _UpstreamError as exc:
            logger.debug("proxy: upstream failure for %s %s: %s", self.command, self.path, exc)
            message = f"upstream {proxy.target} unreachable: {exc}".encode()
            self._answer_locally(502, message, close=True)
            return
        if injected == _DROP and resp.status < 300:
            self._cut(resp)
            return
        if injected == _FLIP and resp.status < 300:
            self._cut(resp, flip=True)
            return
        self._relay(resp)

    def _relay(self, resp: http.client.HTTPResponse) -> None:
        """Stream the target's response to the client, counting ahead of the writes."""
        proxy = self.server.proxy
        no_body = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        length_header = resp.getheader("Content-Length")
        chunked_out = not no_body and length_header is None
        expected = None if length_header is None else int(length_header)

        received = 0
        recorded = False

        def record() -> None:
            nonlocal recorded
            if not recorded:
                proxy._record(self.command, self.path, resp.status, received, self._arrived)
                recorded = True

        try:
            self.send_response_only(resp.status, resp.reason)
            for key, value in resp.getheaders():
                lower = key.lower()
                if lower in _HOP_BY_HOP:
                    continue
                if lower == "location":
                    value = proxy._rewrite_location(value)
                self.send_header(key, value)
            if chunked_out:
                self.send_header("Transfer-Encoding", "chunked")
            if resp.will_close:
                self.close_connection = True
                self.send_header("Connection", "close")
            if no_body or expected == 0:
                resp.read()  # b"": frees the upstream connection for the next request
                record()  # the headers are the whole response
                self.end_headers()
                self.wfile.flush()
                return
            self.end_headers()
            # One piece of look-ahead: the end of the body is known before its last
            # piece is written, so the log entry is in place before the client can
            # have the whole response.
            piece = resp.read1(proxy.buffer_size)
            received += len(piece)
            proxy._count_received(len(piece))
            while True:
                following = resp.read1(proxy.buffer_size) if piece else b""
                received += len(following)
                proxy._count_received(len(following))
                last = not following
                if last and expected is not None and received != expected:
                    raise _UpstreamError(f"upstream sent {received} of {expected} bytes")
                if last:
                    record()
                out = piece
                if chunked_out:
                    out = b"%x\r\n%b\r\n" % (len(piece), piece) if piece else b""
                    if last:
                        out += b"0\r\n\r\n"
                if out:
                    self.wfile.write(out)
                if last:
                    break
                piece = following
            # read1 leaves a response whose body was read to its length open; read()
            # closes it, else the connection's next request fails with ResponseNotReady
            # after it was sent (and a retry would send a POST twice)
            resp.read()
            self.wfile.flush()
        except (http.client.HTTPException, OSError, _UpstreamError) as exc:
            # Upstream died mid-body (or the client went away): abort the client
            # connection so the truncation is visible to the client, after logging.
            logger.debug(
                "proxy: aborted %s %s after %d bytes: %r", self.command, self.path, received, exc
            )
            record()
            self.close_connection = True
            self._close_upstream()
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        else:
            if resp.will_close:
                self._close_upstream()


class CountingProxy(StartStop):
    """Threaded HTTP reverse proxy on ``127.0.0.1`` that counts traffic.

    Every request (any method, headers, body, ``Range``) is forwarded to
    ``target``; responses (including chunked ones) are streamed back. Use
    :attr:`endpoint_url` as the gcsfs ``endpoint_url`` to route all gcsfs traffic
    through the proxy.

    Parameters
    ----------
    target : str
        Base URL of the upstream server, e.g. ``server.endpoint_url``. Only
        ``http://`` is supported.
    port : int, default 0
        Listening port; ``0`` picks a free one that no server of this process had.
    upstream_timeout : float, default 30.0
        Socket timeout for connections to ``target``.
    buffer_size : int, default 65536
        Read size used when streaming response bodies.
    delay : float, default 0.0
        Seconds each request is held, once its body is read, before it is forwarded
        (or answered with an injected failure): one network round trip per HTTP
        request. Requests on different connections wait concurrently, as they do on a
        network. Can be changed while the proxy runs (``proxy.delay = 0.02``); a
        request uses the value current when it arrived.

    Attributes
    ----------
    bytes_received : int
        Response body bytes received from the target (what clients download;
        headers not included).
    bytes_sent : int
        Request body bytes received from clients and forwarded (uploads).
    requests : int
        Number of requests received.
    log : list of tuple
        ``(method, path, status, response_body_bytes)`` per answered request.
    durations : list of float
        Seconds each answered request spent in the proxy, in the order of ``log``.

    Notes
    -----
    The counters and the log entry of a request are complete when its client has
    the response: read them right after a call returns, no waiting needed.
    ``Location`` response headers that point at ``target`` are rewritten to the
    proxy, so resumable uploads also go through it; URLs inside JSON bodies
    (``selfLink``, ``mediaLink``) are passed through unchanged. When the target is
    unreachable the proxy answers ``502``; if it dies mid-response, the client
    connection is aborted. See ``docs/gcs-emulator.md``.

    Examples
    --------
    >>> import fsspec
    >>> from atari_zarr_testkit.gcs import FakeGCSServer
    >>> with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
    ...     server.create_bucket("counted")
    ...     opts = server.storage_options(endpoint_url=proxy.endpoint_url)
    ...     fs = fsspec.filesystem("gs", skip_instance_cache=True, **opts)
    ...     _ = fs.pipe("counted/x.bin", b"0123456789")
    ...     proxy.reset()
    ...     data = fs.cat_file("counted/x.bin", start=2, end=6)
    ...     counted = (proxy.requests, proxy.bytes_received, proxy.log[0][2])
    >>> data, counted
    (b'2345', (1, 4, 206))
    """

    def __init__(
        self,
        target: str,
        *,
        port: int = 0,
        upstream_timeout: float = 30.0,
        buffer_size: int = 65536,
        delay: float = 0.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(target)
        if parsed.scheme != "http" or not parsed.hostname:
            raise InvalidArgumentError(
                f"CountingProxy target {target!r} is not an http:// URL; "
                "pass the base URL of a server, e.g. server.endpoint_url"
            )
        if parsed.path not in ("", "/"):
            raise InvalidArgumentError(
                f"CountingProxy target {target!r} has a path; pass the base URL only"
            )
        self.target = f"http://{parsed.netloc}"
        self.target_host: str = parsed.hostname
        self.target_port: int = parsed.port or 80
        self.target_netloc: str = parsed.netloc
        self.upstream_timeout = float(upstream_timeout)
        self.buffer_size = int(buffer_size)
        self._delay = 0.0
        self.delay = delay
        self._requested_port = port
        self._lock = threading.Lock()
        self._bytes_received = 0
        self._bytes_sent = 0
        self._requests = 0
        self._log: list[tuple[str, str, int, int]] = []
        self._durations: list[float] = []
        self._failures: list[int] = []
        self._failure_paths: str | None = None
        self._server: _ProxyHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def delay(self) -> float:
        """Seconds each request is held before it is forwarded (one round trip)."""
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        value = float(seconds)
        if not value >= 0.0 or value == float("inf"):
            raise InvalidArgumentError(
                f"CountingProxy delay {seconds!r} is not a finite number of seconds >= 0; "
                "pass e.g. 0.02 for 20 ms per request"
            )
        self._delay = value

    # -- counters ------------------------------------------------------------ #

    @property
    def bytes_received(self) -> int:
        """Response body bytes received from the target."""
        with self._lock:
            return self._bytes_received

    @property
    def bytes_sent(self) -> int:
        """Request body bytes passed from clients to the target."""
        with self._lock:
            return self._bytes_sent

    @property
    def requests(self) -> int:
        """Number of requests received by the proxy."""
        with self._lock:
            return self._requests

    @property
    def log(self) -> list[tuple[str, str, int, int]]:
        """A copy of the log: ``(method, path, status, response_body_bytes)`` per request."""
        with self._lock:
            return list(self._log)

    @property
    def durations(self) -> list[float]:
        """Seconds each answered request took in the proxy, in the order of :attr:`log`.

        From the moment its headers were read to the moment it was logged, right
        before the last byte of its response is written: the :attr:`delay` included,
        the client's own time before and after not.
        """
        with self._lock:
            return list(self._durations)

    def reset(self) -> None:
        """Zero all counters, clear :attr:`log` and :attr:`durations`, drop pending failures."""
        with self._lock:
            self._bytes_received = 0
            self._bytes_sent = 0
            self._requests = 0
            self._log = []
            self._durations = []
            self._failures = []
            self._failure_paths = None

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status`` instead of forwarding them.

        Emulates transient server errors (``503``, ``429``) to test retries.
        """
        with self._lock:
            self._failures = [int(status)] * int(count)
            self._failure_paths = None

    def drop_next(self, count: int) -> None:
        """Cut the next ``count`` responses with a body halfway through it.

        The headers promise the whole body; half of it is sent, then the connection
        is closed: a connection reset mid-body, to test that readers retry it.
        """
        with self._lock:
            self._failures = [_DROP] * int(count)
            self._failure_paths = None

    def corrupt_next(self, count: int, *, path_contains: str | None = None) -> None:
        """Change one byte in the middle of the next ``count`` response bodies (of
        requests whose path holds ``path_contains``, e.g. ``"alt=media"`` for object
        content and not its metadata).

        Emulates bytes changed in transit (a wrong or stale range from a cache), to
        test that a reader fetches a chunk again before calling the store damaged.
        """
        with self._lock:
            self._failures = [_FLIP] * int(count)
            self._failure_paths = path_contains

    def _take_failure(self, *, has_body: bool = True, path: str = "") -> int | None:
        with self._lock:
            if not self._failures or (self._failures[-1] in (_DROP, _FLIP) and not has_body):
                return None  # a drop waits for a response with a body
            if self._failure_paths is not None and self._failure_paths not in path:
                return None
            return self._failures.pop()

    def _count_request(self) -> None:
        with self._lock:
            self._requests += 1

    def _count_sent(self, n: int) -> None:
        with self._lock:
            self._bytes_sent += n

    def _count_received(self, n: int) -> None:
        with self._lock:
            self._bytes_received += n

    def _record(self, method: str, path: str, status: int, nbytes: int, arrived: float) -> None:
        elapsed = time.perf_counter() - arrived
        with self._lock:
            self._log.append((method, path, status, nbytes))
            self._durations.append(elapsed)

    def _rewrite_location(self, value: str) -> str:
        if value.startswith(self.target):
            return self.endpoint_url + value[len(self.target) :]
        return value

    # -- lifecycle ------------------------------------------------------------ #

    @property
    def port(self) -> int:
        """Listening port (valid after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("CountingProxy is not running; call start() first")
        return int(self._server.server_address[1])

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``; use as gcsfs ``endpoint_url``."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> CountingProxy:
        """Bind the listening socket and start serving in a daemon thread.

        Returns
        -------
        CountingProxy
            ``self``.
        """
        if self._server is not None:
            raise RuntimeError("CountingProxy already started")
        self._server = self._bind()
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"CountingProxy:{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.debug("CountingProxy %s -> %s started", self.endpoint_url, self.target)
        return self

    def _bind(self) -> _ProxyHTTPServer:
        """A listening server on the requested port, or on a port new to this process."""
        if self._requested_port:
            return _ProxyHTTPServer((LOOPBACK, self._requested_port), self)
        rejected: list[_ProxyHTTPServer] = []
        try:
            while True:
                server = _ProxyHTTPServer((LOOPBACK, 0), self)
                if claim_port(int(server.server_address[1])):
                    return server
                # Held open while trying again, so the kernel hands out another port.
                rejected.append(server)
        finally:
            for server in rejected:
                server.server_close()

    def stop(self) -> None:
        """Stop serving and abort open connections (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_all_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __repr__(self) -> str:
        where = self.endpoint_url if self._server is not None else "stopped"
        return (
            f"<CountingProxy {where} -> {self.target} requests={self.requests} "
            f"bytes_received={self.bytes_received}>"
        )
