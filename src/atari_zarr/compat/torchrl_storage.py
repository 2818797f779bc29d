"""TorchRL storages over stores, read lazily: :class:`AtariZarrStorage` and the preprocessed.

Both are TorchRL ``TensorStorage`` objects, so any TorchRL replay buffer takes them
as it takes its own (``ReplayBuffer(storage=...)`` picks its collate function from
the storage's class), but nothing is held in memory: ``storage[index]`` reads the
rows asked for from the store.

* :class:`AtariZarrStorage`: a converted store, as TED transitions
  (:class:`~atari_zarr.AtariZarrDataset`), each batch with TorchRL's ``metadata``
  entry (``{"dataset_id": "Game/run"}``);
* :class:`PreprocessedStorage`: what :func:`~atari_zarr.compat.preprocess.preprocess`
  wrote, a Zarr group with one array per key of the transformed samples.

Both are read-only: writing, emptying or extending raises
:class:`~atari_zarr.errors.ReadOnlyDatasetError` naming the store and what to do.

This module needs the ``torchrl`` extra.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch
import zarr
from tensordict import TensorDict, TensorDictBase

from atari_zarr.errors import (
    ReadOnlyDatasetError,
    StoreFormatError,
    StoreIncompleteError,
    import_optional,
)
from atari_zarr.read.arrays import GroupRows
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.read.indexing import normalize_index
from atari_zarr.storage.paths import redact
from atari_zarr.storage.remote import open_zarr_store

import_optional("torchrl", extra="torchrl", purpose="atari_zarr.compat.torchrl_storage")

from torchrl.data.replay_buffers.storages import TensorStorage  # noqa: E402

__all__ = [
    "METADATA",
    "PREPROCESS_KEY",
    "AtariZarrStorage",
    "PreprocessedStorage",
    "ReadOnlyTensorStorage",
    "refuse",
]

log = logging.getLogger("atari_zarr")

#: The non-tensor entry TorchRL's dataset samples carry.
METADATA = "metadata"
#: The attribute of a preprocessed store (:mod:`atari_zarr.compat.preprocess`).
PREPROCESS_KEY = "atari_zarr_preprocess"
# the key the replay buffer writes the sampled storage indices to
_INDEX = "index"


#: What a store-backed dataset says when asked to change: why, and what to do instead.
_REFUSALS = {
    "set": "is a read-only dataset: it cannot be written to; copy samples into a regular "
    "TorchRL storage (e.g. LazyTensorStorage) to edit them",
    "add": "is a read-only dataset: nothing is added to it; copy samples into a regular "
    "TorchRL ReplayBuffer (e.g. with LazyTensorStorage) to extend them",
    "extend": "is a read-only dataset: it cannot be extended; copy samples into a regular "
    "TorchRL ReplayBuffer (e.g. with LazyTensorStorage) to extend them",
    "empty": "is a read-only dataset: it cannot be emptied; make a new ReplayBuffer for new data",
    "dumps": "lives in its store: dumping a copy of it is not supported; make the dataset "
    "again from the store (and save your sampler's state_dict())",
    "loads": "is read from its store: loading a dump into it is not supported; make the "
    "dataset again from the store",
    "delete": "is a store that other readers may share: the replay buffer does not delete "
    "it; remove it with your file system's or bucket's tools",
}


def refuse(where: str, operation: str) -> ReadOnlyDatasetError:
    """The one-line error of ``operation`` (a key of the table above) on ``where``.

    Examples
    --------
    >>> str(refuse("s.zarr", "add"))[:47]
    's.zarr is a read-only dataset: nothing is added'
    """
    return ReadOnlyDatasetError(f"{where} {_REFUSALS[operation]}")


class ReadOnlyTensorStorage(TensorStorage):
    """A TorchRL ``TensorStorage`` of ``n`` rows read on demand by :meth:`read`.

    Subclasses give :meth:`read` (rows -> TensorDict) and :attr:`where` (for messages).
    """

    where: str = "the dataset"

    def __init__(self, n: int) -> None:
        super().__init__(None, max_size=max(int(n), 1))
        self.max_size = int(n)
        self.initialized = True
        self._len = int(n)

    # -- what samplers and buffers ask of a storage ------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.max_size])

    @property
    def _total_shape(self) -> torch.Size:
        return self.shape

    @property
    def _len_along_dim0(self) -> int:
        return self.max_size

    def _max_size_along_dim0(self, *, single_data: Any = None, batched_data: Any = None) -> int:
        return self.max_size

    @property
    def _is_full(self) -> bool:
        return True

    def __len__(self) -> int:
        return self.max_size

    def read(self, rows: np.ndarray) -> TensorDictBase:  # pragma: no cover - abstract
        raise NotImplementedError

    def get(self, index: Any) -> TensorDictBase:
        rows, scalar = normalize_index(index, len(self), self.where)
        td = self.read(rows)
        return td[0] if scalar else td

    def __getitem__(self, index: Any) -> TensorDictBase:
        return self.get(index)

    # -- read-only ---------------------------------------------------------------------
    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise refuse(self.where, "set")

    def _empty(self) -> None:
        raise refuse(self.where, "empty")

    def dumps(self, path: Any) -> None:
        raise refuse(self.where, "dumps")

    def loads(self, path: Any) -> None:
        raise refuse(self.where, "loads")

    def state_dict(self) -> dict[str, Any]:
        # the data live in the store; nothing mutable to save
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    def contains(self, item: Any) -> Any:
        rows = torch.as_tensor(item)
        return (rows >= -len(self)) & (rows < len(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r}, len={len(self)})"


def _store_name(dataset: AtariZarrDataset) -> str:
    game, run = dataset.game, dataset.run
    return f"{game}/{run}" if game is not None and run is not None else dataset.where


class AtariZarrStorage(ReadOnlyTensorStorage):
    """A read-only TorchRL storage over one atari_zarr store.

    ``storage[index]`` returns the TED :class:`~tensordict.TensorDict` of
    :class:`~atari_zarr.AtariZarrDataset` for ints, 1-d tensors, lists, ranges and
    slices (the replay buffer adds ``index`` itself), with a ``metadata`` non-tensor
    entry as TorchRL's Atari samples have it: ``{"dataset_id": "Game/run"}``. Pickles
    as (URL, storage options), so ``spawn``/``fork`` workers re-open the store.

    Parameters
    ----------
    dataset : AtariZarrDataset or str
        An open dataset, or a store path/URL.
    storage_options : dict, optional
        fsspec options when ``dataset`` is a URL.
    frame_stack : int
        Frames per observation when ``dataset`` is a URL.
    dataset_id : str, optional
        What ``metadata["dataset_id"]`` says (default ``"Game/run"`` of the store).

    Examples
    --------
    >>> from torchrl.data import TensorDictReplayBuffer
    >>> # store_url: a store made by `atari-zarr convert` (here a small Pong/1 fixture run)
    >>> rb = TensorDictReplayBuffer(storage=AtariZarrStorage(store_url), batch_size=8)
    >>> sample = rb.sample()
    >>> sample["observation"].shape, sample.get_non_tensor("metadata")["dataset_id"]
    (torch.Size([8, 84, 84]), 'Pong/1')
    """

    def __init__(
        self,
        dataset: AtariZarrDataset | str,
        *,
        storage_options: dict[str, Any] | None = None,
        frame_stack: int = 1,
        dataset_id: str | None = None,
    ) -> None:
        if not isinstance(dataset, AtariZarrDataset):
            dataset = AtariZarrDataset(
                str(dataset), storage_options=storage_options, frame_stack=frame_stack
            )
        self.dataset = dataset
        self.where = dataset.where
        self.dataset_id = dataset_id or _store_name(dataset)
        # one-entry cache: SliceSampler reads storage[index] for the done flags, then the
        # buffer reads the very same index; the second read reuses the first.
        self._last: tuple[np.ndarray, TensorDictBase] | None = None
        super().__init__(len(dataset))

    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row: the trajectories of TorchRL's slice samplers."""
        return self.dataset.episodes

    def metadata(self) -> dict[str, Any]:
        """What a sample's ``metadata`` entry holds."""
        return {"dataset_id": self.dataset_id}

    def read(self, rows: np.ndarray) -> TensorDictBase:
        last = self._last
        if last is not None and np.array_equal(last[0], rows):
            self._last = None
            return last[1]
        td = self.dataset[rows].exclude(_INDEX)
        td.set_non_tensor(METADATA, self.metadata())
        self._last = (rows, td)
        # the first reader gets a shallow copy: keys it adds do not leak to the second
        return td.copy()

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "dataset_id": self.dataset_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"], dataset_id=state["dataset_id"])  # type: ignore[misc]


