"""Several stores as one dataset: :class:`MultiGameDataset`, and listing a root.

Plain PyTorch, no TorchRL: every item carries a ``game_id`` (position of its store
in :attr:`MultiGameDataset.games`), and :meth:`MultiGameDataset.sampler` draws games
with given weights whatever their sizes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.errors import InvalidArgumentError, StoreFormatError
from atari_zarr.layout import store_path
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.storage.remote import get_fs

__all__ = ["MultiGameDataset", "list_stores", "name_to_url"]

log = logging.getLogger("atari_zarr")

_RUN_SUFFIX = ".zarr"


def _natural(name: str) -> tuple[Any, ...]:
    # "Pong/10" after "Pong/2"
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def list_stores(root: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """The ``"Game/run"`` names of the stores under ``root`` (``{root}/{Game}/{run}.zarr``).

    Parameters
    ----------
    root : str
        Local directory or fsspec URL that ``atari-zarr convert`` wrote to.
    storage_options : dict, optional
        fsspec options for URLs.

    Returns
    -------
    list of str
        Sorted by game, then run number.

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr import convert
    >>> from atari_zarr.testing import write_fixture_run
    >>> src, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = write_fixture_run(src, "Pong", "2", capacity=64, steps=100)
    >>> _ = convert(src, dest, progress=False)
    >>> list_stores(dest)
    ['Pong/2']
    """
    fs, path = get_fs(root, storage_options)
    path = path.rstrip("/")
    if not fs.isdir(path):
        raise FileNotFoundError(
            f"{root} does not exist or is not a directory: expected the destination of "
            f"`atari-zarr convert`, holding {{Game}}/{{run}}.zarr stores"
        )
    found = []
    # a store is a directory {Game}/{run}.zarr with a zarr.json at its top
    for meta in fs.glob(f"{path}/*/*{_RUN_SUFFIX}/zarr.json"):
        parts = meta.rstrip("/").split("/")
        game, run = parts[-3], parts[-2][: -len(_RUN_SUFFIX)]
        found.append(f"{game}/{run}")
    return sorted(found, key=_natural)


def name_to_url(root: str, name: str) -> str:
    """Where the store of ``"Game/run"`` lives under ``root``.

    Examples
    --------
    >>> name_to_url("gs://bucket/atari", "Pong/5")
    'gs://bucket/atari/Pong/5.zarr'
    """
    game, _, run = str(name).partition("/")
    return store_path(str(root), game, run)


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

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr import convert
    >>> from atari_zarr.read.dataset import collate_batch
    >>> from atari_zarr.testing import write_fixture_run
    >>> src, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> for game in ("Pong", "Breakout"):
    ...     _ = write_fixture_run(src, game, "1", capacity=64, steps=150)
    >>> stores = convert(src, dest, progress=False)
    >>> mix = MultiGameDataset.from_root(dest, ["Pong/1", "Breakout/1"], weights=[0.5, 0.5])
    >>> mix.games
    ['Pong/1', 'Breakout/1']
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
    ) -> None:
        if len(datasets) == 0:
            raise InvalidArgumentError("MultiGameDataset needs at least one store; got none")
        self.datasets = [
            d
            if isinstance(d, AtariZarrDataset)
            else AtariZarrDataset(d, storage_options=storage_options, frame_stack=frame_stack)
            for d in datasets
        ]
        stacks = {d.frame_stack for d in self.datasets}
        if len(stacks) > 1:
            raise InvalidArgumentError(
                f"the stores have different frame_stack values {sorted(stacks)}; "
                f"batches need one observation shape: open them with the same frame_stack"
            )
        self.games = [f"{d.game}/{d.run}" if d.game is not None else d.url for d in self.datasets]
        lengths = np.array([len(d) for d in self.datasets], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        if weights is None:
            w = lengths.astype(np.float64)
        else:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (len(self.datasets),) or not np.all(np.isfinite(w)) or (w < 0).any():
                raise InvalidArgumentError(
                    f"weights must be {len(self.datasets)} non-negative numbers, one per store "
                    f"({self.games}); got {list(weights)}"
                )
        w = np.where(lengths > 0, w, 0.0)
        if w.sum() <= 0:
            raise InvalidArgumentError(
                f"no store can be drawn: every store is empty or has weight 0 ({self.games})"
            )
        self.weights = w / w.sum()

    @classmethod
    def from_root(
        cls,
        root: str,
        names: Sequence[str] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        weights: Sequence[float] | None = None,
        frame_stack: int = 1,
    ) -> MultiGameDataset:
        """Open ``{root}/{Game}/{run}.zarr`` for each ``"Game/run"`` in ``names`` (default: all)."""
        available = list_stores(root, storage_options)
        names = list(available if names is None else names)
        missing = [n for n in names if n not in available]
        if missing:
            raise StoreFormatError(
                f"{root} holds no store for {missing}: expected {{root}}/{{Game}}/{{run}}.zarr; "
                f"available: {available}. Convert them with `atari-zarr convert`."
            )
        urls = [name_to_url(root, n) for n in names]
        return cls(urls, weights=weights, storage_options=storage_options, frame_stack=frame_stack)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"MultiGameDataset(games={self.games}, transitions={len(self)})"

    def locate(self, idx: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(game_id, row)`` of each global index."""
        if isinstance(idx, torch.Tensor):
            idx = idx.detach().cpu().numpy()
        arr = np.atleast_1d(np.asarray(idx)).astype(np.int64).ravel()
        n = len(self)
        bad = (arr < -n) | (arr >= n)
        if bad.any():
            raise IndexError(f"index {int(arr[bad][0])} is out of range for {n} transitions")
        arr = np.where(arr < 0, arr + n, arr)
        game = np.searchsorted(self.offsets, arr, side="right") - 1
        return game, arr - self.offsets[game]

    def __getitem__(self, idx: Any) -> TensorDict:
        scalar = isinstance(idx, (int, np.integer)) or (
            isinstance(idx, (np.ndarray, torch.Tensor)) and idx.ndim == 0
        )
        if isinstance(idx, slice):
            idx = np.arange(*idx.indices(len(self)))
        game, row = self.locate(idx)
        parts, where = [], []
        for g in np.unique(game):
            sel = np.flatnonzero(game == g)
            td = self.datasets[g][row[sel]]
            td["row"] = td["index"]
            td["index"] = torch.from_numpy(self.offsets[g] + row[sel])
            td["game_id"] = torch.full((len(sel),), int(g), dtype=torch.int64)
            parts.append(td)
            where.append(sel)
        if not parts:
            out = self.datasets[0][np.zeros(0, dtype=np.int64)]
            out["row"] = out["index"]
            out["game_id"] = torch.zeros(0, dtype=torch.int64)
            return out
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        order = np.argsort(np.concatenate(where), kind="stable")
        if len(parts) > 1:
            out = out[torch.from_numpy(order)]
        return out[0] if scalar else out

    def __getitems__(self, indices: list[int]) -> TensorDict:
        """A batch at once (``DataLoader`` automatic batching; use ``collate_batch``)."""
        return self[np.asarray(indices, dtype=np.int64)]

    def item_weights(self) -> torch.Tensor:
        """Per-item probability that realises the store weights (sums to 1)."""
        lengths = np.diff(self.offsets)
        per_item = np.divide(
            self.weights, lengths, out=np.zeros_like(self.weights), where=lengths > 0
        )
        return torch.from_numpy(np.repeat(per_item, lengths))

    def sampler(
        self, num_samples: int, *, generator: torch.Generator | None = None
    ) -> torch.utils.data.WeightedRandomSampler:
        """A ``DataLoader`` sampler drawing ``num_samples`` items with the store weights."""
        return torch.utils.data.WeightedRandomSampler(
            self.item_weights(), num_samples, replacement=True, generator=generator
        )

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> TensorDict:
        """A batch: each item's store drawn with the weights, then a uniform row of it."""
        probs = torch.from_numpy(self.weights)
        game = torch.multinomial(probs, int(batch_size), replacement=True, generator=generator)
        lengths = torch.from_numpy(np.diff(self.offsets))
        u = torch.rand(int(batch_size), generator=generator, dtype=torch.float64)
        row = (u * lengths[game]).long().clamp_max(lengths[game] - 1)
        return self[torch.from_numpy(self.offsets)[game] + row]
