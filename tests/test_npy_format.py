"""Plain .npy bytes: headers parsed one at a time, pickles refused."""

from __future__ import annotations

import io
import threading

import numpy as np
import numpy.lib.format as npformat
import pytest

from atari_zarr.npy_format import HEADER_PARSE, load, read_header


def _npy(array: np.ndarray, **kwargs) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_read_header_gives_what_numpy_wrote_and_leaves_the_file_at_the_data(version):
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    buf = io.BytesIO()
    npformat.write_array(buf, data, version=version)
    buf.seek(0)
    assert read_header(buf, npformat.read_magic(buf)) == ((3, 4), False, np.dtype(np.int32))
    assert np.frombuffer(buf.read(), dtype=np.int32).tolist() == list(range(12))


def test_load_refuses_a_pickled_array():
    assert load(_npy(np.arange(3))).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="allow_pickle"):
        load(_npy(np.array([{"a": 1}], dtype=object), allow_pickle=True))


@pytest.mark.parametrize("how", ["load", "read_header"])
def test_headers_are_parsed_one_at_a_time(how):
    """CPython 3.11 can fail two parses on two threads at once: each waits for the lock."""
    raw = _npy(np.zeros((2, 84, 84), np.uint8))

    def parse() -> None:
        if how == "load":
            load(raw)
        else:
            f = io.BytesIO(raw)
            read_header(f, npformat.read_magic(f))

    done = threading.Event()
    thread = threading.Thread(target=lambda: (parse(), done.set()))
    with HEADER_PARSE:
        thread.start()
        assert not done.wait(0.2)  # held here, so the parse waits
    assert done.wait(60)
    thread.join()
