"""The one normalisation of an index into rows, shared by every reader of this package.

:class:`~atari_zarr.AtariZarrDataset`, :class:`~atari_zarr.MultiGameDataset` and the
TorchRL storage all accept what a 1-d NumPy array or tensor accepts: an int, a
slice, a sequence, array or tensor of ints, or a boolean mask; negative numbers
count from the end.

Errors are the built-ins Python's own containers raise (IndexError out of range,
TypeError for a float index), not :class:`~atari_zarr.errors.AtariZarrError`: a bad
index is a mistake in the calling program, never a store or input problem the
command line reports, and ``except IndexError`` is how Python code (the legacy
iteration protocol included) expects to catch it.

Examples
--------
>>> rows, scalar = normalize_index(-1, 10, "memory")
>>> rows.tolist(), scalar
([9], True)
>>> normalize_index(slice(2, 8, 3), 10, "memory")[0].tolist()
[2, 5]
>>> normalize_index(np.arange(10) % 4 == 0, 10, "memory")[0].tolist()
[0, 4, 8]
>>> normalize_index([3, 10], 10, "store.zarr")
Traceback (most recent call last):
    ...
IndexError: index 10 is out of range for store.zarr with 10 transitions
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["normalize_index"]


def normalize_index(
    idx: Any, n: int, where: str, *, unit: str = "transitions"
) -> tuple[np.ndarray, bool]:
    """Rows ``idx`` selects from ``n`` items, and whether it was a single item.

    Parameters
    ----------
    idx : int, slice, range, sequence, numpy.ndarray or torch.Tensor
        Integers (negative ones count from the end) or a boolean mask of length ``n``.
        A 1-tuple is its element; an ``(B, 1)`` column (what some TorchRL samplers
        hand over) is a batch of ``B``.
    n : int
        Number of transitions.
    where : str
        What is indexed (a store's URL), for the error message.
    unit : str
        What the ``n`` items are, for the error message (``"transitions"``,
        ``"windows"``).

    Returns
    -------
    rows : numpy.ndarray
        ``(B,)`` int64 in ``[0, n)``, a new array (never a view of ``idx``).
    scalar : bool
        True for a single item (an int or a 0-d array or tensor).

    Raises
    ------
    IndexError
        A row out of ``[-n, n)``, a mask of another length, or a multi-dimensional index.
    TypeError
        Neither integers nor a boolean mask.
    """
    if isinstance(idx, tuple):
        if len(idx) != 1:
            raise IndexError(f"{where} is one-dimensional; got a {len(idx)}-d index {idx!r}")
        idx = idx[0]
    if isinstance(idx, slice):
        return np.arange(*idx.indices(n), dtype=np.int64), False
    if isinstance(idx, torch.Tensor):
        idx = idx.detach().cpu().numpy()
    arr = np.asarray(idx)
    scalar = arr.ndim == 0
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    elif arr.ndim > 1:
        raise IndexError(
            f"{where} is one-dimensional; got an index of shape {arr.shape} "
            f"(pass a flat batch of row numbers)"
        )
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise IndexError(
                f"boolean index of shape {arr.shape} does not match the {n} {unit} of {where}"
            )
        return np.flatnonzero(arr), False
    if arr.dtype.kind not in "iu":
        if arr.size == 0:  # an empty list is float64 to NumPy: still no rows
            return np.zeros(0, dtype=np.int64), False
        raise TypeError(
            f"indices must be integers, a slice, or a boolean mask (indexing {where}); "
            f"got dtype {arr.dtype}"
        )
    if arr.size:
        # compared before any cast, so a huge unsigned index cannot wrap to a valid one
        lo, hi = arr.min(), arr.max()
        if lo < -n or hi >= n:
            bad = lo if lo < -n else hi
            raise IndexError(f"index {int(bad)} is out of range for {where} with {n} {unit}")
    rows = np.atleast_1d(arr).astype(np.int64)  # a copy: the batch must not alias idx
    if arr.size and lo < 0:
        rows[rows < 0] += n
    return rows, scalar
