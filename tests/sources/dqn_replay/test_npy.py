"""The safe .npy stream: plain arrays only, every defect named with its file."""

from __future__ import annotations

import gzip
import io
import pickle

import fsspec
import numpy as np
import pytest

from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.sources.dqn_replay.npy import NpyStream, gzip_backend

FS = fsspec.filesystem("file")


def write(path, payload: bytes) -> str:
    path.write_bytes(payload)
    return str(path)


def gz_npy(array: np.ndarray) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        np.save(gz, array, allow_pickle=array.dtype.hasobject)
    return raw.getvalue()


def test_streams_blocks_and_checks_the_end(tmp_path):
    frames = np.arange(10 * 4, dtype=np.uint8).reshape(10, 4)
    path = write(tmp_path / "a.gz", gz_npy(frames))
    with NpyStream(FS, path, path) as stream:
        assert stream.shape == (10, 4) and stream.dtype == np.uint8 and not stream.fortran
        block = np.empty((6, 4), np.uint8)
        stream.readinto(block)
        np.testing.assert_array_equal(block, frames[:6])
        rest = np.empty((4, 4), np.uint8)
        stream.readinto(rest)
        np.testing.assert_array_equal(rest, frames[6:])
        stream.finish()
    assert gzip_backend() in ("isal", "gzip")


def test_pickle_is_never_loaded(tmp_path, monkeypatch):
    path = write(tmp_path / "p.gz", gzip.compress(pickle.dumps(np.zeros(3))))

    def forbidden(*args, **kwargs):  # pragma: no cover - must not be called
        raise AssertionError("unpickling attempted")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    with pytest.raises(SourceFormatError, match=r"p\.gz is not a plain \.npy file inside gzip"):
        NpyStream(FS, path, path)


def test_object_arrays_are_refused(tmp_path):
    path = write(tmp_path / "o.gz", gz_npy(np.array([{"a": 1}], dtype=object)))
    with pytest.raises(SourceFormatError, match=r"o\.gz holds a Python object array"):
        NpyStream(FS, path, path)


def test_short_and_long_files(tmp_path):
    path = write(tmp_path / "s.gz", gz_npy(np.zeros(8, np.int32)))
    with NpyStream(FS, path, path) as stream:
        with pytest.raises(SourceFormatError, match=r"s\.gz ended early: expected 40 more bytes"):
            stream.readinto(np.empty(10, np.int32))
    with NpyStream(FS, path, path) as stream:
        stream.readinto(np.empty(4, np.int32))
        with pytest.raises(SourceFormatError, match=r"s\.gz has data after the array"):
            stream.finish()


def test_missing_and_corrupt_files(tmp_path):
    missing = str(tmp_path / "gone.gz")
    with pytest.raises(SourceNotFoundError, match=r"gone\.gz does not exist"):
        NpyStream(FS, missing, missing)
    data = gz_npy(np.random.default_rng(0).integers(0, 255, 100_000, dtype=np.uint8))
    path = write(tmp_path / "c.gz", data[: len(data) // 2])
    with NpyStream(FS, path, path) as stream:  # the header is intact: the data is not
        with pytest.raises(SourceFormatError, match=r"c\.gz (is truncated or corrupt|ended early)"):
            stream.readinto(np.empty(100_000, np.uint8))
    path = write(tmp_path / "h.gz", data[:20])
    with pytest.raises(SourceFormatError, match=r"h\.gz is truncated or corrupt \(EOFError"):
        NpyStream(FS, path, path)


def _declared(shape: tuple[int, ...], dtype: str = "<i4", payload: int = 64) -> bytes:
    """A gzip'd .npy whose header declares ``shape`` but holds only ``payload`` bytes."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        header = {"descr": dtype, "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(gz, header)
        gz.write(b"\0" * payload)
    return raw.getvalue()


# A memory limit far below what the declared arrays would take: a regression fails
# (MemoryError, or a one-line error missing) instead of exhausting the machine.
_UNDER_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import fsspec
from atari_zarr.errors import SourceFormatError
from atari_zarr.sources.dqn_replay.npy import NpyStream
import numpy as np
path = sys.argv[1]
try:
    with NpyStream(fsspec.filesystem("file"), path, path) as stream:
        np.empty(stream.shape, stream.dtype)
except SourceFormatError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("shape", [(2**40,), (500_000_000,), (1000, 2**20)])
def test_a_declared_size_beyond_a_checkpoint_is_refused_before_allocating(tmp_path, shape):
    import subprocess
    import sys

    path = write(tmp_path / "bomb.gz", _declared(shape))
    assert (tmp_path / "bomb.gz").stat().st_size < 4096  # a few KB that declare gigabytes
    res = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, path], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    line = res.stdout.strip()
    assert line.startswith("refused:") and "\n" not in line, line
    assert path in line and str(tuple(shape)) in line and "1,000,000 rows" in line
