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
from typing import IO, cast

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


def open_gzip(raw: IO[bytes]) -> gzip.GzipFile:
    """Read the binary stream ``raw`` as GZIP, inflating as it is read.

    Parameters
    ----------
    raw : binary file object
        The compressed bytes (a local or fsspec file). Closing the result leaves
        ``raw`` open.

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
    try:
        from isal import igzip
    except ImportError:  # pragma: no cover - exercised only without the fast extra
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return igzip.IGzipFile(fileobj=raw, mode="rb")
