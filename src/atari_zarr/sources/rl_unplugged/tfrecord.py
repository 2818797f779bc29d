"""TFRecord shards: the GZIP stream, the record framing and its masked CRC-32C checksums.

A shard of RL Unplugged's Atari episodes is one GZIP stream. Decompressed, it is a
sequence of records, each framed the way TensorFlow's ``TFRecordWriter`` frames it:

.. code-block:: text

    uint64 length                      little endian
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

Reading is streaming: :func:`open_shard` inflates as the records are read (with
isal's ``igzip`` when installed, :mod:`~atari_zarr.sources.gzip_stream`), and
:func:`iter_records` holds one record at a time, so memory does not grow with
the shard (0.5 to 2 GB each in the dataset). Every checksum is verified, and every
failure names the shard and the record index.

Examples
--------
>>> import io
>>> from atari_zarr.record.rl_unplugged import frame_records
>>> stream = io.BytesIO(frame_records([b"first", b"second"]))
>>> list(iter_records(stream, "shard"))
[(0, b'first'), (1, b'second')]
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import google_crc32c

from atari_zarr.errors import SourceFormatError, SourceNotFoundError, damaged_advice
from atari_zarr.sources.gzip_stream import GZIP_ERRORS, open_gzip

if TYPE_CHECKING:
    from atari_zarr.storage.filesystem import FileSystem

__all__ = [
    "HEADER_SIZE",
    "PREFIX_BLOCK",
    "READ_BLOCK",
    "compressed_position",
    "iter_records",
    "masked_crc32c",
    "open_shard",
]

#: Bytes before a record's data: its length (uint64) and the length's masked CRC (uint32).
HEADER_SIZE = 12
#: Bytes after a record's data: the data's masked CRC (uint32).
FOOTER_SIZE = 4
#: Compressed bytes read from the file system per request (a ranged GET for remote shards).
READ_BLOCK = 4 << 20
#: The same when only a prefix of the shard is read: what is fetched beyond the last
#: record read is at most about this (plus the GZIP reader's buffer).
PREFIX_BLOCK = 256 << 10
#: Added to the rotated CRC by TensorFlow's ``crc32c::Mask``.
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
#: Steps of an RL Unplugged Atari episode at most: dopamine's 27,000-step limit, with slack.
MAX_EPISODE_STEPS = 28_000
#: Bytes of one step at most: an 84x84 frame as a PNG stored without compression, and the
#: step's scalars.
MAX_STEP_BYTES = 8 << 10
#: Records longer than this are not episodes of 84x84 frames (the largest are a few MB).
MAX_RECORD = MAX_EPISODE_STEPS * MAX_STEP_BYTES
# Bytes read at a time inside a record: memory grows with the data found, not the length
# a header declares.
_READ_CHUNK = 8 << 20


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TensorFlow's masked CRC-32C of ``data``: the CRC rotated right by 15 bits plus a constant.

    Examples
    --------
    >>> hex(google_crc32c.value(b"123456789"))  # the published CRC-32C check value
    '0xe3069283'
    >>> hex(masked_crc32c(b"123456789"))  # as TensorFlow's TFRecordWriter frames it
    '0xc78ab0e5'
    """
    # google-crc32c takes read-only bytes only
    crc = google_crc32c.value(data if isinstance(data, bytes) else bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@contextlib.contextmanager
def open_shard(fs: FileSystem, path: str, block_size: int = READ_BLOCK) -> Iterator[BinaryIO]:
    """Open a shard as its decompressed byte stream, inflated as it is read.

    The compressed bytes come from ``fs.open(path, "rb")``: for a remote file
    system, ranged reads of ``block_size`` bytes (:data:`READ_BLOCK`, or
    :data:`PREFIX_BLOCK` when only a prefix will be read), each bounded by the
    deadline. The shard is never held whole. GZIP errors surface while reading,
    in :func:`iter_records`, which names the record.

    Parameters
    ----------
    fs : FileSystem
        From :func:`atari_zarr.storage.filesystem.get_fs`.
    path : str
        Path of the shard within ``fs``.

    Raises
    ------
    SourceNotFoundError
        There is no file at ``path``.
    SourceFormatError
        The file is empty, or does not start as a GZIP file does.

    Examples
    --------
    >>> import gzip
    >>> from atari_zarr.storage.filesystem import get_fs
    >>> from atari_zarr.record.rl_unplugged import frame_records
    >>> fs, root = get_fs("memory://doc-tfrecord")
    >>> fs.pipe_file(root + "/run_1-00000-of-00001", gzip.compress(frame_records([b"ep"])))
    >>> with open_shard(fs, root + "/run_1-00000-of-00001") as stream:
    ...     [data for _, data in iter_records(stream, "run_1-00000-of-00001")]
    [b'ep']
    """
    try:
        raw = fs.open(path, "rb", block_size=block_size)
    except FileNotFoundError:
        raise SourceNotFoundError(
            f"{fs.url(path)}: the shard does not exist (anymore); expected a GZIP TFRecord "
            f"file of RL Unplugged. Check the source URL, or list the run again."
        ) from None
    with contextlib.closing(raw):
        _check_gzip_magic(raw, fs.url(path))
        # reading a prefix: the GZIP reader asks small reads too (it asks 512 KiB)
        max_read = block_size // 4 if block_size < READ_BLOCK else None
        with contextlib.closing(open_gzip(raw, max_read)) as reader:
            reader.compressed_tell = raw.tell  # type: ignore[attr-defined]
            yield cast("BinaryIO", reader)


def compressed_position(stream: BinaryIO) -> int | None:
    """Bytes of the compressed file read so far by ``stream`` (from :func:`open_shard`;
    None for another stream): what a reader that stops early has fetched, within a
    block."""
    tell = getattr(stream, "compressed_tell", None)
    return int(tell()) if tell is not None else None


def _check_gzip_magic(raw: BinaryIO, where: str) -> None:
    """Refuse an empty file or one that is not GZIP at all (gzip reads an empty file as empty)."""
    if not raw.seekable():  # pragma: no cover - every FileSystem.open gives a seekable file
        return
    head = raw.read(2)
    raw.seek(0)
    if head != b"\x1f\x8b":
        found = "the file is empty" if not head else f"the file starts {head!r}"
        raise SourceFormatError(
            f"{where}: record 0: not a GZIP file ({found}); expected a GZIP-compressed "
            f"TFRecord file of RL Unplugged. {damaged_advice(where)}"
        )


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    """``n`` bytes, or fewer at the end of the stream; read in pieces, so that a length
    a damaged header declares never becomes one allocation."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        # a raw or non-blocking stream may return less than asked; only b"" means the end
        more = stream.read(min(n - got, _READ_CHUNK))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def iter_records(stream: BinaryIO, where: str) -> Iterator[tuple[int, bytes]]:
    """Yield ``(record_index, data)`` for each record of a decompressed TFRecord stream.

    Both masked CRCs of every record are verified. One record is held at a time.

    Parameters
    ----------
    stream : binary file object
        The decompressed stream (:func:`open_shard`), or any readable binary file.
    where : str
        The shard's path or URL, for messages.

    Raises
    ------
    SourceFormatError
        Naming ``where`` and the record index: the stream ends inside a record's
        header, data or footer; a length or data CRC does not match; the GZIP
        stream is corrupt or truncated.

    Examples
    --------
    >>> import io
    >>> from atari_zarr.record.rl_unplugged import frame_records
    >>> data = frame_records([b"episode"])
    >>> list(iter_records(io.BytesIO(data), "s"))
    [(0, b'episode')]
    >>> list(iter_records(io.BytesIO(data[:-2]), "s"))
    Traceback (most recent call last):
        ...
    atari_zarr.errors.SourceFormatError: s: record 0: the shard ends inside the record's footer...
    """
    index = 0
    while True:
        try:
            header = _read_exact(stream, HEADER_SIZE)
            if not header:
                return
            if len(header) < HEADER_SIZE:
                raise _error(where, index, "the shard ends inside the record's header", header)
            length, length_crc = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != length_crc:
                raise _error(
                    where,
                    index,
                    f"the CRC of the record's length does not match (length {length}, "
                    f"stored CRC {length_crc:#010x}, computed {masked_crc32c(header[:8]):#010x})",
                )
            if length > MAX_RECORD:
                raise _error(
                    where,
                    index,
                    f"the record declares {length:,} bytes, more than an episode of at most "
                    f"{MAX_EPISODE_STEPS:,} steps of 84x84 frames takes ({MAX_RECORD:,} bytes)",
                )
            data = _read_exact(stream, length)
            if len(data) < length:
                raise _error(
                    where,
                    index,
                    f"the shard ends inside the record's data ({len(data)} of {length} bytes)",
                )
            footer = _read_exact(stream, FOOTER_SIZE)
            if len(footer) < FOOTER_SIZE:
                raise _error(where, index, "the shard ends inside the record's footer")
        except GZIP_ERRORS as exc:
            raise SourceFormatError(
                f"{where}: record {index}: the GZIP stream is corrupt or truncated "
                f"({type(exc).__name__}: {exc}); expected a complete GZIP-compressed TFRecord "
                f"file. {damaged_advice(where)}"
            ) from None
        (data_crc,) = _FOOTER.unpack(footer)
        computed = masked_crc32c(data)
        if computed != data_crc:
            raise _error(
                where,
                index,
                f"the CRC of the record's data does not match (stored {data_crc:#010x}, "
                f"computed {computed:#010x})",
            )
        yield index, data
        index += 1


def _error(where: str, index: int, what: str, found: Any = None) -> SourceFormatError:
    detail = f" (found {len(found)} bytes)" if isinstance(found, bytes) else ""
    return SourceFormatError(
        f"{where}: record {index}: {what}{detail}; expected an intact TFRecord as TensorFlow "
        f"writes it. {damaged_advice(where)}"
    )
