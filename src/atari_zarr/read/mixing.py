"""Several stores as one dataset: :class:`MultiGameDataset`.

Plain PyTorch, no TorchRL: every item carries a ``game_id`` (position of its store
in :attr:`MultiGameDataset.games`), and :meth:`MultiGameDataset.sampler` draws games
with given weights whatever their sizes: a :class:`MixtureSampler` picks a store by
its weight, then a uniform row of it, so its memory grows with the number of
stores, never with the number of transitions.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.errors import (
    InvalidArgumentError,
    StoreFormatError,
    StoreIncompleteError,
    StoreNotFoundError,
)
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.read.draw import check_batch_size, check_prefetch, draw_ahead
from atari_zarr.read.indexing import normalize_index
from atari_zarr.read.items import Items
from atari_zarr.read.windows import WindowDataset
from atari_zarr.storage.catalog import (
    CATALOG,
    check_entry,
    complete_store_entries,
    name_to_url,
    store_state,
)
from atari_zarr.storage.paths import redact

if TYPE_CHECKING:
    from atari_zarr.read.stream import EpochStream

__all__ = ["MixtureSampler", "MultiGameDataset", "draw_mixture", "store_probabilities"]

log = logging.getLogger("atari_zarr")


class MultiGameDataset(torch.utils.data.Dataset):
    """Several stores as one map-style dataset; items carry a ``game_id``.

    Item ``i`` is row ``i - offset[g]`` of store ``g``. Items are the TED
    :class:`~tensordict.TensorDict` of :class:`AtariZarrDataset` plus ``game_id``
    ``[B]`` int64 (``index`` is the position in this dataset; the store's own row is
    under ``row``). Batches are read with one frame fetch per store
    (``__getitems__``), so ``DataLoader(..., collate_fn=collate_batch)`` works with
    ``fork`` and ``spawn`` workers.

    Parameters
    ----------
    datasets : sequence of AtariZarrDataset or str
        The stores (datasets, or store paths/URLs).
    weights : sequence of float, optional
        Relative probability of drawing each store in :meth:`sample` and
        :meth:`sampler`, whatever its length. Default: proportional to length
        (uniform over all transitions).
    storage_options : dict, optional
        For stores given as URLs.
    frame_stack : int
        Frames per observation, for stores given as URLs.
    full_action_space : bool
        For stores given as URLs: actions as ALE's 18 actions (stores converted with
        ``--full-action-space``), one action space for every game.

    Examples
    --------
    >>> from atari_zarr.read.dataset import collate_batch
    >>> # store_url: a converted Pong/1 fixture store; any stores mix the same way
    >>> # (MultiGameDataset.from_root opens every store under a root)
    >>> mix = MultiGameDataset([store_url, store_url], weights=[0.25, 0.75])
    >>> mix.games
    ['Pong/1', 'Pong/1']
    >>> batch = mix.sample(64, generator=torch.Generator().manual_seed(0))
    >>> sorted(set(batch["game_id"].tolist()))
    [0, 1]
    >>> loader = torch.utils.data.DataLoader(
    ...     mix, batch_size=16, sampler=mix.sampler(32), collate_fn=collate_batch)
    >>> next(iter(loader))["observation"].shape
    torch.Size([16, 84, 84])
    """

    def __init__(
        self,
        datasets: Sequence[AtariZarrDataset | str],
        *,
        weights: Sequence[float] | None = None,
        storage_options: dict[str, Any] | None = None,
        frame_stack: int = 1,
        full_action_space: bool = False,
    ) -> None:
        if len(datasets) == 0:
            raise InvalidArgumentError("MultiGameDataset needs at least one store; got none")
        self.datasets = [
            d
            if isinstance(d, AtariZarrDataset)
            else AtariZarrDataset(
                d,
                storage_options=storage_options,
                frame_stack=frame_stack,
                full_action_space=full_action_space,
            )
            for d in datasets
        ]
        stacks = {d.frame_stack for d in self.datasets}
        if len(stacks) > 1:
            raise InvalidArgumentError(
                f"the stores have different frame_stack values {sorted(stacks)}; "
                f"batches need one observation shape: open them with the same frame_stack"
            )
        self.games = [f"{d.game}/{d.run}" if d.game is not None else d.url for d in self.datasets]
        self._weights_given = None if weights is None else list(weights)
        self._set_parts(list(self.datasets))

    def _set_parts(self, parts: list[Any]) -> None:
        """Items come from ``parts`` (the datasets, or their windows), one per store."""
        self.parts = parts
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        #: Global item number of each store's first item.
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        #: Global index of each store's first row (the ``index`` of items).
        self.row_offsets = np.concatenate([[0], np.cumsum([len(d) for d in self.datasets])]).astype(
            np.int64
        )
        #: Probability of drawing each store (sums to 1; 0 for empty stores).
        self.weights = store_probabilities(lengths, self._weights_given, self.games)

    @classmethod
    def from_root(
        cls,
        root: str,
        names: Sequence[str] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        weights: Sequence[float] | None = None,
        frame_stack: int = 1,
        full_action_space: bool = False,
    ) -> MultiGameDataset:
        """Open ``{root}/{Game}/{run}.zarr`` for each ``"Game/run"`` in ``names``.

        The default is every complete store under ``root``
        (:func:`~atari_zarr.storage.catalog.complete_stores`): unfinished
        conversions are left out. With a ``catalog.json`` at ``root`` the stores are
        found with one request; a store the catalog lists that changed since is read
        as it is now, and one that is gone is left out, each with a warning that
        says to run ``atari-zarr index`` again.
        """
        available, entries = complete_store_entries(root, storage_options)
        opened: dict[str, AtariZarrDataset] = {}
        if entries is not None and names is None:
            for n in list(available):
                try:
                    opened[n] = AtariZarrDataset(
                        name_to_url(root, n),
                        storage_options=storage_options,
                        frame_stack=frame_stack,
                        full_action_space=full_action_space,
                    )
                except (StoreNotFoundError, StoreIncompleteError):
                    warnings.warn(
                        f"{redact(name_to_url(root, n))} is listed in {redact(str(root))}/"
                        f"{CATALOG} but is no longer a complete store; it is left out. Run "
                        f"`atari-zarr index {redact(str(root))}` again to refresh the catalog.",
                        stacklevel=2,
                    )
                    available.remove(n)
        names = list(available if names is None else names)
        missing = [n for n in names if n not in available]
        if missing:
            unfinished = [
                n
                for n in missing
                if store_state(name_to_url(root, n), storage_options) == "incomplete"
            ]
            hint = (
                f" {unfinished} are unfinished: run the command that started each again to "
                f"finish it (`atari-zarr info STORE` shows it)."
                if unfinished
                else ""
            )
            raise StoreFormatError(
                f"{root} holds no store for {missing}: expected complete "
                f"{{root}}/{{Game}}/{{run}}.zarr stores; available: {available}.{hint} "
                f"Convert them with `atari-zarr convert`."
            )
        urls = [opened.get(n) or name_to_url(root, n) for n in names]
        mixed = cls(
            urls,
            weights=weights,
            storage_options=storage_options,
            frame_stack=frame_stack,
            full_action_space=full_action_space,
        )
        if entries is not None:
            for n, ds in zip(names, mixed.datasets, strict=True):
                if n in entries:
                    check_entry(entries[n], ds.metadata, ds.url)
        return mixed

    @property
    def _where(self) -> str:
        """This dataset, in messages."""
        return f"MultiGameDataset of {len(self.datasets)} stores"

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"MultiGameDataset(games={self.games}, transitions={len(self)})"

    def _rows(self, idx: Any) -> tuple[np.ndarray, bool]:
        return normalize_index(idx, len(self), self._where)

    def _split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # side="right" skips empty stores: their offset equals the next store's
        game = np.searchsorted(self.offsets, rows, side="right") - 1
        return game, rows - self.offsets[game]

    def locate(self, idx: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(game_id, row)`` of each global index (any index ``__getitem__`` takes)."""
        return self._split(self._rows(idx)[0])

    def _tag(self, td: TensorDict, g: int) -> TensorDict:
        """``td`` from store ``g``: its rows under ``row``, global ``index``, ``game_id``."""
        idx = td["index"]
        td["row"] = idx
        # padding positions of windows keep their -1
        td["index"] = torch.where(idx >= 0, idx + int(self.row_offsets[g]), idx)
        td["game_id"] = torch.full(td.batch_size, int(g), dtype=torch.int64)
        return td

    def __getitem__(self, idx: Any) -> TensorDict:
        rows, scalar = self._rows(idx)
        game, row = self._split(rows)
        parts, where = [], []
        for g in np.unique(game):
            sel = np.flatnonzero(game == g)
            parts.append(self._tag(self.parts[g][row[sel]], int(g)))
            where.append(sel)
        if not parts:
            return self._tag(self.parts[0][np.zeros(0, dtype=np.int64)], 0)
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        order = np.argsort(np.concatenate(where), kind="stable")
        if len(parts) > 1:
            out = out[torch.from_numpy(order)]
        return out[0] if scalar else out

    def __getitems__(self, indices: list[int]) -> TensorDict:
        """A batch at once (``DataLoader`` automatic batching; use ``collate_batch``)."""
        return self[np.asarray(indices, dtype=np.int64)]

    def sampler(
        self, num_samples: int, *, generator: torch.Generator | None = None
    ) -> MixtureSampler:
        """A ``DataLoader`` sampler drawing ``num_samples`` items with the store weights.

        Each item's store is drawn by weight, then a uniform row of it: memory grows
        with the number of stores, not of transitions. With the same ``generator``
        seed it yields the indices :meth:`sample` reads.
        """
        return MixtureSampler(np.diff(self.offsets), self.weights, num_samples, generator=generator)

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> TensorDict:
        """A batch: each item's store drawn with the weights, then a uniform row of it."""
        size = check_batch_size(batch_size, self._where)
        return self[draw_mixture(self.offsets, self.weights, size, generator)]

    def sample_iter(
        self,
        batch_size: int,
        *,
        batches: int | None = None,
        prefetch: int = 4,
        generator: torch.Generator | None = None,
    ) -> Iterator[TensorDict]:
        """Batches of :meth:`sample`, the next ones fetched ahead from every store.

        The batches (and the generator's state after them) are those of repeated
        ``sample(batch_size, generator=generator)`` calls; see
        :meth:`AtariZarrDataset.sample_iter` for ``batches`` and ``prefetch``.

        Examples
        --------
        >>> mix = MultiGameDataset([store_url, store_url])
        >>> g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
        >>> got = list(mix.sample_iter(8, batches=2, prefetch=2, generator=g1))
        >>> all((a["index"] == mix.sample(8, generator=g2)["index"]).all() for a in got)
        True
        """
        prefetch = check_prefetch(prefetch, self._where)
        size = check_batch_size(batch_size, self._where)

        def fetch_ahead(rows: np.ndarray) -> None:
            game, row = self._split(rows)
            for g in np.unique(game).tolist():
                self.parts[g].fetch_ahead(row[game == g])

        yield from draw_ahead(
            lambda: draw_mixture(self.offsets, self.weights, size, generator).numpy(),
            self.__getitem__,
            fetch_ahead,
            prefetch=prefetch,
            batches=batches,
        )

    def windows(self, length: int, *, pad: bool = False) -> MultiGameDataset:
        """Windows of ``length`` steps of every store, mixed as this dataset mixes transitions.

        Items are the windows of :meth:`AtariZarrDataset.windows
        <atari_zarr.AtariZarrDataset.windows>` (``[K]`` TensorDicts) of every store,
        numbered store after store, with ``game_id``, ``row`` and the global
        ``index`` ``[K]``; :meth:`sample`, :meth:`sampler` and :meth:`stream` draw
        stores with the same weights (default: proportional to their windows). With
        ``full_action_space=True`` (stores converted with ``--full-action-space``), actions
        are ALE's 18 actions, one space for every game (Multi-Game Decision
        Transformer).

        Examples
        --------
        >>> mix = MultiGameDataset([store_url, store_url]).windows(4)
        >>> batch = mix.sample(6, generator=torch.Generator().manual_seed(0))
        >>> batch.batch_size, batch["game_id"].shape
        (torch.Size([6, 4]), torch.Size([6, 4]))
        """
        out = copy.copy(self)
        out._set_parts([d.windows(length, pad=pad) for d in self.datasets])
        return out

    def stream(self, batch_size: int, **kwargs: Any) -> EpochStream:
        """One epoch of every store, interleaved by the weights, as TED batches.

        Every item (transition, or window after :meth:`windows`) of every store once
        per epoch; each batch takes from each store a multinomial share by weight
        (stores that ran out leave the mix), and carries ``game_id``, ``row`` and
        ``index`` as ``self[idx]`` does. Options are those of
        :meth:`AtariZarrDataset.stream <atari_zarr.AtariZarrDataset.stream>`. See
        ``docs/streaming.md``.

        Returns
        -------
        EpochStream
            Iterable of batches and a ``torch.utils.data.IterableDataset`` with
            ``state_dict()``/``load_state_dict()``.

        Examples
        --------
        >>> mix = MultiGameDataset([store_url, store_url])
        >>> batches = list(mix.stream(100, seed=0, unit_rows=64))
        >>> sorted(torch.cat([b["index"] for b in batches]).tolist()) == list(range(len(mix)))
        True
        >>> sorted(set(batches[0]["game_id"].tolist()))
        [0, 1]
        """
        from atari_zarr.read.stream import stream_over

        items = [
            p.items if isinstance(p, WindowDataset) else Items.transitions(len(p))
            for p in self.parts
        ]
        return stream_over(
            [d._store for d in self.datasets],
            items,
            batch_size,
            frame_stack=self.datasets[0].frame_stack,
            weights=self.weights,
            several=True,
            **kwargs,
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
        if isinstance(num_samples, bool) or not isinstance(num_samples, int | np.integer):
            raise InvalidArgumentError(
                f"num_samples must be a non-negative integer; got {num_samples!r}"
            )
        if num_samples < 0:
            raise InvalidArgumentError(f"num_samples must be non-negative; got {num_samples}")
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
