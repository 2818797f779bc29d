"""The one check of a whole-number argument, and its one-line error.

Batch sizes, frame stacks, window lengths, prefetch depths, byte bounds: every
whole number a user passes is checked here, so a float is refused rather than
rounded, ``True`` is not 1, a NumPy or torch scalar is accepted, and the error
names the argument, what was expected, what was found and where.

Examples
--------
>>> whole_number(256, "batch_size", "Pong/1.zarr", low=0, unit="items")
256
>>> whole_number(2.5, "batch_size", "Pong/1.zarr", low=0, unit="items")
Traceback (most recent call last):
    ...
atari_zarr.errors.InvalidArgumentError: batch_size must be a non-negative integer (items); \
got 2.5 for Pong/1.zarr. Pass an int 0 or more
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atari_zarr.errors import InvalidArgumentError

__all__ = ["whole_number"]


def whole_number(value: Any, name: str, where: str, *, low: int = 1, unit: str = "") -> int:
    """``value`` as an int of at least ``low``, or a one-line error naming ``name`` and ``where``.

    Parameters
    ----------
    value : object
        What was passed: an int, or a NumPy or torch integer (0-d arrays too).
    name : str
        The argument, as the caller spelled it.
    where : str
        What it was passed for (a store's URL, a class), for the message.
    low : int
        The smallest value allowed (1: positive; 0: non-negative; -1 where -1 means
        "never").
    unit : str
        What the number counts, for the message (``"items"``, ``"bytes"``).
    """
    found = value
    if getattr(found, "ndim", None) == 0 and hasattr(found, "item"):
        found = found.item()  # a 0-d NumPy or torch number
    if isinstance(found, bool) or not isinstance(found, int | np.integer) or found < low:
        kind = {1: "a positive integer", 0: "a non-negative integer"}.get(
            low, f"an integer of at least {low}"
        )
        what = f" ({unit})" if unit else ""
        raise InvalidArgumentError(
            f"{name} must be {kind}{what}; got {value!r} for {where}. Pass an int {low} or more"
        )
    return int(found)
