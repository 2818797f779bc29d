"""Windows of ``K`` consecutive steps of one episode, for sequence models: :class:`WindowDataset`.

Decision Transformer and its successors train on windows of consecutive steps with
returns-to-go and timesteps. :meth:`AtariZarrDataset.windows
<atari_zarr.AtariZarrDataset.windows>` gives them as a map-style dataset, read by the
same engine and batch builder as every other reader (:mod:`atari_zarr.read.batch`: a
window's frame stacks are views of its ``K + k`` distinct frames). Which windows exist
is :class:`~atari_zarr.read.items.Items`' rule (never across an episode; ``pad`` for
shorter ones); what an item holds (``index``, ``return_to_go``, ``timestep``,
``fragment``, ``mask``) is the guide's, ``docs/guides/windows.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atari_zarr.read.core import ItemDataset
from atari_zarr.read.indexing import normalize_index
from atari_zarr.read.items import Items
from atari_zarr.read.member import members
from atari_zarr.read.store import StoreReader

__all__ = ["WindowDataset"]


class WindowDataset(ItemDataset):
    """Windows of ``length`` consecutive steps of one episode of a store (see the module).

    Made by :meth:`AtariZarrDataset.windows <atari_zarr.AtariZarrDataset.windows>`.
    A map-style dataset with a batched ``__getitems__`` (``DataLoader(w,
    batch_size=B, collate_fn=collate_batch)`` reads a batch with one frame fetch);
    indexing, ``sample``, ``sample_iter``, ``stream`` (a read unit's windows are those
    that start in it) and pickling are :class:`~atari_zarr.read.core.ItemDataset`'s.

    Parameters
    ----------
    store : StoreReader
        The opened store.
    length : int
        ``K``, steps per window.
    pad : bool
        Also give one padded window per episode shorter than ``K``.
    frame_stack : int
        Frames per observation.

    Raises
    ------
    InvalidArgumentError
        ``length`` below 1, or longer than every episode without ``pad``.

    Examples
    --------
    >>> import torch
    >>> from atari_zarr import AtariZarrDataset
    >>> w = AtariZarrDataset(store_url).windows(5)
    >>> batch = w.sample(4, generator=torch.Generator().manual_seed(0))
    >>> batch.batch_size, batch["timestep"].dtype, bool(batch["mask"].all())
    (torch.Size([4, 5]), torch.int64, True)
    >>> rows = batch["index"]
    >>> bool(((rows[:, 1:] - rows[:, :-1]) == 1).all())  # consecutive rows
    True
    """

    def __init__(
        self, store: StoreReader, length: int, *, pad: bool = False, frame_stack: int = 1
    ) -> None:
        items = Items.windows(store.episodes, length, pad=pad, where=store.where)
        self.length, self.pad = items.length, items.pad
        super().__init__(members([store], [items]), frame_stack=frame_stack)

    def __repr__(self) -> str:
        return (
            f"WindowDataset({self.where!r}, length={self.length}, pad={self.pad}, "
            f"frame_stack={self.frame_stack}, windows={len(self)})"
        )

    @property
    def store(self) -> StoreReader:
        """The opened store."""
        return self.members[0].store

    @property
    def items(self) -> Items:
        """The windows, numbered (:class:`~atari_zarr.read.items.Items`)."""
        return self._items

    def starts(self, idx: Any) -> np.ndarray:
        """First row of each window ``idx``."""
        items, _ = normalize_index(idx, len(self), self.where, unit="windows")
        return self.items.starts(items)
