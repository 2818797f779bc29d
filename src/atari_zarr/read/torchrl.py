"""TorchRL drop-in: :class:`AtariZarrExperienceReplay` and :class:`AtariZarrStorage`.

``AtariZarrExperienceReplay`` takes the arguments of TorchRL's
``AtariDQNExperienceReplay`` with the same meaning, reading converted stores
(``{root}/{Game}/{run}.zarr``, local or any fsspec URL) instead of downloading and
memory-mapping the original files. ``AtariZarrStorage`` is the read-only TorchRL
``Storage`` underneath; any TorchRL replay buffer can use it.

This module needs the ``torchrl`` extra (``pip install 'atari-zarr[torchrl]'``);
``import atari_zarr`` never imports it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from atari_zarr.errors import (
    InvalidArgumentError,
    ReadOnlyDatasetError,
    StoreFormatError,
    import_optional,
)
from atari_zarr.read.dataset import AtariZarrDataset, collate_batch
from atari_zarr.read.indexing import normalize_index
from atari_zarr.storage.catalog import complete_stores, name_to_url

# MissingDependencyError naming the extra when TorchRL is not installed
import_optional("torchrl", extra="torchrl", purpose="atari_zarr.torchrl")

from torchrl.data.datasets.common import BaseDatasetExperienceReplay  # noqa: E402
from torchrl.data.replay_buffers.samplers import (  # noqa: E402
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.storages import Storage  # noqa: E402
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter  # noqa: E402

__all__ = ["AtariZarrExperienceReplay", "AtariZarrStorage"]

log = logging.getLogger("atari_zarr")

# the key the replay buffer writes the sampled storage indices to
_INDEX = "index"


class AtariZarrStorage(Storage):
    """A read-only TorchRL ``Storage`` over one atari_zarr store.

    ``storage[index]`` returns the TED :class:`~tensordict.TensorDict` of
    :class:`~atari_zarr.AtariZarrDataset` for ints, 1-d tensors, lists, ranges and
    slices (the replay buffer adds ``index`` itself). Pickles as (URL, storage
    options), so ``spawn``/``fork`` workers re-open the store. A replay buffer built
    on it needs ``collate_fn=collate_batch`` (TorchRL only knows the collate of its
    own storages; batches come out of this one already collated).

    Parameters
    ----------
    dataset : AtariZarrDataset or str
        An open dataset, or a store path/URL.
    storage_options : dict, optional
        fsspec options when ``dataset`` is a URL.
    frame_stack : int
        Frames per observation when ``dataset`` is a URL.

    Examples
    --------
    >>> from torchrl.data import TensorDictReplayBuffer
    >>> from atari_zarr.read.dataset import collate_batch
    >>> # store_url: a store made by `atari-zarr convert` (here a small Pong/1 fixture run)
    >>> rb = TensorDictReplayBuffer(
    ...     storage=AtariZarrStorage(store_url), batch_size=8, collate_fn=collate_batch)
    >>> rb.sample()["observation"].shape
    torch.Size([8, 84, 84])
    """

    def __init__(
        self,
        dataset: AtariZarrDataset | str,
        *,
        storage_options: dict[str, Any] | None = None,
        frame_stack: int = 1,
    ) -> None:
        if not isinstance(dataset, AtariZarrDataset):
            dataset = AtariZarrDataset(
                str(dataset), storage_options=storage_options, frame_stack=frame_stack
            )
        self.dataset = dataset
        # one-entry cache: SliceSampler reads storage[index] for the done flags, then the
        # buffer reads the very same index; the second read reuses the first.
        self._last: tuple[np.ndarray, TensorDictBase] | None = None
        super().__init__(max_size=len(dataset))

    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row: the trajectories of TorchRL's slice samplers."""
        return self.dataset.episodes

    def __len__(self) -> int:
        return len(self.dataset)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset!r})"

    def get(self, index: Any) -> TensorDictBase:
        rows, scalar = normalize_index(index, len(self), self.dataset.where)
        last = self._last
        if last is not None and np.array_equal(last[0], rows):
            self._last = None
            td = last[1]
        else:
            td = self.dataset[rows].exclude(_INDEX)
            self._last = (rows, td)
            # the first reader gets a shallow copy: keys it adds do not leak to the second
            td = td.copy()
        return td[0] if scalar else td

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise ReadOnlyDatasetError(
            f"{self.dataset.url} is a read-only dataset: it cannot be written to. "
            f"Copy samples into a regular TorchRL storage (e.g. LazyTensorStorage) to edit them."
        )

    def _empty(self) -> None:
        raise ReadOnlyDatasetError(
            f"{self.dataset.url} is a read-only dataset: it cannot be emptied"
        )

    def state_dict(self) -> dict[str, Any]:
        # the data live in the store; nothing mutable to save
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_last"] = None
        return state


