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

import importlib.util
import os
import sys
from typing import Any

from atari_zarr.errors import MissingDependencyError, install_hint
from atari_zarr_testkit.process import LoopbackServer

__all__ = ["MotoS3Server"]

#: Dummy credentials the server accepts (moto checks no signature by default).
ACCESS_KEY = "atari-zarr-test-key"
SECRET_KEY = "atari-zarr-test-secret"
REGION = "us-east-1"


class MotoS3Server(LoopbackServer):
    """moto's S3 server as a subprocess on ``127.0.0.1``.

    Parameters
    ----------
    port : int, optional
        TCP port; default a free one no server of this process had
        (:func:`~atari_zarr_testkit.ports.fresh_port`).
    startup_timeout : float
        Most seconds to wait for the server to answer (a bound, not a wait: it is
        usually ready within 1-2 s).

    Notes
    -----
    ``endpoint_url`` (``http://127.0.0.1:<port>``) is what s3fs takes as its
    ``endpoint_url``.
    Start, stop, :meth:`kill`, :meth:`pause`, :meth:`resume` and :meth:`read_log` are
    those of :class:`~atari_zarr_testkit.process.LoopbackServer`; :meth:`start` raises
    :class:`~atari_zarr.errors.MissingDependencyError` if ``moto[server]`` is not
    installed.

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

    label = "moto's S3 server"
    log_prefix = "moto-log-"
    ready_path = "/"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 60.0) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)

    # -- what LoopbackServer asks for ---------------------------------------------------

    def _prepare_start(self) -> None:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise MissingDependencyError(
                "MotoS3Server needs moto's server (packages moto and flask), which is not "
                f"installed; install it with: pip install 'moto[server]' "
                f"(or {install_hint('test')})"
            )

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]

    def _environment(self) -> dict[str, str] | None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        env.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_DEFAULT_REGION=REGION,
        )
        return env

    # -- client side ------------------------------------------------------------------

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
        self._require_running()
        status, body = self._http("PUT", f"/{name}")
        if status not in (200, 409):
            raise RuntimeError(
                f"creating bucket {name!r} failed: HTTP {status} "
                f"{body.decode('utf-8', errors='replace')}"
            )
