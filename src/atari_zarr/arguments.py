"""The one check of a whole-number argument, the one grammar of checkpoint lists.

Batch sizes, frame stacks, window lengths, prefetch depths, byte bounds: every
whole number a user passes is checked here, so a float is refused rather than
rounded, ``True`` is not 1, a NumPy or torch scalar is accepted, and the error
names the argument, what was expected, what was found and where. Checkpoints
(DQN Replay's suffixes, RL Unplugged's shards) are asked for as ``"0-9,50"`` or a
list, read by :func:`parse_indices` and written back by :func:`spans`.

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

import operator
from collections.abc import Iterable
from typing import Any

import numpy as np

from atari_zarr.errors import InvalidArgumentError

__all__ = ["MAX_PARTS", "parse_indices", "spans", "whole_number"]

#: No run has more checkpoints (RL Unplugged's shard numbers have five digits): a range
#: is checked against it before it is spelled out.
MAX_PARTS = 100_000


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


def _digits(text: str) -> int:
    """The number ``text`` spells in ASCII digits only (``int`` also takes ``"٣"``, ``"+3"``
    and ``"1_0"``)."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def parse_indices(spec: str | Iterable[int], where: str, limit: int | None = None) -> list[int]:
    """Checkpoint numbers from ``"0-9,50"`` or a list, sorted, each below ``limit``
    (default :data:`MAX_PARTS`), checked before a range is spelled out.

    Raises
    ------
    InvalidArgumentError
        A part that is not a number or an ascending range, or a number not below ``limit``.

    Examples
    --------
    >>> parse_indices("9,0-2", "--checkpoints")
    [0, 1, 2, 9]
    >>> spans(parse_indices([5, 3, 4], "--checkpoints"))
    '3-5'
    """
    bound = MAX_PARTS if limit is None else limit
    pairs: list[tuple[int, int]] = []
    try:
        if isinstance(spec, str):
            for piece in spec.split(","):
                a, dash, b = piece.strip().partition("-")
                pairs.append((_digits(a), _digits(b) if dash else _digits(a)))
        else:
            pairs = [(operator.index(v), operator.index(v)) for v in spec]
    except (TypeError, ValueError):
        pairs = []
    if not pairs or min(a for a, _ in pairs) < 0 or any(b < a for a, b in pairs):
        raise InvalidArgumentError(
            f"{where} {spec!r} is not a suffix or a range (a list of them); expected e.g. "
            f"'0-9,50' or [0, 1]. Pass checkpoint numbers, low to high"
        )
    top = max(b for _, b in pairs)
    if top >= bound:
        raise InvalidArgumentError(
            f"{where} {spec!r} goes up to {top}, but "
            f"{'a run has at most' if limit is None else 'the run has'} {bound} checkpoints "
            f"(0 to {bound - 1}); choose among those"
        )
    return sorted({v for a, b in pairs for v in range(a, b + 1)})


def spans(values: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2,5"``, what :func:`parse_indices` reads.

    Examples
    --------
    >>> spans([5, 0, 2, 1])
    '0-2,5'
    """
    out: list[str] = []
    items = sorted(set(values))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)
