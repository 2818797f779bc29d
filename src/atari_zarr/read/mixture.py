"""Several stores as one: their weights, the two-stage draw, and the tags of their items.

Every reader of several stores (random access and sampling of
:class:`~atari_zarr.read.core.ItemDataset`, the epoch stream) mixes them with the
functions here, so a store's weight and an item's ``game_id``, ``row`` and global
``index`` are worked out in one place:

* :func:`store_probabilities`: the probability of drawing each store;
* :func:`draw_mixture` and :class:`MixtureSampler`: a store drawn by weight, then a
  uniform item of it; memory grows with the number of stores, never with the
  number of items;
* :func:`game_numbers`: each store's ``game_id``, its game's place among the sorted
  game names, the same in every process and session;
* :func:`store_weights`: the weights users ask for (per store, per game, uniform over
  games or over transitions) as one weight per store;
* :func:`tag_items`: a batch read from any of the stores as the mixture shows it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError

__all__ = [
    "MixtureSampler",
    "draw_mixture",
    "game_numbers",
    "store_probabilities",
    "store_weights",
    "tag_items",
]


def tag_items(
    td: TensorDict, stores: np.ndarray, row_offsets: np.ndarray, game_ids: np.ndarray
) -> TensorDict:
    """``td``, whose item ``i`` was read from store ``stores[i]``, as a mixture gives it:
    each store's own rows under ``row``, the global ``index`` (the store's
    ``row_offsets`` added; padding keeps -1) and ``game_id`` (``game_ids`` of the store).

    One call for a batch of any number of stores: the tags are a few vector operations,
    whatever the stores a batch touches.

    Examples
    --------
    >>> td = TensorDict({"index": torch.tensor([3, -1, 4])}, batch_size=[3])
    >>> out = tag_items(td, np.array([1, 1, 0]), np.array([0, 100]), np.array([7, 5]))
    >>> out["index"].tolist(), out["row"].tolist(), out["game_id"].tolist()
    ([103, -1, 4], [3, -1, 4], [5, 5, 7])
    """
    stores = np.asarray(stores, dtype=np.int64)
    idx = td["index"]
    shape = (-1,) + (1,) * (idx.ndim - 1)  # windows: one store per item, over its steps
    offset = torch.from_numpy(np.asarray(row_offsets, dtype=np.int64)[stores]).reshape(shape)
    game = torch.from_numpy(np.asarray(game_ids, dtype=np.int64)[stores]).reshape(shape)
    td["row"] = idx
    td["index"] = torch.where(idx >= 0, idx + offset, idx)
    td["game_id"] = game.expand(td.batch_size).contiguous()
    return td


def game_numbers(games: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The mixture's game names, sorted, and each store's ``game_id`` among them.

    The ids depend only on the set of games, not on the order the stores were given
    in, so every process and session of a job numbers them alike; runs of one game
    share its id.

    Examples
    --------
    >>> game_numbers(["Pong", "Breakout", "Pong"])
    (['Breakout', 'Pong'], array([1, 0, 1]))
    """
    names = sorted(set(games))
    at = {name: i for i, name in enumerate(names)}
    return names, np.array([at[g] for g in games], dtype=np.int64)