class PreprocessedStorage(ReadOnlyTensorStorage):
    """The rows :func:`~atari_zarr.compat.preprocess.preprocess` wrote, as a TorchRL storage.

    Parameters
    ----------
    path_or_url : str
        The ``dest`` of ``preprocess``: a Zarr group with one array per key.
    storage_options : dict, optional
        fsspec options for a URL.

    Raises
    ------
    StoreIncompleteError
        ``preprocess`` did not finish writing it (run it again: it resumes).
    StoreFormatError
        Not what ``preprocess`` writes.
    """

    def __init__(
        self, path_or_url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> None:
        self.url = os.fspath(path_or_url)
        self.storage_options = dict(storage_options or {})
        self.where = redact(self.url)
        store = open_zarr_store(self.url, self.storage_options, read_only=True)
        try:
            group = zarr.open_group(store, mode="r", zarr_format=3)
        except FileNotFoundError:
            raise StoreFormatError(
                f"{self.where} is not a preprocessed dataset: expected the dest that "
                f"preprocess(fn, dest=...) wrote. Check the path."
            ) from None
        info = group.attrs.get(PREPROCESS_KEY)
        if not isinstance(info, dict) or "keys" not in info:
            raise StoreFormatError(
                f"{self.where} is a Zarr group but not a preprocessed dataset: expected an "
                f"{PREPROCESS_KEY!r} attribute; pass the dest of preprocess(fn, dest=...)"
            )
        if info.get("complete") is not True:
            raise StoreIncompleteError(
                f"{self.where} is an unfinished preprocess: an unfinished dataset, not a damaged "
                f"one. Run the same preprocess(fn, dest=...) again: it resumes."
            )
        self.info = info
        self._metadata = info.get("metadata")
        # keys are recorded as lists of names (nested keys); each is an array at its path
        self._keys = {"/".join(key): tuple(key) for key in info["keys"]}
        self._rows = GroupRows(group, list(self._keys), where=self.where)
        super().__init__(int(info["num_frames"]))

    def read(self, rows: np.ndarray) -> TensorDictBase:
        td = TensorDict({}, batch_size=[len(rows)])
        for path, values in self._rows.read(rows).items():
            td.set(self._keys[path], torch.from_numpy(values))
        if self._metadata is not None:
            td.set_non_tensor(METADATA, self._metadata)
        return td

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]
