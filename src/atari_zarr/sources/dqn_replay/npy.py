"""Stream a gzip'd ``.npy`` file safely: plain arrays only, nothing ever unpickled.

A DQN Replay observation file is 7 GB once inflated, so it is read as a stream in
blocks of rows rather than loaded. The header is parsed with numpy's literal parser
(:func:`atari_zarr.npy_format.read_header`, one parse at a time) and object dtypes
are refused, so a pickled file is never loaded. The stream is
inflated by :func:`atari_zarr.sources.gzip_stream.open_gzip` (isal when installed).
"""

from __future__ import annotations

from typing import IO, Any

import numpy as np
from numpy.lib import format as npformat

from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.npy_format import read_header
from atari_zarr.sources.gzip_stream import GZIP_ERRORS as _GZIP_ERRORS
from atari_zarr.sources.gzip_stream import gzip_backend, open_gzip

__all__ = ["NpyStream", "gzip_backend"]

READ_BLOCK = 8 << 20  # bytes per remote read request while streaming


#: Rows of a DQN Replay checkpoint file at most: dopamine's replay capacity in the dataset.
MAX_CHECKPOINT_ROWS = 1_000_000
#: Values of one row at most: an 84x84 frame.
MAX_ROW_VALUES = 84 * 84


class NpyStream:
    """A gzip'd ``.npy`` file opened for streaming, its header already parsed and checked.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The file system holding the file.
    path : str
        Path of the file in ``fs``.
    where : str
        The file's path or URL as the user knows it, for messages.

    Raises
    ------
    SourceNotFoundError
        The file does not exist.
    SourceFormatError
        The file is not a gzip'd plain ``.npy`` of a numeric array.

    Examples
    --------
    >>> import fsspec, gzip, io, tempfile
    >>> path = tempfile.mkdtemp() + "/a.npy.gz"
    >>> with gzip.open(path, "wb") as f:
    ...     np.save(f, np.arange(5, dtype=np.int32), allow_pickle=False)
    >>> with NpyStream(fsspec.filesystem("file"), path, path) as stream:
    ...     out = np.empty(stream.shape, stream.dtype)
    ...     stream.readinto(out)
    ...     stream.finish()
    >>> out.tolist()
    [0, 1, 2, 3, 4]
    """

    def __init__(self, fs: Any, path: str, where: str) -> None:
        self.where = where
        try:
            self._raw: IO[bytes] = fs.open(path, "rb", block_size=READ_BLOCK)
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                f"{where} does not exist: expected a gzip'd .npy file there. "
                f"Check the source path and that the copy of the run is complete."
            ) from exc
        self._fh = open_gzip(self._raw)
        try:
            version = npformat.read_magic(self._fh)
        except ValueError as exc:
            self.close()
            raise SourceFormatError(
                f"{where} is not a plain .npy file inside gzip: expected the numpy magic "
                f"header (b'\\x93NUMPY'); the file may be pickled, which is never loaded. "
                f"Replace the file with one written by np.save(..., allow_pickle=False)."
            ) from exc
        except _GZIP_ERRORS as exc:
            self.close()
            raise self._gzip_error(exc) from exc
        try:
            shape, fortran, dtype = read_header(self._fh, version)
        except (ValueError, SyntaxError) as exc:
            self.close()
            raise SourceFormatError(
                f"{where} has an unreadable .npy header ({exc}); expected shape, dtype and "
                f"order. Replace the file with a good copy."
            ) from exc
        except _GZIP_ERRORS as exc:
            self.close()
            raise self._gzip_error(exc) from exc
        if dtype.hasobject:
            self.close()
            raise SourceFormatError(
                f"{where} holds a Python object array (dtype {dtype}), which would need "
                f"unpickling; expected a numeric array. Replace the file with a plain .npy."
            )
        rows = int(shape[0]) if shape else 1
        per_row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        if rows > MAX_CHECKPOINT_ROWS or per_row > MAX_ROW_VALUES:
            self.close()
            raise SourceFormatError(
                f"{where} declares an array of shape {tuple(shape)} and dtype {dtype}; a DQN "
                f"Replay checkpoint file holds at most {MAX_CHECKPOINT_ROWS:,} rows of at most "
                f"84x84 values. The file is damaged or not from DQN Replay; replace it with a "
                f"good copy (nothing was allocated for it)."
            )
        self.shape: tuple[int, ...] = tuple(shape)
        self.fortran: bool = bool(fortran)
        self.dtype: np.dtype = dtype

    def _gzip_error(self, exc: BaseException) -> SourceFormatError:
        return SourceFormatError(
            f"{self.where} is truncated or corrupt ({type(exc).__name__}: {exc}); expected a "
            f"complete gzip stream. Download or copy the file again."
        )

    def readinto(self, buf: np.ndarray) -> None:
        """Fill ``buf`` (C-contiguous) entirely from the stream or raise SourceFormatError."""
        view = buf.data.cast("B")  # raises TypeError unless C-contiguous
        got = 0
        try:
            while got < len(view):
                n = self._fh.readinto(view[got:])
                if not n:
                    break
                got += n
        except _GZIP_ERRORS as exc:
            raise self._gzip_error(exc) from exc
        if got < len(view):
            raise SourceFormatError(
                f"{self.where} ended early: expected {len(view)} more bytes of array data for "
                f"shape {self.shape}, found {got}. The file is truncated; copy it again."
            )

    def finish(self) -> None:
        """Read to the end so that gzip checks its CRC, and refuse trailing data."""
        try:
            extra = self._fh.read(1)
        except _GZIP_ERRORS as exc:
            raise self._gzip_error(exc) from exc
        if extra:
            raise SourceFormatError(
                f"{self.where} has data after the array of shape {self.shape}; expected the "
                f"file to end there. The file is corrupt; copy it again."
            )

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            self._raw.close()

    def __enter__(self) -> NpyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