def store_weights(
    weights: Any,
    stores: Sequence[str],
    games: Sequence[str],
    lengths: Sequence[int] | np.ndarray,
    where: str,
) -> list[float] | None:
    """One weight per store from the weights a user asks for (None: by transitions).

    Parameters
    ----------
    weights : None, "transitions", "games", dict or sequence of float
        ``None`` or ``"transitions"``: every transition alike (stores by their
        length). ``"games"``: every game alike, its stores by their length. A dict:
        the weight of each game (``{"Pong": 2.0, "Breakout": 1.0}``, every game of the
        mixture named, its stores by their length) or of each store
        (``{"Pong/1": 2.0, ...}``). A sequence (a list, or a one-dimensional
        numpy array or torch tensor): one weight per store.
    stores, games : sequence of str
        Each store's name (``Game/run``) and game.
    lengths : sequence of int
        Items per store.
    where : str
        The mixture, for messages.

    Examples
    --------
    >>> store_weights("games", ["Pong/1", "Pong/2", "Qbert/1"], ["Pong", "Pong", "Qbert"],
    ...               [10, 30, 5], "a mixture")
    [0.25, 0.75, 1.0]
    >>> store_weights({"Pong": 3, "Qbert": 1}, ["Pong/1", "Qbert/1"], ["Pong", "Qbert"],
    ...               [10, 5], "a mixture")
    [3.0, 1.0]
    """
    sizes = np.asarray(lengths, dtype=np.float64)
    if weights is None or (isinstance(weights, str) and weights == "transitions"):
        return None
    if isinstance(weights, str) and weights != "games":
        raise InvalidArgumentError(
            f"weights={weights!r} is not a way of weighting {where}: expected 'transitions', "
            f"'games', a dict of game (or Game/run) weights, or one weight per store"
        )
    if isinstance(weights, np.ndarray | torch.Tensor) and weights.ndim == 1:
        weights = weights.tolist()  # Python numbers: a bool stays a bool (refused below)
    if isinstance(weights, list | tuple):  # one per store, in their order
        values = [
            _weight(w, f"store {i} ({s})", where)
            for i, (s, w) in enumerate(zip(stores, weights, strict=False))
        ]
        if len(weights) != len(stores):
            raise InvalidArgumentError(
                f"weights for {where} must be one per store, {len(stores)} for "
                f"{list(stores)}; got {len(weights)}. Pass a list of {len(stores)} weights, "
                f"or a dict of game (or Game/run) weights"
            )
        return values
    if not isinstance(weights, str | dict):
        shown = " ".join(repr(weights).split())  # an array's repr spans lines
        raise InvalidArgumentError(
            f"weights={shown:.80} is not a way of weighting {where}: expected 'transitions', "
            f"'games', a dict of game (or Game/run) weights, or a list of one weight per "
            f"store. Pass a list (a set has no order, a generator is read once)"
        )
    if isinstance(weights, dict):
        named = _named(weights, where)
        if any("/" in key for key in named):  # "Game/run" keys: a weight per store
            _name_each(named, stores, "store", where)
            return [named[s] for s in stores]
    else:
        named = dict.fromkeys(games, 1.0)  # "games"
    _name_each(named, games, "game", where)
    _, ids = game_numbers(games)
    total = np.bincount(ids, weights=sizes)[ids]  # each store's game's items
    share = np.divide(sizes, total, out=np.zeros_like(sizes), where=total > 0)
    return [named[g] * float(x) for g, x in zip(games, share, strict=True)]


def _named(weights: dict[Any, Any], where: str) -> dict[str, float]:
    """A dict of weights, its values numbers 0 or more (a bad one is one line)."""
    return {str(key): _weight(value, repr(key), where) for key, value in weights.items()}


def _weight(value: Any, of: str, where: str) -> float:
    """One weight as given: a finite number 0 or more, or one line naming it."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # 10**400: no double holds it
        number = float("nan")
    if isinstance(value, bool | np.bool_ | str) or not np.isfinite(number) or number < 0:
        raise InvalidArgumentError(
            f"the weight of {of} for {where} must be a number 0 or more; got "
            f"{value!r:.60}. Pass a finite non-negative number"
        )
    return number


def _name_each(named: dict[str, float], wanted: Sequence[str], kind: str, where: str) -> None:
    """Refuse weights that do not name each game (or store) of the mixture, in one line."""
    missing = sorted(set(wanted) - set(named))
    unknown = sorted(set(named) - set(wanted))
    if missing or unknown:
        found = [f"{unknown} are not among them"] if unknown else []
        found += [f"missing {missing}"] if missing else []
        raise InvalidArgumentError(
            f"weights for {where} must name each of its {kind}s {sorted(set(wanted))}; "
            f"{' and '.join(found)}. Give every {kind} a weight (0 leaves one out of random "
            f"batches; a stream still reads every item of it once, its units last)"
        )


def store_probabilities(
    lengths: Sequence[int] | np.ndarray,
    weights: Sequence[float] | np.ndarray | None,
    names: Sequence[str] | None = None,
) -> np.ndarray:
    """The probability of drawing each store: ``weights`` normalised, 0 for empty stores.

    Parameters
    ----------
    lengths : sequence of int
        Transitions per store.
    weights : sequence of float, optional
        Relative weight of each store; default proportional to ``lengths``.
    names : sequence of str, optional
        The stores, for error messages.

    Raises
    ------
    InvalidArgumentError
        Weights that are not one non-negative finite number per store, or no store
        that can be drawn (all empty or weighted 0).

    Examples
    --------
    >>> store_probabilities([10, 0, 30], [1, 5, 1]).tolist()
    [0.5, 0.0, 0.5]
    >>> store_probabilities([10, 30], None).tolist()
    [0.25, 0.75]
    >>> store_probabilities([10, 30], [1e308, 1e308]).tolist()
    [0.5, 0.5]
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    labels = list(names) if names is not None else [f"store {i}" for i in range(sizes.size)]
    w = sizes.astype(np.float64) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != sizes.shape or not np.all(np.isfinite(w)) or (w < 0).any():
        raise InvalidArgumentError(
            f"weights must be {sizes.size} non-negative numbers, one per store "
            f"({labels}); got {None if weights is None else list(weights)}"
        )
    w = np.where(sizes > 0, w, 0.0)
    if not w.size or w.max() <= 0:
        raise InvalidArgumentError(
            f"no store can be drawn: every store is empty or has weight 0 ({labels})"
        )
    # weights are relative: scaled to a largest of 1 first, finite ones as large as 1e308
    # sum without overflow, and ones as small as the smallest double without underflow
    w = w / w.max()
    return w / w.sum()


