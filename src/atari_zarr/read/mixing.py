"""Several stores as one dataset: :class:`MultiGameDataset`.

Plain PyTorch, no TorchRL: every item carries a ``game_id`` (position of its game in
:attr:`MultiGameDataset.game_names`, the sorted names of its games), and
:meth:`MultiGameDataset.sampler` draws games with given weights whatever their sizes:
a :class:`~atari_zarr.read.mixture.MixtureSampler` picks a store by its weight, then a
uniform row of it, so its memory grows with the number of stores, never with the
number of transitions. Reading, sampling, the stream and pickling are
:class:`~atari_zarr.read.core.ItemDataset`'s; this module opens the stores (one by
one, or every store under a root).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from atari_zarr.catalog import check_names, check_root, complete_store_entries, name_to_url
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.core import ItemDataset
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.read.items import Items
from atari_zarr.read.member import Member, members, open_all
from atari_zarr.read.mixture import (
    MixtureSampler,
    draw_mixture,
    game_numbers,
    store_probabilities,
    store_weights,
)
from atari_zarr.read.options import ReadOptions
from atari_zarr.read.store import StoreReader
from atari_zarr.storage.paths import is_url, redact

__all__ = [
    "MixtureSampler",
    "MultiGameDataset",
    "draw_mixture",
    "store_probabilities",
]

log = logging.getLogger("atari_zarr")


class MultiGameDataset(ItemDataset):
    """Several stores as one map-style dataset; items carry a ``game_id``.

    Item ``i`` is row ``i - offset[g]`` of store ``g``. Items are the TED
    :class:`~tensordict.TensorDict` of :class:`AtariZarrDataset` plus ``game_id``
    ``[B]`` int64, the position of the item's game in :attr:`game_names` (the sorted
    game names, so the same in every process and session; runs of one game share it;
    ``index`` is the position in this dataset; the store's own row is under ``row``).
    Batches are read with one frame fetch per store (``__getitems__``), so
    ``DataLoader(..., collate_fn=collate_batch)`` works with ``fork`` and ``spawn``
    workers.

    Parameters
    ----------
    datasets : sequence of AtariZarrDataset, str or StoreReader
        The stores (datasets, store paths/URLs, or stores known by their catalog
        entries, opened when first read).
    weights : sequence of float, dict, "games" or "transitions", optional
        How :meth:`sample` and :meth:`sampler` draw the stores (and the order in
        which :meth:`stream` takes their units): one relative weight per store; a dict
        of each game's weight (``{"Pong": 2.0, "Breakout": 1.0}``, a game's stores
        then drawn by their length) or of each store (``{"Pong/1": 2.0, ...}``);
        ``"games"``, every game alike; ``"transitions"`` (the default), every
        transition alike.
    storage_options : dict, optional
        For stores given as URLs.
    frame_stack : int
        Frames per observation, for stores given as URLs.
    full_action_space : bool
        For stores given as URLs: actions as ALE's 18 actions (stores converted with
        ``--full-action-space``), one action space for every game.
    options : ReadOptions, optional
        How stores given as URLs are read.

    Examples
    --------
    >>> from atari_zarr.read.dataset import collate_batch
    >>> # store_url: a converted Pong/1 fixture store; any stores mix the same way
    >>> # (MultiGameDataset.from_root opens every store under a root)
    >>> mix = MultiGameDataset([store_url, store_url], weights=[0.25, 0.75])
    >>> mix.games, mix.game_names
    (['Pong/1', 'Pong/1'], ['Pong'])
    >>> batch = mix.sample(64, generator=torch.Generator().manual_seed(0))
    >>> sorted(set(batch["game_id"].tolist())), batch["index"].max().item() >= len(mix) // 2
    ([0], True)
    >>> loader = torch.utils.data.DataLoader(
    ...     mix, batch_size=16, sampler=mix.sampler(32), collate_fn=collate_batch)
    >>> next(iter(loader))["observation"].shape
    torch.Size([16, 84, 84])
    """

    def __init__(
        self,
        datasets: Sequence[AtariZarrDataset | str | StoreReader],
        *,
        weights: Any = None,
        storage_options: dict[str, Any] | None = None,
        frame_stack: int = 1,
        full_action_space: bool = False,
        options: ReadOptions | None = None,
    ) -> None:
        if len(datasets) == 0:
            raise InvalidArgumentError("MultiGameDataset needs at least one store; got none")
        # the stores share the dataset's memory share
        shared = ReadOptions.of(options, "MultiGameDataset").divided(len(datasets))

        def open_one(d: AtariZarrDataset | str | StoreReader) -> StoreReader:
            if isinstance(d, AtariZarrDataset):
                return d.members[0].store
            if isinstance(d, StoreReader):  # one known by its catalog entry: not opened
                return d
            return StoreReader(
                d,
                storage_options=storage_options,
                full_action_space=full_action_space,
                options=shared,
            )

        remote = any(isinstance(d, str) and is_url(d) for d in datasets)
        stores = [s for s, _ in open_all(list(datasets), open_one, remote=remote)]
        stacks = {
            d.frame_stack if isinstance(d, AtariZarrDataset) else frame_stack for d in datasets
        }
        if len(stacks) > 1:
            raise InvalidArgumentError(
                f"the stores have different frame_stack values {sorted(stacks)}; "
                f"batches need one observation shape: open them with the same frame_stack"
            )
        #: Each store as ``Game/run`` (its URL where the store does not say).
        self.games = [f"{s.game}/{s.run}" if s.game is not None else s.url for s in stores]
        game_of = [s.game if s.game is not None else s.url for s in stores]
        #: The games, sorted: ``game_id`` is a position in this list.
        self.game_names, self._ids = game_numbers(game_of)
        self._game_of = game_of
        self._weights_asked = weights
        where = f"MultiGameDataset of {len(stores)} stores"
        mixed, weighted = self._members(stores, [Items.transitions(len(s)) for s in stores], where)
        super().__init__(mixed, frame_stack=stacks.pop(), weighted=weighted, where=where)

    def _members(
        self, stores: list[StoreReader], items: list[Items], where: str
    ) -> tuple[list[Member], bool]:
        """The stores with ``items``, weighted as asked (weights by game or ``"games"``
        count each store's items), and whether weights were asked."""
        lengths = [len(i) for i in items]
        weights = store_weights(self._weights_asked, self.games, self._game_of, lengths, where)
        mixed = members(stores, items, weights=weights, game_ids=self._ids, names=self.games)
        return mixed, weights is not None

    _rebuilt = (*ItemDataset._rebuilt, "_datasets")  # made again from the stores

    @property
    def datasets(self) -> list[AtariZarrDataset]:
        """Each store as an :class:`AtariZarrDataset` (the same stores)."""
        views = self.__dict__.get("_datasets")
        if views is None:
            views = [AtariZarrDataset._over(m.store, self.frame_stack) for m in self.members]
            self._datasets = views
        return views  # type: ignore[no-any-return]

    @classmethod
    def from_root(
        cls,
        root: str,
        names: Sequence[str] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        weights: Any = None,
        frame_stack: int = 1,
        full_action_space: bool = False,
        options: ReadOptions | None = None,
    ) -> MultiGameDataset:
        """Open ``{root}/{Game}/{run}.zarr`` for each ``"Game/run"`` in ``names``.

        The default is every complete store under ``root``
        (:func:`~atari_zarr.catalog.complete_stores`): unfinished
        conversions are left out. With a ``catalog.json`` at ``root`` the dataset
        opens with that one request: the stores' games and lengths are their
        entries', and each store is opened when a batch or a stream first needs it
        (:meth:`StoreReader.open <atari_zarr.read.store.StoreReader.open>`). A store
        that changed since the catalog was written is read as it is now, with a warning; one that is
        gone, or whose length changed, stops that read with an error. Either way
        the message says to run ``atari-zarr index ROOT`` again.
        """
        if names is not None and (isinstance(names, str) or not isinstance(names, Sequence)):
            fix = f"names=[{names!r}] for one store" if isinstance(names, str) else "a list"
            raise InvalidArgumentError(
                f"names={names!r}: expected a list of 'Game/run' names of stores under "
                f"{redact(str(root))}, or None for every complete store. Pass {fix}."
            )
        available, entries = complete_store_entries(root, storage_options, names=names)
        if not available:  # a store, a game directory, a file: the root to pass instead
            check_root(root, storage_options)
        names = list(available if names is None else names)
        check_names(root, names, available, storage_options)
        shared = ReadOptions.of(options, "MultiGameDataset").divided(len(names))
        args: dict[str, Any] = {
            "storage_options": storage_options,
            "full_action_space": full_action_space,
        }
        known = {n: e for n, e in (entries or {}).items() if isinstance(e["transitions"], int)}
        stores = [
            StoreReader(name_to_url(root, n), entry=known[n], options=shared, **args)
            if n in known
            else name_to_url(root, n)
            for n in names
        ]
        return cls(stores, weights=weights, frame_stack=frame_stack, options=options, **args)

    def __repr__(self) -> str:
        return f"MultiGameDataset(games={self.games}, transitions={len(self)})"

    def sampler(
        self, num_samples: int, *, generator: torch.Generator | None = None
    ) -> MixtureSampler:
        """A ``DataLoader`` sampler drawing ``num_samples`` items with the store weights.

        Each item's store is drawn by weight, then a uniform item of it: memory grows
        with the number of stores, not of transitions. With the same ``generator``
        seed it yields the indices :meth:`sample` reads.
        """
        return MixtureSampler(np.diff(self.offsets), self.weights, num_samples, generator=generator)

    def windows(self, length: int, *, pad: bool = False) -> MultiGameDataset:
        """Windows of ``length`` steps of every store, mixed as this dataset mixes transitions.

        Items are the ``[K]`` windows of :meth:`AtariZarrDataset.windows
        <atari_zarr.AtariZarrDataset.windows>` of every store, store after store, with
        ``game_id``, ``row`` and the global ``index``; stores are drawn with the same
        weights (default: proportional to their windows). With ``full_action_space``,
        one action space for every game (Multi-Game Decision Transformer).

        Examples
        --------
        >>> mix = MultiGameDataset([store_url, store_url]).windows(4)
        >>> batch = mix.sample(6, generator=torch.Generator().manual_seed(0))
        >>> batch.batch_size, batch["game_id"].shape
        (torch.Size([6, 4]), torch.Size([6, 4]))
        """
        stores = self._opened(range(len(self.members)))
        items = [Items.windows(s.episodes, length, pad=pad, where=s.where) for s in stores]
        out = copy.copy(self)
        out._set_members(self._members(stores, items, self.where)[0])
        out._view_of(self)
        return out
