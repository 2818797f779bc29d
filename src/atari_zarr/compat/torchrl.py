"""TorchRL drop-in: :class:`AtariZarrExperienceReplay` (and :class:`AtariZarrStorage`).

``AtariZarrExperienceReplay`` takes the arguments of TorchRL's
``AtariDQNExperienceReplay`` with the same meaning, reading converted stores
(``{root}/{Game}/{run}.zarr``, local or any fsspec URL) instead of downloading and
memory-mapping the original files. Its samples carry TorchRL's ``metadata`` entry
(``dataset_id``); ``preprocess`` writes a transformed copy, compressed
(:mod:`atari_zarr.compat.preprocess`). ``AtariZarrStorage``
(:mod:`atari_zarr.compat.torchrl_storage`) is the read-only TorchRL storage
underneath; any TorchRL replay buffer can use it.

What of TorchRL's class does what (``docs/torchrl.md`` has the table): sampling,
iteration, samplers, transforms, ensembles and ``preprocess`` work as TorchRL
documents them; writing (``add``, ``extend``, ``empty``), ``dumps``/``loads`` and
``delete`` raise one line saying why and what to do instead.

This module needs the ``torchrl`` extra (``pip install 'atari-zarr[torchrl]'``);
``import atari_zarr`` never imports it.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from atari_zarr.compat.torchrl_storage import AtariZarrStorage, PreprocessedStorage, refuse
from atari_zarr.errors import (
    InvalidArgumentError,
    StoreFormatError,
    import_optional,
)
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.storage.catalog import (
    check_entry,
    complete_store_entries,
    complete_stores,
    name_to_url,
)
from atari_zarr.storage.paths import redact

# MissingDependencyError naming the extra when TorchRL is not installed
import_optional("torchrl", extra="torchrl", purpose="atari_zarr.torchrl")

from torchrl.data.datasets.common import BaseDatasetExperienceReplay  # noqa: E402
from torchrl.data.replay_buffers.samplers import (  # noqa: E402
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter  # noqa: E402

__all__ = ["AtariZarrExperienceReplay", "AtariZarrStorage", "PreprocessedStorage"]

log = logging.getLogger("atari_zarr")


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
        # one request with a catalog.json at root; its entry is checked once the store is open
        available, entries = complete_store_entries(self.root, self.storage_options)
        if self.dataset_id not in available:
            close = difflib.get_close_matches(self.dataset_id, available, n=5, cutoff=0.6)
            raise StoreFormatError(
                f"{self.dataset_id!r} is not a store under {redact(self.root)}: expected "
                f"{redact(self.data_path)}. Close matches: {close or 'none'}, of "
                f"{len(available)} stores there. "
                f"Convert it with `atari-zarr convert SOURCE {redact(self.root)}`."
            )
        storage = AtariZarrStorage(
            self.data_path,
            storage_options=self.storage_options,
            frame_stack=frame_stack,
            dataset_id=self.dataset_id,
        )
        if entries is not None:
            check_entry(entries[self.dataset_id], storage.dataset.metadata, self.data_path)
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
        raise refuse(self.data_path, "delete")

    def add(self, data: Any) -> Any:
        raise refuse(self.data_path, "add")

    def extend(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        raise refuse(self.data_path, "extend")

    def empty(self, *args: Any, **kwargs: Any) -> None:
        raise refuse(self.data_path, "empty")

    def dumps(self, path: Any) -> None:
        raise refuse(self.data_path, "dumps")

    def loads(self, path: Any) -> None:
        raise refuse(self.data_path, "loads")

    def preprocess(
        self,
        fn: Callable[[TensorDictBase], TensorDictBase],
        dim: int = 0,
        num_workers: int | None = None,
        *,
        chunksize: int | None = None,
        num_chunks: int | None = None,
        pool: Any = None,
        generator: torch.Generator | None = None,
        max_tasks_per_child: int | None = None,
        worker_threads: int = 1,
        index_with_generator: bool = False,
        pbar: bool = False,
        mp_start_method: str | None = None,
        num_frames: int | None = None,
        dest: str | os.PathLike[str],
    ) -> PreprocessedStorage:
        """Apply ``fn`` to every sample once and write the results to ``dest``, compressed.

        TorchRL's signature and meaning (``fn`` maps a batch TensorDict to one of the
        same batch size; ``num_frames`` only the first ones): returns a TorchRL
        storage for a ``ReplayBuffer``. ``dest`` is a Zarr store (a local path or any
        fsspec URL), compressed as the stores are, where TorchRL writes memory maps:
        see :func:`atari_zarr.compat.preprocess.preprocess`.
        """
        from atari_zarr.compat.preprocess import preprocess

        return preprocess(
            self.dataset,
            fn,
            dim,
            num_workers,
            chunksize=chunksize,
            num_chunks=num_chunks,
            pool=pool,
            generator=generator,
            max_tasks_per_child=max_tasks_per_child,
            worker_threads=worker_threads,
            index_with_generator=index_with_generator,
            pbar=pbar,
            mp_start_method=mp_start_method,
            num_frames=num_frames,
            dest=dest,
            metadata=self._storage.metadata(),
        )
