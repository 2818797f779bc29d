"""Plain ``.npy`` bytes read on any thread: headers parsed one at a time, never unpickled.

numpy parses a ``.npy`` header with ``ast.literal_eval``, and CPython 3.11 can fail two
parses run on two threads at once ("AST constructor recursion depth mismatch",
python/cpython#106905). Conversion reads DQN Replay's headers and its own work files on
dask's threads, so every header this package parses goes through :data:`HEADER_PARSE`.
"""

from __future__ import annotations

import io
import threading
from typing import Any

import numpy as np
import numpy.lib.format as npformat

__all__ = ["HEADER_PARSE", "load", "read_header"]

#: Held while numpy parses a ``.npy`` header (whatever reads it: a stream, bytes, a ``.npz``).
HEADER_PARSE = threading.Lock()


def read_header(fh: Any, version: tuple[int, int]) -> tuple[Any, bool, np.dtype]:
    """Shape, Fortran order and dtype of the header that ``fh`` is at (after the magic).

    The header's bytes are read outside the lock; only their parse is inside.

    Examples
    --------
    >>> buf = io.BytesIO()
    >>> np.save(buf, np.zeros((2, 3), np.uint8))
    >>> _ = buf.seek(0)
    >>> read_header(buf, npformat.read_magic(buf))
    ((2, 3), False, dtype('uint8'))
    """
    length = fh.read(2 if version == (1, 0) else 4)
    raw = length + fh.read(int.from_bytes(length, "little"))
    read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
    with HEADER_PARSE:
        return read(io.BytesIO(raw))  # type: ignore[no-any-return]


def load(raw: bytes) -> np.ndarray:
    """The array of the plain ``.npy`` bytes ``raw`` (a pickled one is refused).

    Examples
    --------
    >>> buf = io.BytesIO()
    >>> np.save(buf, np.arange(3))
    >>> load(buf.getvalue()).tolist()
    [0, 1, 2]
    """
    with HEADER_PARSE:
        return np.load(io.BytesIO(raw), allow_pickle=False)  # type: ignore[no-any-return]
