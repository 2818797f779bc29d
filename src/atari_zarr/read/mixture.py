"""Several stores as one: their weights, the two-stage draw, and the tags of their items.

Every reader of several stores (random access and sampling of
:class:`~atari_zarr.read.core.ItemDataset`, the epoch stream) mixes them with the
functions here, so a store's weight and an item's ``game_id``, ``row`` and global
``index`` are worked out in one place:

* :func:`store_probabilities`: the probability of drawing each store;
* :func:`draw_mixture` and :class:`MixtureSampler`: a store drawn by weight, then a
  uniform item of it; memory grows with the number of stores, never with the
  number of items;
* :func:`tag_store`: a batch read from store ``g`` as the mixture shows it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError

__all__ = ["MixtureSampler", "draw_mixture", "store_probabilities", "tag_store"]


def tag_store(td: TensorDict, g: int, row_offset: int) -> TensorDict:
    """``td`` read from store ``g`` as a mixture gives it: its rows under ``row``, the
    global ``index`` (``row_offset`` added; padding keeps -1) and ``game_id``.

    Examples
    --------
    >>> td = TensorDict({"index": torch.tensor([3, -1])}, batch_size=[2])
    >>> out = tag_store(td, 1, 100)
    >>> out["index"].tolist(), out["row"].tolist(), out["game_id"].tolist()
    ([103, -1], [3, -1], [1, 1])
    """
    idx = td["index"]
    td["row"] = idx
    td["index"] = torch.where(idx >= 0, idx + int(row_offset), idx)
    td["game_id"] = torch.full(td.batch_size, int(g), dtype=torch.int64)
    return td


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
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    labels = list(names) if names is not None else [f"store {i}" for i in range(sizes.size)]
    if sizes.ndim != 1 or (sizes < 0).any():
        raise InvalidArgumentError(
            f"lengths must be one non-negative number of transitions per store; "
            f"got {sizes.tolist()}"
        )
    if weights is None:
        w = sizes.astype(np.float64)
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != sizes.shape or not np.all(np.isfinite(w)) or (w < 0).any():
            raise InvalidArgumentError(
                f"weights must be {sizes.size} non-negative numbers, one per store "
                f"({labels}); got {list(weights)}"
            )
    w = np.where(sizes > 0, w, 0.0)
    if w.sum() <= 0:
        raise InvalidArgumentError(
            f"no store can be drawn: every store is empty or has weight 0 ({labels})"
        )
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
    store = torch.multinomial(
        torch.as_tensor(np.asarray(probs, dtype=np.float64)),
        count,
        replacement=True,
        generator=generator,
    )
    rows = torch.empty(count, dtype=torch.int64)
    # an exact uniform row per item, one torch.randint per store drawn (it takes one
    # bound), stores in index order so that a seed always gives the same indices
    for g in torch.unique(store).tolist():
        sel = store == g
        length = int(offsets_t[g + 1] - offsets_t[g])
        rows[sel] = torch.randint(0, length, (int(sel.sum()),), generator=generator)
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
