"""A plain web server over a directory: ``python -m http.server`` on loopback.

It is the web server of the many users who serve files without a bucket: it lists
directories as HTML (with percent-encoded names), gives no ETag and **ignores Range**
(a ranged ``GET`` is answered 200 with the whole object). Importing this module changes
nothing in the process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from atari_zarr_testkit.process import LoopbackServer

__all__ = ["DirectoryServer"]


class DirectoryServer(LoopbackServer):
    """``python -m http.server --directory DIRECTORY`` on a fresh loopback port.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / "a.txt").write_text("hi")
    >>> with DirectoryServer(root) as server:
    ...     server._http("GET", "/a.txt")[0]
    200
    """

    label = "http.server"
    log_prefix = "http-server-log-"

    def __init__(self, directory: str | Path, *, port: int | None = None) -> None:
        super().__init__(port=port)
        self.directory = Path(directory)

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "http.server",
            "-b",
            self.host,
            str(self.port),
            "--directory",
            str(self.directory),
        ]
