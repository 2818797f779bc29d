"""The life of a local server subprocess bound to ``127.0.0.1``: :class:`LoopbackServer`.

:class:`LoopbackServer` starts a server as a subprocess on a fresh loopback port, waits
until it answers an HTTP ``GET``, and stops, kills, pauses or resumes it; its output goes
to a temporary file (:meth:`LoopbackServer.read_log`), never to a pipe, which would block
the server once nothing drains it. A subclass gives the command line (and, if it needs
them, the environment, working directory and extra files) and its own client options:
:class:`~atari_zarr_testkit.gcs.FakeGCSServer` and :class:`~atari_zarr_testkit.s3.MotoS3Server`.
Importing this module changes nothing in the process.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from types import TracebackType
from typing import IO, ClassVar, Self

from atari_zarr_testkit.ports import LOOPBACK, fresh_port

__all__ = ["LoopbackServer", "StartStop"]

logger = logging.getLogger("atari_zarr")


def _stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Terminate ``proc``, escalating to SIGKILL after ``grace`` seconds.

    Parameters
    ----------
    proc : subprocess.Popen
        The process to stop; nothing happens if it already exited.
    grace : float
        Seconds to wait after SIGTERM before SIGKILL.

    Examples
    --------
    >>> import sys
    >>> proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    >>> _stop_process(proc, 1.0)
    >>> proc.poll() is not None
    True
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


class StartStop:
    """Start on entering a ``with`` block, stop on leaving it.

    A subclass implements ``start()`` (returning ``self``) and ``stop()``.

    Examples
    --------
    >>> class Noisy(StartStop):
    ...     def start(self):
    ...         print("start")
    ...         return self
    ...     def stop(self):
    ...         print("stop")
    >>> with Noisy():
    ...     pass
    start
    stop
    """

    def start(self) -> Self:
        """Start; returns ``self``."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LoopbackServer(StartStop):
    """A server subprocess on ``127.0.0.1``, ready once it answers ``GET ready_path``.

    Parameters
    ----------
    port : int or None, default None
        TCP port; when ``None``, a free one that no server of this process had
        before (see :func:`~atari_zarr_testkit.ports.fresh_port`), and a start that
        finds it taken tries another.
    startup_timeout : float, default 60.0
        Most seconds to wait for the server to answer: a bound for a server that
        never comes up, not a wait.

    Attributes
    ----------
    port : int
        Port the server listens on.
    endpoint_url : str
        ``http://127.0.0.1:<port>``.

    Notes
    -----
    A subclass sets ``label`` (the server's name in messages), ``log_prefix`` and
    ``ready_path``, implements :meth:`_command`, and may override
    :meth:`_prepare_start`, :meth:`_environment`, :meth:`_workdir`, :meth:`_release`
    and :meth:`_repr_details`.

    Examples
    --------
    >>> import sys
    >>> class Static(LoopbackServer):
    ...     label = "http.server"
    ...     def _command(self):
    ...         return [sys.executable, "-m", "http.server", "-b", self.host, str(self.port)]
    >>> with Static() as server:
    ...     server._http("GET", "/")[0]
    200
    >>> server.running
    False
    """

    host: str = LOOPBACK
    #: The server's name in log lines and error messages.
    label: ClassVar[str] = "server"
    #: Prefix of the temporary log file.
    log_prefix: ClassVar[str] = "server-log-"
    #: Path whose ``GET`` answers 200 once the server is ready.
    ready_path: ClassVar[str] = "/"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 60.0) -> None:
        self._requested_port = port
        self.port: int = port or 0
        self.startup_timeout = float(startup_timeout)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._paused = False

    # -- what a subclass gives ----------------------------------------------------------

    def _command(self) -> list[str]:
        """Command line of the server for ``self.host`` and ``self.port``."""
        raise NotImplementedError

    def _prepare_start(self) -> None:
        """Check dependencies before the first spawn; raise if the server cannot run."""

    def _environment(self) -> dict[str, str] | None:
        """Environment of the server; ``None`` inherits this process's."""
        return None

    def _workdir(self) -> str | None:
        """Working directory of the server (created here if needed); ``None``: this one."""
        return None

    def _release(self) -> None:
        """Remove what :meth:`_workdir` or :meth:`_command` created."""

    def _repr_details(self) -> str:
        """Words shown in ``repr`` between the URL and the state."""
        return ""

    # -- properties -------------------------------------------------------------------

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
        """Process id of the server, or ``None`` if not started."""
        return None if self._proc is None else self._proc.pid

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until it answers.

        Returns
        -------
        LoopbackServer
            ``self``.

        Raises
        ------
        RuntimeError
            If the server was already started, cannot be executed, exits or does
            not answer within ``startup_timeout``; the message includes its output.
        """
        if self._proc is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._prepare_start()
        attempts = 1 if self._requested_port else 3
        last_error: RuntimeError | None = None
        for _ in range(attempts):
            self.port = self._requested_port or fresh_port(self.host)
            try:
                self._spawn()
                self._wait_ready()
            except RuntimeError as exc:
                last_error = exc
                self._cleanup(kill=True)
                if "address already in use" in str(exc).lower() and not self._requested_port:
                    logger.debug("port %d was taken, retrying", self.port)
                    continue
                raise
            except BaseException:
                self._cleanup(kill=True)
                raise
            logger.debug("%s pid %s ready at %s", self.label, self.pid, self.endpoint_url)
            return self
        assert last_error is not None
        raise last_error

    def _spawn(self) -> None:
        """Launch the subprocess (no readiness check)."""
        cwd = self._workdir()
        cmd = self._command()
        # A real file, not a pipe: an undrained pipe blocks the server once
        # its per-request log lines fill the pipe buffer.
        self._log = tempfile.TemporaryFile(prefix=self.log_prefix)
        logger.debug("starting %s", " ".join(cmd))
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=self._environment(),
            )
        except OSError as exc:
            raise RuntimeError(f"cannot execute {cmd[0]}: {exc}") from exc
        self._finalizer = weakref.finalize(self, _stop_process, self._proc, 1.0)

    def _wait_ready(self) -> None:
        """Poll ``GET ready_path`` until 200 or ``startup_timeout``."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        last: BaseException | str | None = None
        delay = 0.02
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                raise RuntimeError(
                    f"{self.label} exited with code {rc} during start-up "
                    f"(port {self.port}). Output:\n{self.read_log()}"
                )
            try:
                status, _ = self._http("GET", self.ready_path, timeout=2.0)
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as exc:
                last = exc
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        raise RuntimeError(
            f"{self.label} did not become ready on {self.endpoint_url} within "
            f"{self.startup_timeout:.1f} s (last error: {last!r}). "
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
        Idempotent; also removes the temporary log file and whatever the server's
        class created for it (a data directory, say).
        """
        if self._proc is not None:
            if self._paused:
                self.resume()
            _stop_process(self._proc, timeout)
        held = getattr(self, "_held_port", None)
        if held is not None:
            held.close()
            self._held_port = None
        self._cleanup(kill=False)

    def kill(self) -> None:
        """Kill the server abruptly with SIGKILL (fault injection); the port refuses after.

        The port stays held (bound, not listening) until :meth:`stop`, so that a
        server another process starts meanwhile cannot take it and answer in its
        place (ports are kept apart within a process only): a client's connections
        are refused, as a dead server's are. The log file is kept so :meth:`read_log`
        still works; call :meth:`stop` (or leave the ``with`` block) to release both.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind((self.host, self.port))
        except OSError:  # taken already: nothing to hold
            holder.close()
        else:
            self._held_port = holder
        logger.debug("%s pid %d killed", self.label, proc.pid)

    def pause(self) -> None:
        """Freeze the server with SIGSTOP (fault injection: a hung server).

        Returns once the server has stopped, not merely been signalled: a request
        sent after ``pause()`` is never answered (a signalled process can still
        answer a request or two before all its threads stop). The listening socket
        stays open, so clients connect but never get an answer; only a client-side
        timeout ends such a read. Undo with :meth:`resume`; :meth:`stop` resumes first.

        Raises
        ------
        RuntimeError
            If the server is not running, or exits instead of stopping.
        """
        self._require_running()
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True
        # The parent learns of the stop once every thread of the server has stopped.
        _, status = os.waitpid(self._proc.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):  # it died instead; this reaped it: tell Popen
            self._proc.returncode = os.waitstatus_to_exitcode(status)
            raise RuntimeError(
                f"{self.label} exited while being paused (status {status}). "
                f"Output:\n{self.read_log()}"
            )

    def resume(self) -> None:
        """Continue a server frozen by :meth:`pause` (SIGCONT)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def _cleanup(self, *, kill: bool) -> None:
        """Release process handle, log file and what :meth:`_release` removes."""
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
        self._release()

    # -- helpers ----------------------------------------------------------------------

    def read_log(self) -> str:
        """Return everything the server wrote to stdout/stderr so far.

        Returns
        -------
        str
            Decoded log text (empty if the server was never started or is stopped).
        """
        if self._log is None or self._log.closed:
            return ""
        try:
            self._log.flush()
            self._log.seek(0)
            return self._log.read().decode("utf-8", errors="replace")
        finally:
            self._log.seek(0, os.SEEK_END)

    def _require_running(self) -> None:
        """Raise ``RuntimeError`` unless the server process is alive."""
        if not self.running:
            raise RuntimeError(f"{type(self).__name__} is not running")

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
        details = self._repr_details()
        middle = f" {details}" if details else ""
        return f"<{type(self).__name__} {self.endpoint_url}{middle} {state}>"
