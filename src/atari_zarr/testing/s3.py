"""A local S3 server for tests, examples and benchmarks: :class:`MotoS3Server`.

:class:`MotoS3Server` runs `moto <https://github.com/getmoto/moto>`_'s standalone
server (``python -m moto.server``, from the ``moto[server]`` package) as a subprocess
bound to ``127.0.0.1`` and gives the ``storage_options`` that point s3fs (and zarr's
``FsspecStore``) at it. Requests are real HTTP, signed by botocore with dummy
credentials, so what a user meets with a bucket (s3fs, aiobotocore, retries, the
deadline) is what the tests meet. Importing this module changes nothing: no
environment variable, no server; the server's own environment gets dummy
credentials and a region, so that nothing from the user's AWS configuration is used.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from types import TracebackType
from typing import IO, Any

from atari_zarr.errors import MissingDependencyError, install_hint
from atari_zarr.testing.gcs import _stop_process
from atari_zarr.testing.ports import LOOPBACK, fresh_port

__all__ = ["MotoS3Server"]

logger = logging.getLogger("atari_zarr")

#: Dummy credentials the server accepts (moto checks no signature by default).
ACCESS_KEY = "atari-zarr-test-key"
SECRET_KEY = "atari-zarr-test-secret"
REGION = "us-east-1"


class MotoS3Server:
    """moto's S3 server as a subprocess on ``127.0.0.1``.

    Parameters
    ----------
    port : int, optional
        TCP port; default a free one no server of this process had
        (:func:`~atari_zarr.testing.ports.fresh_port`).
    startup_timeout : float
        Most seconds to wait for the server to answer (a bound, not a wait: it is
        usually ready within 1-2 s).

    Attributes
    ----------
    endpoint_url : str
        ``http://127.0.0.1:<port>``: s3fs's ``endpoint_url``.

    Examples
    --------
    >>> import fsspec
    >>> with MotoS3Server() as server:
    ...     server.create_bucket("demo-bucket")
    ...     fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options())
    ...     _ = fs.pipe("demo-bucket/a/b.bin", b"data")
    ...     fs.cat("demo-bucket/a/b.bin")
    b'data'
    """

    host: str = LOOPBACK

    def __init__(self, *, port: int | None = None, startup_timeout: float = 60.0) -> None:
        self._requested_port = port
        self.port: int = port or 0
        self.startup_timeout = float(startup_timeout)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._paused = False

    @property
    def endpoint_url(self) -> str:
        """Base URL of the server, ``http://127.0.0.1:<port>``."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the server, or None if not started."""
        return None if self._proc is None else self._proc.pid

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> MotoS3Server:
        """Start the server and wait until it answers; returns ``self``.

        Raises
        ------
        MissingDependencyError
            If ``moto[server]`` is not installed.
        RuntimeError
            If the server exits or does not answer within ``startup_timeout``.
        """
        if self._proc is not None:
            raise RuntimeError("MotoS3Server already started")
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise MissingDependencyError(
                "MotoS3Server needs moto's server (packages moto and flask), which is not "
                f"installed; install it with: pip install 'moto[server]' "
                f"(or {install_hint('test')})"
            )
        attempts = 1 if self._requested_port else 3
        for attempt in range(attempts):
            self.port = self._requested_port or fresh_port(self.host)
            try:
                self._spawn()
                self._wait_ready()
            except RuntimeError as exc:
                self._cleanup(kill=True)
                if "address already in use" in str(exc).lower() and attempt + 1 < attempts:
                    continue
                raise
            except BaseException:
                self._cleanup(kill=True)
                raise
            logger.debug("moto S3 server pid %s ready at %s", self.pid, self.endpoint_url)
            break
        return self

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        env.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_DEFAULT_REGION=REGION,
        )
        # A file, not a pipe: an undrained pipe would block the server's request log.
        self._log = tempfile.TemporaryFile(prefix="moto-log-")
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        self._finalizer = weakref.finalize(self, _stop_process, self._proc, 1.0)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        last: BaseException | str | None = None
        delay = 0.05
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise RuntimeError(
                    f"moto's S3 server exited with code {rc} during start-up (port {self.port})."
                    f" Output:\n{self.read_log()}"
                )
            try:
                status, _ = self._http("GET", "/", timeout=2.0)
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as exc:
                last = exc
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        raise RuntimeError(
            f"moto's S3 server did not answer on {self.endpoint_url} within "
            f"{self.startup_timeout:.1f} s (last error: {last!r}). Output:\n{self.read_log()}"
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL); idempotent."""
        if self._proc is not None:
            if self._paused:
                self.resume()
            _stop_process(self._proc, timeout)
        self._cleanup(kill=False)

    def kill(self) -> None:
        """Kill the server with SIGKILL (fault injection); the port refuses afterwards."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def pause(self) -> None:
        """Freeze the server with SIGSTOP (fault injection: requests are never answered)."""
        if not self.running:
            raise RuntimeError("MotoS3Server is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True
        os.waitpid(self._proc.pid, os.WUNTRACED)

    def resume(self) -> None:
        """Continue a server frozen by :meth:`pause`."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def _cleanup(self, *, kill: bool) -> None:
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

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------------------
    def read_log(self) -> str:
        """Everything the server wrote so far (empty if never started)."""
        if self._log is None or self._log.closed:
            return ""
        try:
            self._log.flush()
            self._log.seek(0)
            return self._log.read().decode("utf-8", errors="replace")
        finally:
            self._log.seek(0, os.SEEK_END)

    def storage_options(self, **overrides: Any) -> dict[str, Any]:
        """s3fs options that point at this server, plus ``overrides``.

        Returns
        -------
        dict
            ``endpoint_url``, dummy ``key``/``secret`` and the region; usable as
            ``fsspec.filesystem("s3", **opts)`` and as the ``storage_options`` of
            every function of this package.
        """
        opts: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"region_name": REGION},
        }
        opts.update(overrides)
        return opts

    def create_bucket(self, name: str) -> None:
        """Create a bucket (nothing happens if it exists)."""
        if not self.running:
            raise RuntimeError("MotoS3Server is not running")
        status, body = self._http("PUT", f"/{name}")
        if status not in (200, 409):
            raise RuntimeError(
                f"creating bucket {name!r} failed: HTTP {status} "
                f"{body.decode('utf-8', errors='replace')}"
            )

    def _http(self, method: str, path: str, *, timeout: float = 60.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<MotoS3Server {self.endpoint_url} {state}>"
