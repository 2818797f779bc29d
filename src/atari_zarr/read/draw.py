"""Random batches drawn ahead of use, so their fetches overlap: one loop for every reader.

"Drawn ahead" is one of four kinds of "ahead" in :mod:`atari_zarr.read`, each with
its own name: batches *drawn* ahead (here: ``sample_iter(prefetch=k)``, as TorchRL's
``prefetch``), encoded chunks *fetched* ahead (``ChunkReader.fetch_ahead``), chunks
*decoded* ahead of a sequential reader (``ChunkReader(decode_ahead=True)``), and
stream units read ahead (``stream(units_ahead=k)``).

:meth:`AtariZarrDataset.sample_iter <atari_zarr.AtariZarrDataset.sample_iter>`,
:meth:`MultiGameDataset.sample_iter <atari_zarr.MultiGameDataset.sample_iter>` and
the windows' ``sample_iter`` draw their batches in groups of ``prefetch``, in the
same order as repeated ``sample()`` calls would, and hand each group's items to
the reader's ``fetch_ahead`` before the first of them is read: the chunks of a
whole group that lie close together in a shard then share one request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np

from atari_zarr.errors import InvalidArgumentError

__all__ = ["check_batch_size", "check_prefetch", "draw_ahead"]

T = TypeVar("T")


def check_batch_size(batch_size: object, where: str) -> int:
    """``batch_size`` as a number of items to draw, or a one-line error naming ``where``.

    A whole number, 0 or more (a NumPy or torch integer too); a float is refused rather
    than rounded down.

    Examples
    --------
    >>> check_batch_size(256, "ds")
    256
    >>> check_batch_size(2.5, "ds")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: batch_size must be a whole number ... got 2.5 for ds
    """
    value = batch_size
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d NumPy or torch number
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(
            f"batch_size must be a whole number of items, 0 or more; got {batch_size!r} for {where}"
        )
    return value


def check_prefetch(prefetch: object, where: str) -> int:
    """``prefetch`` as a number of batches, or a one-line error naming ``where``.

    Examples
    --------
    >>> check_prefetch(4, "ds")
    4
    >>> check_prefetch(-1, "ds")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: prefetch must be a non-negative number ... got -1 for ds
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise InvalidArgumentError(
            f"prefetch must be a non-negative number of batches; got {prefetch!r} for {where}"
        )
    return prefetch


def draw_ahead(
    draw: Callable[[], np.ndarray],
    read: Callable[[np.ndarray], T],
    fetch_ahead: Callable[[np.ndarray], object],
    *,
    prefetch: int,
    batches: int | None = None,
) -> Iterator[T]:
    """Yield ``read(rows)`` for ``batches`` draws (forever when None), drawn ahead.

    Parameters
    ----------
    draw : callable
        Draws the rows of the next batch (the generator's state advances as it would
        with one ``sample()`` per batch).
    read : callable
        Reads a batch of rows.
    fetch_ahead : callable
        Starts fetching what the rows of a whole group of batches need.
    prefetch : int
        Batches drawn ahead; a new group is drawn when half of them are used (the
        first batch is drawn alone, and the first group while it is read). 0: one
        batch at a time, nothing fetched ahead.
    batches : int, optional
        How many batches in all.

    Examples
    --------
    >>> rows = iter([np.array([0]), np.array([1]), np.array([2])])
    >>> asked = []
    >>> got = draw_ahead(lambda: next(rows), lambda r: int(r[0]), asked.append,
    ...                     prefetch=2, batches=3)
    >>> list(got), [a.tolist() for a in asked]
    ([0, 1, 2], [[1, 2]])
    """
    queue: deque[np.ndarray] = deque()
    drawn = 0
    while True:
        if len(queue) <= prefetch // 2 and (batches is None or drawn < batches):
            # the first batch alone, read at once: its group's fetch would only delay it;
            # the next group is drawn and on its way while it is read
            first = drawn == 0
            count = 1 if first else max(1, prefetch)
            if batches is not None:
                count = min(count, batches - drawn)
            group = [draw() for _ in range(count)]
            drawn += count
            if prefetch and not first:
                fetch_ahead(np.concatenate(group))
            queue.extend(group)
            if first:
                continue
        if not queue:
            return
        yield read(queue.popleft())
