"""TFRecord shards: framing and CRCs as TensorFlow writes them, streaming, every defect named."""

from __future__ import annotations

import base64
import gzip
import io
from pathlib import Path

import numpy as np
import pytest
from atari_zarr_testkit.rl_unplugged import (
    corrupt_record_byte,
    frame_records,
    truncate_shard,
    write_shard,
)

from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.sources.rl_unplugged.tfrecord import iter_records, masked_crc32c, open_shard
from atari_zarr.storage.filesystem import get_fs

# Written by tensorflow 2.x's tf.io.TFRecordWriter (no compression): the records b"abc"
# and b"123456789". The data CRC of the second, c78ab0e5, is the masked form of the
# published CRC-32C check value e3069283.
TF_RAW = bytes.fromhex(
    "0300000000000000b099490e6162636e57f121090000000000000037f97139313233343536373839e5b08ac7"
)
# Written by tf.io.TFRecordWriter(path, options="GZIP"): a tf.train.Example of a terminal
# 3-step episode (checkpoint_idx 5, episode_idx 42, episode_return 150, PNGs from
# tf.io.encode_png), then the records b"abc" and b"".
TF_GZIP = base64.b64decode(
    "H4sIAAAAAAAAA/vDyAAGZ7Tnf+X6ycwlxMWemFySmZ9XLMQuxcrFzMjEzCXCxZ1akFmcn5Ian5lS"
    "IcQqxczFqMUlzsWXnJGanF2Qn5lXgpBg5VLlEizNS87JLChITYkvSi1PLEopFhIQ4uPigVjl4cTA"
    "IHCQ6yITF09+UnFqUVkixL4DTFx7mbjCOwP83Hm5pLiAKnk9PVyCgHQICHOA9Foy+MsCKTlPF8eQ"
    "iNa3Bxl5gbxDC7775/KZL4AY36DOLP2EgfHnbK9rIK6nq5/LOqeEJq4CYgw2hxp8xpCRQYHnwIY+"
    "4f9Nhob7XByebXtfY7E0aGWI1lQvdCozlD9Kg2HTjpTPjyiw0RFkI8PC2ZJv5l8V+szOOOP2vs8P"
    "p2BYBqFCbQtFGfaU8btVoNgoy8WZklmcnF+aVwIP8gZ7CGZgALqEDxaRRaklpUV5QhxCbFwsDAxi"
    "zntPKzUwQwKQYcNMT77EpOS88I+KUBEGTeYZ7DdeNS0CAK1F/tkvAgAA"
)


def records_of(path: str) -> list[tuple[int, bytes]]:
    fs, root = get_fs(path)
    with open_shard(fs, root) as stream:
        return list(iter_records(stream, path))


def one_line_error(excinfo: pytest.ExceptionInfo[BaseException], *parts: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def test_masked_crc_matches_tensorflow():
    assert masked_crc32c(b"123456789") == 0xC78AB0E5
    assert masked_crc32c(memoryview(b"123456789")) == 0xC78AB0E5
    assert masked_crc32c(bytearray(b"123456789")) == 0xC78AB0E5
    assert masked_crc32c((3).to_bytes(8, "little")) == 0x0E4999B0


def test_reads_and_writes_what_tensorflow_writes(tmp_path):
    assert frame_records([b"abc", b"123456789"]) == TF_RAW
    assert list(iter_records(io.BytesIO(TF_RAW), "raw")) == [(0, b"abc"), (1, b"123456789")]
    path = tmp_path / "run_1-00005-of-00050"
    path.write_bytes(TF_GZIP)
    records = records_of(str(path))
    assert [(i, len(d)) for i, d in records] == [(0, 508), (1, 3), (2, 0)]
    assert records[1][1] == b"abc"


def test_open_shard_reads_any_fsspec_url():
    fs, root = get_fs("memory://rlu-open-shard")
    fs.pipe_file(root + "/s", gzip.compress(frame_records([b"a" * 10, b"b"])))
    with open_shard(fs, root + "/s") as stream:
        assert [d for _, d in iter_records(stream, "s")] == [b"a" * 10, b"b"]


def test_missing_shard_is_named(tmp_path):
    fs, root = get_fs(str(tmp_path))
    with pytest.raises(SourceNotFoundError, match="run_1-00001-of-00050: the shard does not"):
        with open_shard(fs, f"{root}/run_1-00001-of-00050"):
            pass


@pytest.mark.parametrize(
    ("cut", "what"),
    [
        (5, "record 1: the shard ends inside the record's header"),
        (12 + 3, "record 1: the shard ends inside the record's data (3 of 6 bytes)"),
        (12 + 6 + 2, "record 1: the shard ends inside the record's footer"),
    ],
)
def test_a_record_cut_short_is_named(cut, what):
    data = frame_records([b"first", b"second"])
    first = 12 + 5 + 4
    with pytest.raises(SourceFormatError) as excinfo:
        list(iter_records(io.BytesIO(data[: first + cut]), "gs://b/run_1-00000-of-00050"))
    one_line_error(excinfo, "gs://b/run_1-00000-of-00050: ", what, "fetching it again gives the same")
    # a local file, by contrast, can be downloaded again
    with pytest.raises(SourceFormatError) as excinfo:
        list(iter_records(io.BytesIO(data[: first + cut]), "/data/Pong/run_1-00000-of-00050"))
    one_line_error(excinfo, "/data/Pong/run_1-00000-of-00050: ", what, "download it again")


def test_bad_length_crc_is_named():
    data = bytearray(frame_records([b"x", b"yz"]))
    data[12 + 1 + 4 + 8] ^= 1  # the second record's length CRC
    with pytest.raises(SourceFormatError) as excinfo:
        list(iter_records(io.BytesIO(bytes(data)), "shard"))
    one_line_error(excinfo, "shard: record 1: the CRC of the record's length does not match")


def test_flipped_byte_in_a_record_is_named(tmp_path):
    path = tmp_path / "run_1-00000-of-00003"
    write_shard(path, [b"a" * 100, b"b" * 100, b"c" * 100])
    corrupt_record_byte(path, 1)
    with gzip.open(path) as stream:  # the GZIP stream itself is intact
        assert len(stream.read()) == 3 * 116
    with pytest.raises(SourceFormatError) as excinfo:
        records_of(str(path))
    one_line_error(excinfo, f"{path}: record 1: the CRC of the record's data does not match")


def test_truncated_gzip_is_named(tmp_path):
    path = tmp_path / "run_1-00000-of-00003"
    write_shard(path, [bytes(range(256)) * 40 for _ in range(4)])
    truncate_shard(path, 0.6)
    with pytest.raises(SourceFormatError) as excinfo:
        records_of(str(path))
    one_line_error(excinfo, f"{path}: record ", "GZIP stream is corrupt or truncated")


def test_truncated_tfrecord_inside_valid_gzip_is_named(tmp_path):
    path = tmp_path / "run_1-00000-of-00003"
    write_shard(path, [b"a" * 100, b"b" * 100])
    truncate_shard(path, 0.75, compressed=False)
    with pytest.raises(SourceFormatError) as excinfo:
        records_of(str(path))
    one_line_error(excinfo, f"{path}: record 1: the shard ends inside the record's data")


def test_corrupt_gzip_is_named(tmp_path):
    path = tmp_path / "run_1-00000-of-00003"
    write_shard(path, [bytes(range(256)) * 40])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SourceFormatError) as excinfo:
        records_of(str(path))
    one_line_error(excinfo, f"{path}: record 0: the GZIP stream is corrupt or truncated")


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (frame_records([b"uncompressed"]), r"not a GZIP file \(the file starts b'\\x0c\\x00'\)"),
        (b"", r"not a GZIP file \(the file is empty\)"),
    ],
)
def test_not_gzip_at_all_is_named(tmp_path, content, what):
    path = tmp_path / "run_1-00000-of-00003"
    path.write_bytes(content)
    with pytest.raises(SourceFormatError, match=rf"^{path}: record 0: {what}"):
        records_of(str(path))


