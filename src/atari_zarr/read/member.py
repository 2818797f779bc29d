"""A store in a dataset: :class:`Member`, the one record of it, and :func:`open_all`.

Every reader of items (random access, sampling, the epoch stream, windows) sees its
stores as members: the store (opened, or known by its catalog entry and opened on
first need: :meth:`StoreReader.open <atari_zarr.read.store.StoreReader.open>`), what
an item of it is, the probability of drawing it (the weights a user asked for,
normalised once, by :func:`members`), its ``game_id`` and its name. One store is a
mixture of one. A stream's state records each member's :meth:`Member.identity` and
weight, and loads only into the same members.

Examples
--------
>>> from atari_zarr.read.items import Items
>>> store = StoreReader(store_url)  # the converted Pong/1 fixture
>>> two = members([store, store], [Items.transitions(len(store))] * 2, weights=[1, 3])
>>> [m.weight for m in two], [m.name for m in two]
([0.25, 0.75], ['Pong/1', 'Pong/1'])
>>> two[0].identity()["rows"] == len(store)
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from atari_zarr.read.items import Items
from atari_zarr.read.mixture import store_probabilities
from atari_zarr.read.store import StoreReader

__all__ = ["OPENERS", "Member", "members", "open_all"]

T = TypeVar("T")
U = TypeVar("U")

#: Stores opened at once: opening is a few requests, mostly waiting on the network.
OPENERS = 32


@dataclass(frozen=True)
class Member:
    """One store of a dataset, with what the dataset makes of it.

    Attributes
    ----------
    store : StoreReader
        The store (opened, or known by its catalog entry until first needed).
    items : Items
        What an item of it is (a transition, or a window of ``K`` rows).
    weight : float
        The probability of drawing it (the members' weights sum to 1; 0 for a store
        without items or of weight 0).
    game_id : int or None
        The ``game_id`` its items carry (None: items untagged, one store).
    name : str
        ``"Game/run"`` (its URL where the store does not say).
    """

    store: StoreReader
    items: Items
    weight: float
    game_id: int | None
    name: str

    def identity(self) -> dict[str, Any]:
        """Which store this is, as a stream's state records it: its name, content id,
        rows and frame shards (the units an epoch is cut into)."""
        return {
            "name": self.name,
            "content": self.store.content,
            "rows": len(self.store),
            "shard_rows": self.store.frame_rows()[1],
        }


def members(
    stores: Sequence[StoreReader],
    items: Sequence[Items],
    *,
    weights: Sequence[float] | None = None,
    game_ids: Sequence[int] | np.ndarray | None = None,
    names: Sequence[str] | None = None,
) -> list[Member]:
    """The members of a dataset: ``weights`` (one per store, relative; default by
    items) normalised here, the one place they are.

    An empty dataset (no items, no weights) has members of weight 0: sampling it says
    there is nothing to sample.
    """
    counts = np.array([len(i) for i in items], dtype=np.int64)
    names = list(names) if names is not None else [_name(s) for s in stores]
    probs = (
        store_probabilities(counts, weights, names)
        if counts.sum() or weights is not None
        else np.zeros(len(counts))
    )
    ids = [None] * len(stores) if game_ids is None else [int(g) for g in game_ids]
    return [
        Member(s, i, float(p), g, n)
        for s, i, p, g, n in zip(stores, items, probs, ids, names, strict=True)
    ]


def _name(store: StoreReader) -> str:
    return f"{store.game}/{store.run}" if store.game is not None else store.where


def open_all(
    things: list[T],
    open_one: Callable[[T], U],
    expected: tuple[type[BaseException], ...] = (),
    *,
    remote: bool = True,
) -> list[tuple[Any, BaseException | None]]:
    """``open_one`` of each of ``things``, in order: ``(result, None)``, or
    ``(None, error)`` for an error of a type in ``expected`` (others are raised).

    Opening a store is a few requests; a mixture of 240 stores in a bucket
    (``remote``) opens them ``OPENERS`` at a time on threads, so it waits for about
    ``240 / OPENERS`` round trips of them, not 240. Local stores open one after the
    other: their opening is CPU, which threads would only contend for.

    Examples
    --------
    >>> open_all([1, 2, 0], lambda x: 6 // x, (ZeroDivisionError,))[:2]
    [(6, None), (3, None)]
    """

    def attempt(thing: T) -> tuple[Any, BaseException | None]:
        try:
            return open_one(thing), None
        except expected as exc:
            return None, exc

    if len(things) <= 1 or not remote:
        return [attempt(t) for t in things]
    threads = min(OPENERS, len(things))
    with ThreadPoolExecutor(threads, thread_name_prefix="atari_zarr-open") as pool:
        return list(pool.map(attempt, things))


def open_stores(
    stores: Sequence[StoreReader], step: Callable[[StoreReader], object] = StoreReader.open
) -> None:
    """``step`` (default: open) of those of ``stores`` not opened yet, together (a
    bucket's 32 at a time): ``StoreReader.frame_rows`` reads their ``zarr.json`` alone."""
    todo = [s for s in stores if not s.opened]
    open_all(todo, step, remote=any(s.remote for s in todo))