class AtariZarrExperienceReplay(BaseDatasetExperienceReplay):
    """TorchRL's ``AtariDQNExperienceReplay``, reading converted atari_zarr stores.

    Change the import and point ``root`` at the output of ``atari-zarr convert``;
    the other arguments keep their meaning. Samples are TED tensordicts
    (see :class:`~atari_zarr.AtariZarrDataset`): ``observation`` ``[B, 84, 84]``
    uint8, ``action`` ``[B]`` int64, flags ``[B, 1]`` bool, ``("next", "reward")``
    ``[B, 1]`` float32, plus ``index`` and ``episode``.

    Parameters
    ----------
    dataset_id : str
        ``"Game/run"``, e.g. ``"Pong/5"``: the store ``{root}/{Game}/{run}.zarr``.
        Must be in :attr:`available_datasets`.
    batch_size : int, optional
        Batch size of :meth:`sample` and iteration.
    root : str or Path
        Local directory or fsspec URL holding ``{Game}/{run}.zarr`` stores.
    storage_options : dict, optional
        fsspec options for a URL root, e.g. ``{"token": "anon"}``.
    sampler, writer : optional
        TorchRL sampler (overrides ``num_slices``/``slice_len``/``replacement``) and
        writer (default ``ImmutableDatasetWriter``).
    transform : Transform, optional
        Applied by :meth:`sample` (e.g. ``CatFrames`` over slices).
    num_slices, slice_len : int, optional
        Sample slices of episodes with TorchRL's ``SliceSampler``; slices never cross
        an episode (the sampler gets :attr:`episodes` as trajectories).
    strict_len : bool
        If False, episodes shorter than a slice may appear (shorter slices). TorchRL's
        spelling ``strict_length`` is accepted too.
    replacement : bool
        If False, ``SliceSamplerWithoutReplacement`` (with slices) or
        ``SamplerWithoutReplacement``: every transition once per epoch.
    frame_stack : int
        Frames per observation, stacked by the reader (``[B, k, 84, 84]``); an
        alternative to TorchRL's ``CatFrames``.
    download, num_procs, mp_start_method :
        Accepted for compatibility; they have no effect (stores are made with
        ``atari-zarr convert``).
    **kwargs :
        Passed to TorchRL's ``TensorDictReplayBuffer`` (``prefetch``,
        ``pin_memory``, ``collate_fn``, ...).

    Attributes
    ----------
    available_datasets : list of str
        The ``"Game/run"`` stores under ``root``.
    episodes : torch.Tensor
        Episode id of every row (for ``SliceSampler``).

    Examples
    --------
    >>> # dest_root: where `atari-zarr convert` wrote stores (here a small Pong/1 fixture run)
    >>> dataset = AtariZarrExperienceReplay("Pong/1", batch_size=32, root=dest_root, slice_len=8)
    >>> dataset.available_datasets
    ['Pong/1']
    >>> data = dataset.sample()
    >>> data["observation"].shape, data["next", "reward"].shape
    (torch.Size([32, 84, 84]), torch.Size([32, 1]))
    >>> bool((data["episode"].view(4, 8) == data["episode"].view(4, 8)[:, :1]).all())
    True
    """

    #: accepted for compatibility with TorchRL's debugging knob; unused
    _max_runs: int | None = None

    def __init__(
        self,
        dataset_id: str,
        batch_size: int | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        download: bool | str = True,
        sampler: Any = None,
        writer: Any = None,
        transform: Any = None,
        num_procs: int = 0,
        num_slices: int | None = None,
        slice_len: int | None = None,
        strict_len: bool = True,
        replacement: bool = True,
        mp_start_method: str = "fork",
        frame_stack: int = 1,
        **kwargs: Any,
    ) -> None:
        if "strict_length" in kwargs:
            strict_len = bool(kwargs.pop("strict_length"))
        if root is None:
            raise InvalidArgumentError(
                f"AtariZarrExperienceReplay({dataset_id!r}) needs root=: the directory or URL "
                f"that `atari-zarr convert` wrote ({{root}}/{{Game}}/{{run}}.zarr); "
                f"nothing is downloaded"
            )
        self.storage_options = dict(storage_options or {})
        self.root = root
        self.dataset_id = str(dataset_id)
        available = self.available_datasets
        if self.dataset_id not in available:
            raise StoreFormatError(
                f"{self.dataset_id!r} is not a store under {self.root}: expected "
                f"{self.data_path}. Available: {available or 'none'}. "
                f"Convert it with `atari-zarr convert SOURCE {self.root}`."
            )
        storage = AtariZarrStorage(
            self.data_path, storage_options=self.storage_options, frame_stack=frame_stack
        )
        if writer is None:
            writer = ImmutableDatasetWriter()
        if sampler is None:
            if num_slices is not None or slice_len is not None:
                # as TorchRL's Atari dataset: the episode ids delimit trajectories
                if not replacement:
                    sampler = SliceSamplerWithoutReplacement(
                        num_slices=num_slices,
                        slice_len=slice_len,
                        trajectories=storage.episodes,
                        strict_length=strict_len,
                    )
                else:
                    sampler = SliceSampler(
                        num_slices=num_slices,
                        slice_len=slice_len,
                        trajectories=storage.episodes,
                        cache_values=True,
                        strict_length=strict_len,
                    )
            elif not replacement:
                sampler = SamplerWithoutReplacement()
        # batches come out of the storage already collated; a module-level function pickles
        kwargs.setdefault("collate_fn", collate_batch)
        super().__init__(
            storage=storage,
            batch_size=batch_size,
            writer=writer,
            sampler=sampler,
            transform=transform,
            **kwargs,
        )

    # -- TorchRL dataset API --------------------------------------------------------
    @property
    def root(self) -> str:
        return self._root

    @root.setter
    def root(self, value: str | os.PathLike[str]) -> None:
        # a URL must stay a string (Path would turn gs://b into gs:/b)
        self._root = os.fspath(value) if isinstance(value, Path) else str(value)

    @property
    def available_datasets(self) -> list[str]:
        """The ``"Game/run"`` complete stores under :attr:`root` (unfinished ones left out)."""
        return complete_stores(self.root, self.storage_options)

    @staticmethod
    def list_datasets(root: str, storage_options: dict[str, Any] | None = None) -> list[str]:
        """The ``"Game/run"`` complete stores under ``root`` (without opening one)."""
        return complete_stores(str(root), storage_options)

    @property
    def data_path(self) -> str:
        """The store of this dataset: ``{root}/{Game}/{run}.zarr``."""
        return name_to_url(self.root, self.dataset_id)

    @property
    def data_path_root(self) -> str:
        return self.root

    @property
    def dataset_path(self) -> str:
        return self.data_path

    def _is_downloaded(self) -> bool:
        return True

    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row."""
        return self._storage.episodes

    @property
    def dataset(self) -> AtariZarrDataset:
        """The underlying :class:`~atari_zarr.AtariZarrDataset`."""
        return self._storage.dataset

    def delete(self) -> None:
        raise ReadOnlyDatasetError(
            f"{self.data_path} is not deleted by the replay buffer; remove the store yourself"
        )

    def preprocess(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "AtariZarrExperienceReplay.preprocess is not supported: frames are read lazily "
            "from the store; use a transform (e.g. CatFrames) or frame_stack= instead"
        )