def draw_mixture(
    offsets: np.ndarray, probs: np.ndarray, count: int, generator: torch.Generator | None
) -> torch.Tensor:
    """``count`` global indices: a store drawn by ``probs``, then a uniform row of it.

    The one two-stage draw behind :meth:`MultiGameDataset.sample` and
    :class:`MixtureSampler`. Memory is ``O(count + stores)``.

    Parameters
    ----------
    offsets : numpy.ndarray
        ``(S + 1,)`` int64: store ``g`` holds global indices ``offsets[g]`` to
        ``offsets[g + 1] - 1``.
    probs : numpy.ndarray
        ``(S,)`` probability of each store (:func:`store_probabilities`).
    count : int
        Indices to draw.
    generator : torch.Generator or None
        Source of randomness (None: torch's global generator).

    Returns
    -------
    torch.Tensor
        ``(count,)`` int64.

    Examples
    --------
    >>> offsets, probs = np.array([0, 10**11, 10**11 + 5]), np.array([0.0, 1.0])
    >>> idx = draw_mixture(offsets, probs, 4, torch.Generator().manual_seed(0))
    >>> [10**11 <= i < 10**11 + 5 for i in idx.tolist()]
    [True, True, True, True]
    """
    offsets_t = torch.as_tensor(np.asarray(offsets, dtype=np.int64))
    if count == 0:  # torch.multinomial refuses to draw nothing
        return torch.zeros(0, dtype=torch.int64)
    if len(probs) == 1:  # one store: a uniform row
        return offsets_t[0] + torch.randint(
            0, int(offsets_t[1] - offsets_t[0]), (count,), generator=generator
        )
    store = torch.multinomial(
        torch.as_tensor(np.asarray(probs, dtype=np.float64)),
        count,
        replacement=True,
        generator=generator,
    )
    # a uniform row of each item's store, for every store at once: a float64 draw has
    # 53 bits, so the bias for stores of up to 2**40 rows is below 2**-13 of a row
    lengths = (offsets_t[1:] - offsets_t[:-1])[store]
    u = torch.rand(count, dtype=torch.float64, generator=generator)
    rows = torch.minimum((u * lengths).long(), lengths - 1)
    return offsets_t[store] + rows


class MixtureSampler(torch.utils.data.Sampler[int]):
    """Indices into a mixture of stores: a store drawn by weight, then a uniform row of it.

    The ``DataLoader`` sampler of :meth:`MultiGameDataset.sampler`, usable on its own
    for any concatenation of datasets. Unlike a ``WeightedRandomSampler`` over one
    weight per transition, it holds one number per store, so a mixture of 60 games
    of 50 M transitions each costs a few kilobytes, not gigabytes. Indices are drawn
    with replacement, in blocks, as iteration asks for them.

    Parameters
    ----------
    lengths : sequence of int
        Transitions per store, in the order the stores are concatenated.
    weights : sequence of float, optional
        Relative probability of each store; default proportional to its length
        (uniform over all transitions).
    num_samples : int
        Indices per pass (``len(sampler)``).
    generator : torch.Generator, optional
        For reproducible draws.

    Examples
    --------
    >>> sampler = MixtureSampler([10**11, 5], [0.5, 0.5], 6,
    ...                          generator=torch.Generator().manual_seed(0))
    >>> len(sampler), all(0 <= i < 10**11 + 5 for i in sampler)
    (6, True)
    """

    #: Indices drawn at a time: bounds the memory of a pass, whatever ``num_samples``.
    block: int = 1 << 16

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        weights: Sequence[float] | np.ndarray | None,
        num_samples: int,
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        whole_number(num_samples, "num_samples", "MixtureSampler", low=0)
        self.probs = store_probabilities(lengths, weights)
        self.offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
        self.num_samples = int(num_samples)
        self.generator = generator

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        for start in range(0, self.num_samples, self.block):
            count = min(self.block, self.num_samples - start)
            yield from draw_mixture(self.offsets, self.probs, count, self.generator).tolist()
