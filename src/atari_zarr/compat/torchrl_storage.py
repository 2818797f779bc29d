"""TorchRL storages over stores, read lazily: :class:`AtariZarrStorage` and the preprocessed.

Both are TorchRL ``TensorStorage`` objects, so any TorchRL replay buffer takes them
as it takes its own (``ReplayBuffer(storage=...)`` picks its collate function from
the storage's class), but nothing is held in memory: ``storage.get(index)``, what a
replay buffer reads its batches with, reads the rows asked for from the store, and
``storage[index]``, what TorchRL's samplers index, gives those rows as a
:class:`~atari_zarr.compat.lazy_rows.LazyRows`, whose entries are read when asked. So
``storage[:][("next", "done")]``, how a slice sampler finds a run's trajectories,
reads that column and no frame, whatever the size of the run.

* :class:`AtariZarrStorage`: a converted store, as TED transitions
  (:class:`~atari_zarr.AtariZarrDataset`), each batch with TorchRL's ``metadata``
  entry (``{"dataset_id": "Game/run"}``);
* :class:`PreprocessedStorage`: what :func:`~atari_zarr.compat.preprocess.preprocess`
  wrote, a Zarr group with one array per key of the transformed samples.

Both are read-only: writing, emptying or extending raises
:class:`~atari_zarr.errors.ReadOnlyDatasetError` naming the store and what to do.
``dumps(path)`` writes which store a replay buffer's state belongs to, not its frames,
and ``loads(path)`` refuses a state saved from another store.

This module needs the ``torchrl`` extra.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from tensordict import NonTensorData, TensorDict, TensorDictBase

from atari_zarr.compat.lazy_rows import LazyRows, Reader
from atari_zarr.errors import (
    InvalidArgumentError,
    ReadOnlyDatasetError,
    StoreFormatError,
    StoreIncompleteError,
    import_optional,
)
from atari_zarr.read.arrays import GroupRows
from atari_zarr.read.batch import STEP_ENTRIES, step_entry
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
#: The file of a dump (``dumps``) that says which store the state belongs to.
DUMP_FILE = "atari_zarr_storage.json"


#: What a store-backed dataset says when asked to change: why, and what to do instead.
_REFUSALS = {
    "set": "is a read-only dataset: it cannot be written to; copy samples into a regular "
    "TorchRL storage (e.g. LazyTensorStorage) to edit them",
    "add": "is a read-only dataset: nothing is added to it; copy samples into a regular "
    "TorchRL ReplayBuffer (e.g. with LazyTensorStorage) to extend them",
    "extend": "is a read-only dataset: it cannot be extended; copy samples into a regular "
    "TorchRL ReplayBuffer (e.g. with LazyTensorStorage) to extend them",
    "empty": "is a read-only dataset: it cannot be emptied; make a new ReplayBuffer for new data",
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
    """A TorchRL ``TensorStorage`` of ``n`` rows read on demand.

    Subclasses give :meth:`read` (rows -> TensorDict, every entry), :meth:`readers`
    (rows -> what reads each entry, for :class:`LazyRows`), :meth:`identity` (what a
    dump checks) and :attr:`where` (for messages).
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

    def read(self, rows: np.ndarray | range) -> TensorDictBase:  # pragma: no cover - abstract
        raise NotImplementedError

    def readers(
        self, rows: np.ndarray | range
    ) -> tuple[dict[Any, Reader], dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _select(self, index: Any) -> tuple[np.ndarray | range, bool]:
        # a slice stays a range: storage[:] of 50 M rows needs no array of row numbers
        if isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        if isinstance(index, slice):
            return range(*index.indices(len(self))), False
        return normalize_index(index, len(self), self.where)

    def get(self, index: Any) -> TensorDictBase:
        """The rows ``index`` selects, every entry read: what a replay buffer's batch is."""
        rows, scalar = self._select(index)
        td = self.read(rows)
        return td[0] if scalar else td

    def __getitem__(self, index: Any) -> TensorDictBase:
        """The rows ``index`` selects, each entry read when asked (:class:`LazyRows`)."""
        rows, scalar = self._select(index)
        readers, held = self.readers(rows)
        lazy = LazyRows.of(len(rows), readers, held)
        return lazy[0] if scalar else lazy

    # -- read-only ---------------------------------------------------------------------
    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise refuse(self.where, "set")

    def _empty(self) -> None:
        raise refuse(self.where, "empty")

    # -- a replay buffer's saved state: which store, never the frames --------------------
    def state_dict(self) -> dict[str, Any]:
        return {"atari_zarr": self.identity()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:  # TorchRL's own storages save {} where nothing is held
            self._check_identity(state_dict.get("atari_zarr"), "the state_dict")

    def dumps(self, path: Any) -> None:
        """Write which store this is (:data:`DUMP_FILE` under ``path``), not its rows."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / DUMP_FILE).write_text(json.dumps(self.identity(), indent=1) + "\n")

    def loads(self, path: Any) -> None:
        """Check that the dump at ``path`` was written by this store's storage."""
        file = Path(path) / DUMP_FILE
        try:
            saved = json.loads(file.read_text())
        except FileNotFoundError:
            raise InvalidArgumentError(
                f"{file} is missing: expected the dump of a replay buffer over an atari_zarr "
                f"store, as its dumps(path) writes it; pass the path given to dumps()"
            ) from None
        except (OSError, ValueError) as err:
            raise InvalidArgumentError(
                f"{file} cannot be read as the JSON dumps() writes ({err}); dump the replay "
                f"buffer again"
            ) from None
        self._check_identity(saved, str(file))

    def _check_identity(self, saved: Any, source: str) -> None:
        mine = self.identity()
        if saved != mine:
            raise InvalidArgumentError(
                f"{source} was saved from {_identity_text(saved)}, not from {self.where} "
                f"({_identity_text(mine)}): a sampler's state (its priorities, its epoch) "
                f"only means something for the rows it was saved from; load it into a "
                f"replay buffer over that store"
            )

    def contains(self, item: Any) -> Any:
        rows = torch.as_tensor(item)
        return (rows >= -len(self)) & (rows < len(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r}, len={len(self)})"


def _identity_text(identity: Any) -> str:
    if not isinstance(identity, dict):
        return f"something else ({identity!r:.60})"
    return ", ".join(f"{key} {value}" for key, value in identity.items())


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
        # whole-storage per-step entries, read once: TorchRL's slice samplers ask for
        # storage[:][key] at every sample
        self._whole: dict[Any, torch.Tensor] = {}
        super().__init__(len(dataset))

    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row: the trajectories of TorchRL's slice samplers."""
        return self.dataset.episodes

    def metadata(self) -> dict[str, Any]:
        """What a sample's ``metadata`` entry holds."""
        return {"dataset_id": self.dataset_id}

    def identity(self) -> dict[str, Any]:
        """The store a dump or a state_dict belongs to: its id, transitions and episodes."""
        return {
            "dataset_id": self.dataset_id,
            "transitions": len(self),
            "episodes": self.dataset.num_episodes,
        }

    def read(self, rows: np.ndarray | range) -> TensorDictBase:
        td = self.dataset[rows].exclude(_INDEX)
        td.set_non_tensor(METADATA, self.metadata())
        return td

    def readers(self, rows: np.ndarray | range) -> tuple[dict[Any, Reader], dict[str, Any]]:
        """What reads each entry of ``rows``: a per-step entry reads its step values only
        (a whole storage's once), the two observations one read of the rows (``read``)."""
        shape = (len(rows),)
        whole = isinstance(rows, range) and rows == range(len(self))
        batch = functools.cache(lambda: self.read(rows))  # both observations: one read

        def frames(key: Any) -> Reader:
            return lambda: batch().get(key)

        def steps(key: Any) -> Reader:
            def read() -> torch.Tensor:
                if whole and key in self._whole:
                    return self._whole[key]
                value = step_entry(key, self.dataset.read_steps(rows, STEP_ENTRIES[key]), shape)
                if whole:
                    self._whole[key] = value
                return value

            return read

        readers: dict[Any, Reader] = {key: steps(key) for key in STEP_ENTRIES if key != _INDEX}
        readers["observation"] = frames("observation")
        readers["next", "observation"] = frames(("next", "observation"))
        held = {METADATA: NonTensorData(self.metadata(), batch_size=torch.Size(shape))}
        return readers, held

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

    def read(self, rows: np.ndarray | range) -> TensorDictBase:
        td = TensorDict({}, batch_size=[len(rows)])
        for path, values in self._rows.read(rows).items():
            td.set(self._keys[path], torch.from_numpy(values))
        if self._metadata is not None:
            td.set_non_tensor(METADATA, self._metadata)
        return td

    def readers(self, rows: np.ndarray | range) -> tuple[dict[Any, Reader], dict[str, Any]]:
        """What reads each key's array at ``rows``, that array only."""

        def array(path: str) -> Callable[[], torch.Tensor]:
            return lambda: torch.from_numpy(self._rows.read(rows, [path])[path])

        held = {}
        if self._metadata is not None:
            held[METADATA] = NonTensorData(self._metadata, batch_size=torch.Size([len(rows)]))
        return {key: array(path) for path, key in self._keys.items()}, held

    def identity(self) -> dict[str, Any]:
        """The dataset a dump or a state_dict belongs to: where, and its rows."""
        return {"preprocessed": self.where, "transitions": len(self)}

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]
