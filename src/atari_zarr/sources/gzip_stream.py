"""The one GZIP reader of the sources: isal's ``igzip`` when installed, and its errors.

Both source kinds inflate GZIP streams as they read them: DQN Replay's ``.npy``
files (:mod:`~atari_zarr.sources.dqn_replay.npy`) and RL Unplugged's TFRecord shards
(:mod:`~atari_zarr.sources.rl_unplugged.tfrecord`). ``isal`` (the ``fast`` extra)
inflates about twice as fast as zlib; without it the standard library's ``gzip``
reads the same bytes. Either reader raises one of :data:`GZIP_ERRORS` on a corrupt
or truncated stream, which the callers turn into a one-line error naming the file.

Examples
--------
>>> import gzip, io
>>> stream = open_gzip(io.BytesIO(gzip.compress(b"episode")))
>>> stream.read()
b'episode'
>>> try:
...     open_gzip(io.BytesIO(gzip.compress(b"episode")[:-3])).read()
... except GZIP_ERRORS as exc:
...     print("truncated")
truncated
"""

from __future__ import annotations

import gzip
import zlib
from typing import IO, Any, cast

__all__ = ["GZIP_ERRORS", "gzip_backend", "open_gzip"]


def _errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [gzip.BadGzipFile, zlib.error, EOFError]
    try:
        from isal import igzip, isal_zlib
    except ImportError:  # pragma: no cover - exercised only without the fast extra
        pass
    else:
        # isal_zlib.error is typed as an instance in its stubs
        errors += [igzip.BadGzipFile, cast("type[BaseException]", isal_zlib.error)]
    return tuple(errors)


#: What a corrupt or truncated GZIP stream raises, from zlib's reader or isal's.
GZIP_ERRORS: tuple[type[BaseException], ...] = _errors()


def gzip_backend() -> str:
    """Name of the GZIP reader in use: ``"isal"`` when installed, else ``"gzip"``.

    Examples
    --------
    >>> gzip_backend() in ("isal", "gzip")
    True
    """
    try:
        import isal.igzip  # noqa: F401
    except ImportError:  # pragma: no cover - exercised only without the fast extra
        return "gzip"
    return "isal"


class _Capped:
    """``raw`` read at most ``cap`` bytes at a time (the readers ask 128-512 KiB)."""

    def __init__(self, raw: IO[bytes], cap: int) -> None:
        self._raw, self._cap = raw, int(cap)

    def read(self, n: int = -1) -> bytes:
        return self._raw.read(self._cap if n is None or n < 0 else min(n, self._cap))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._raw.seekable())

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())


def open_gzip(raw: IO[bytes], max_read: int | None = None) -> gzip.GzipFile:
    """Read the binary stream ``raw`` as GZIP, inflating as it is read.

    Parameters
    ----------
    raw : binary file object
        The compressed bytes (a local or fsspec file). Closing the result leaves
        ``raw`` open.
    max_read : int, optional
        Read ``raw`` at most this many bytes at a time, so that a reader that stops
        early has read little beyond what it inflated (default: the reader's own
        buffer, 128 KiB for zlib, 512 KiB for isal).

    Returns
    -------
    gzip.GzipFile
        The decompressed stream (isal's subclass when installed); reads raise one
        of :data:`GZIP_ERRORS` when the stream is corrupt or truncated.

    Examples
    --------
    >>> import gzip, io
    >>> open_gzip(io.BytesIO(gzip.compress(b"abc"))).read(2)
    b'ab'
    """
    source = cast("IO[bytes]", _Capped(raw, max_read)) if max_read else raw
    try:
        from isal import igzip
    except ImportError:  # pragma: no cover - exercised only without the fast extra
        return gzip.GzipFile(fileobj=source, mode="rb")
    return igzip.IGzipFile(fileobj=source, mode="rb")