class CountingReader(io.RawIOBase):
    """A file that counts the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        n = self._data.readinto(buffer)
        self.read_bytes += n
        return n


def test_records_stream_without_reading_the_shard_whole():
    records = [bytes([i]) * 200_000 for i in range(20)]
    raw = frame_records(records)
    counting = CountingReader(raw)
    stream = io.BufferedReader(counting, buffer_size=64 << 10)
    it = iter_records(stream, "s")
    index, first = next(it)
    assert (index, first) == (0, records[0])
    assert counting.read_bytes < 400_000 < len(raw)
    assert sum(1 for _ in it) == 19


def test_gzip_shard_streams_too(tmp_path):
    path = tmp_path / "s"
    rng = np.random.default_rng(0)
    write_shard(path, [rng.bytes(200_000) for _ in range(10)])  # incompressible: 2 MB on disk

    class Counting(io.FileIO):
        read_bytes = 0

        def readinto(self, buffer):  # type: ignore[no-untyped-def]
            n = super().readinto(buffer)
            Counting.read_bytes += n or 0
            return n

    with Counting(path) as raw, gzip.GzipFile(fileobj=io.BufferedReader(raw, 8192)) as stream:
        next(iter_records(stream, "s"))
        assert Counting.read_bytes < Path(path).stat().st_size


# A memory limit far below what the declared records would take: a regression fails
# (MemoryError, or a one-line error missing) instead of exhausting the machine.
_UNDER_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
from atari_zarr.errors import SourceFormatError
from atari_zarr.sources.rl_unplugged.tfrecord import iter_records, open_shard
from atari_zarr.storage.filesystem import get_fs
path = sys.argv[1]
fs, p = get_fs(path)
try:
    with open_shard(fs, p) as stream:
        for _ in iter_records(stream, path):
            pass
except SourceFormatError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize(
    ("length", "what"),
    [
        ((1 << 31) - 1, "more than an episode"),  # a 2 GB record: before, 2.16 GB per worker
        (200 << 20, "ends inside the record's data"),  # plausible, but 1 MB is there
    ],
)
def test_a_huge_declared_record_is_refused_without_allocating_it(tmp_path, length, what):
    import struct
    import subprocess
    import sys

    header = struct.pack("<Q", length)
    body = header + struct.pack("<I", masked_crc32c(header)) + b"\0" * (1 << 20)
    path = tmp_path / "run_1-00000-of-00001"
    path.write_bytes(gzip.compress(body, mtime=0))
    assert path.stat().st_size < (1 << 20)
    res = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, str(path)], capture_output=True, text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    line = res.stdout.strip()
    assert line.startswith("refused:") and "\n" not in line and "record 0" in line, line
    assert what in line and str(path) in line, line
