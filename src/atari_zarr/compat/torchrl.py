"""TorchRL drop-in: :class:`AtariZarrExperienceReplay` (and :class:`AtariZarrStorage`).

``AtariZarrExperienceReplay`` takes the arguments of TorchRL's ``AtariDQNExperienceReplay``
with the same meaning, reading stores instead of memory-mapping the original files and
fetching what is missing from RL Unplugged's public copy (:mod:`atari_zarr.pull`).
Importing this module registers it in TorchRL's dataset registry
(``load_dataset("atari_zarr:Pong/5", batch_size=32)``). ``docs/torchrl.md`` goes through
TorchRL's class method by method. It needs the ``torchrl`` extra (``pip install
'atari-zarr[torchrl]'``); ``import atari_zarr`` never imports it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection, is_tensorclass
from tensordict.utils import expand_as_right
from torch.utils._pytree import tree_map

from atari_zarr.catalog import complete_stores, name_to_url
from atari_zarr.compat.torchrl_storage import AtariZarrStorage, PreprocessedStorage, refuse
from atari_zarr.errors import InvalidArgumentError, import_optional
from atari_zarr.forks import after_fork
from atari_zarr.pull import Request, open_request
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.read.options import ReadOptions
from atari_zarr.storage.deadline import Timeout

# MissingDependencyError naming the extra when TorchRL is not installed
import_optional("torchrl", extra="torchrl", purpose="atari_zarr.torchrl")

from tensordict.nn.utils import _set_dispatch_td_nn_modules  # noqa: E402
from torchrl.data.datasets.common import BaseDatasetExperienceReplay  # noqa: E402
from torchrl.data.replay_buffers.replay_buffers.base import (  # noqa: E402
    _run_after_futures,
    _storage_index,
)
from torchrl.data.replay_buffers.samplers import (  # noqa: E402
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.utils import INT_CLASSES, _to_torch  # noqa: E402
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter  # noqa: E402

__all__ = [
    "AHEAD_FILE",
    "REGISTRY_PREFIX",
    "AtariZarrExperienceReplay",
    "AtariZarrStorage",
    "PreprocessedStorage",
]

log = logging.getLogger("atari_zarr")


class _Drawn(NamedTuple):
    """A batch and its sampling info, the info already set in the batch."""

    data: Any
    info: dict


def _with_info(data: Any, info: dict, *, device: Any = None) -> _Drawn:
    """What TorchRL's ``TensorDictReplayBuffer.sample()`` does to a batch once drawn:
    ``info`` moved to the storage's ``device``, and each of its entries set in the batch
    (an ``"index"`` of several dimensions stacked)."""
    if device is not None:
        info = tree_map(lambda x: x.to(device) if hasattr(x, "to") else x, info)
    if not is_tensor_collection(data):
        raise RuntimeError("Cannot include info in non-tensordict data")  # TorchRL's words
    if not is_tensorclass(data):
        locked = data.is_locked
        if locked:
            data.unlock_()
        for key, value in info.items():
            if key == "index" and isinstance(value, tuple):
                value = torch.stack(value, -1)
            try:
                value = _to_torch(value, data.device)
                if value.ndim < data.ndim:
                    value = expand_as_right(value, data)
                data.set(key, value)
            except RuntimeError as error:  # TorchRL's words, for a transform's reshaping
                raise RuntimeError(
                    "Failed to set the metadata (e.g., indices or weights) in the sampled "
                    "tensordict within TensorDictReplayBuffer.sample. This is probably caused "
                    "by a shape mismatch (one of the transforms has probably modified the "
                    "shape of the output tensordict). You can always recover these items from "
                    "the `sample` method from a regular ReplayBuffer instance with the "
                    "'return_info' flag set to True."
                ) from error
        if locked:
            data.lock_()
    return _Drawn(data, info)


def _prefetch_pool() -> ThreadPoolExecutor:
    """The one thread that draws a drop-in's batches ahead."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="atari_zarr-prefetch")


#: The file of a dump (``dumps``) holding the batches drawn ahead (``prefetch``): the
#: rows and sampling info of each, never its frames (``loads`` reads them again).
AHEAD_FILE = "atari_zarr_prefetch.json"
_AHEAD_FORMAT = 1
# what a sampler's info holds (indices, flags, weights): kept exactly through JSON
_AHEAD_DTYPES = frozenset(
    {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"}
)


def _encode_info(info: dict, where: str) -> list[dict[str, Any]]:
    """The JSON of a drawn batch's sampling info: each entry's key, and its tensor (or
    tuple of tensors: a multi-dimensional ``index``) as dtype, shape and values."""
    entries = []
    for key, value in info.items():
        parts = list(value) if isinstance(value, tuple) else [value]
        arrays = []
        for part in parts:
            array = part.detach().cpu().numpy() if isinstance(part, torch.Tensor) else None
            if array is None or str(array.dtype) not in _AHEAD_DTYPES:
                raise InvalidArgumentError(
                    f"cannot dump to {where}: a batch drawn ahead carries sampling info "
                    f"{key!r} of {type(part).__name__} {getattr(part, 'dtype', '')}, which "
                    f"is saved only as a tensor of numbers; dump the replay buffer before it "
                    f"draws ahead (without prefetch), or use its state_dict()"
                )
            arrays.append(
                {
                    "dtype": str(array.dtype),
                    "shape": list(array.shape),
                    "values": array.ravel().tolist(),
                }
            )
        entries.append(
            {
                "key": list(key) if isinstance(key, tuple) else key,
                "tuple": isinstance(value, tuple),
                "arrays": arrays,
            }
        )
    return entries


def _values(values: list, dtype: str, key: Any) -> np.ndarray:
    """``values`` as an array of ``dtype``, each one of that type as JSON writes it: a
    bool of a flag, an int of an index (in the dtype's range), a number of a weight;
    never rounded nor cast (ValueError: they are not)."""
    if dtype == "bool":
        ok = all(type(v) is bool for v in values)
    elif dtype.startswith(("int", "uint")):
        bounds = np.iinfo(dtype)
        ok = all(type(v) is int and bounds.min <= v <= bounds.max for v in values)
    else:  # a weight: a finite number of that float type (never inf, nor NaN)
        top = float(np.finfo(dtype).max)
        ok = all(type(v) in (int, float) and abs(v) <= top for v in values)
    if not ok:
        raise ValueError(f"info {key!r} has values that are not {dtype}")
    return np.asarray(values, dtype=dtype)


def _decode_info(entries: Any) -> dict:
    """The sampling info :func:`_encode_info` wrote (ValueError: it is not that)."""
    if not isinstance(entries, list):
        raise ValueError("a batch's info is not a list")
    info: dict[Any, Any] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError(f"an info entry is {type(entry).__name__}, not an object")
        key, arrays = entry.get("key"), entry.get("arrays")
        if isinstance(key, list) and key and all(isinstance(k, str) for k in key):
            key = tuple(key) if len(key) > 1 else key[0]  # ("a",) is "a" in a tensordict
        elif not isinstance(key, str):
            raise ValueError(f"an info key {key!r:.40} is not a string or a list of them")
        if not isinstance(arrays, list) or not arrays or key in info:
            raise ValueError(f"info {key!r} has no values, or twice")
        parts = []
        for a in arrays:
            if not isinstance(a, dict):
                raise ValueError(f"info {key!r} is not a tensor of numbers")
            dtype, shape, values = a.get("dtype"), a.get("shape"), a.get("values")
            if dtype not in _AHEAD_DTYPES or not isinstance(values, list):
                raise ValueError(f"info {key!r} is not a tensor of numbers")
            if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
                raise ValueError(f"info {key!r} has shape {shape!r:.40}")
            if math.prod(shape) != len(values):
                raise ValueError(f"info {key!r} has {len(values)} values for shape {shape}")
            parts.append(torch.from_numpy(_values(values, dtype, key).reshape(shape)))
        if entry.get("tuple") is not True and len(parts) != 1:
            raise ValueError(f"info {key!r} has {len(parts)} tensors")
        info[key] = tuple(parts) if entry.get("tuple") is True else parts[0]
    if "index" not in info:
        raise ValueError("a batch has no index")
    return info


class AtariZarrExperienceReplay(BaseDatasetExperienceReplay):
    """TorchRL's ``AtariDQNExperienceReplay``, reading atari_zarr stores.

    Change the import; the arguments keep their meaning. As TorchRL's, it fetches
    what is missing (``download=True``): the run is converted from RL Unplugged's
    public copy into ``root`` (default ``$ATARI_ZARR_HOME``, ``~/.cache/atari_zarr``),
    unless ``root`` or a mirror already holds it (:func:`atari_zarr.pull.resolve`).
    Samples are TED tensordicts (see :class:`~atari_zarr.AtariZarrDataset`):
    ``observation`` ``[B, 84, 84]`` uint8, ``action`` ``[B]`` int64, flags ``[B, 1]``
    bool, ``("next", "reward")`` ``[B, 1]`` float32, plus ``index`` and ``episode``.

    Parameters
    ----------
    dataset_id : str
        ``"Game/run"``, e.g. ``"Pong/5"``: the store ``{root}/{Game}/{run}.zarr``.
    batch_size : int, optional
        Batch size of :meth:`sample` and iteration.
    root : str or Path, optional
        Local directory or fsspec URL holding ``{Game}/{run}.zarr`` stores, where a
        download goes (default: the cache, ``$ATARI_ZARR_HOME`` or
        ``~/.cache/atari_zarr``).
    storage_options : dict, optional
        fsspec options for a URL root or mirror, e.g. ``{"token": "anon"}``.
    download : bool or "force"
        TorchRL's meaning: ``True`` fetches the run when it is missing (from a
        mirror, read in place, else converted from RL Unplugged's public copy into
        ``root``); ``"force"`` converts it again; ``False`` never touches the
        network, and a missing run is one line naming the command that fetches it.
    mirrors : str or list of str, optional
        Roots of stores read in place before anything is downloaded (default
        ``$ATARI_ZARR_MIRRORS``).
    timeout : float, None or "default"
        Seconds each remote call may take (``"default"``: ``$ATARI_ZARR_TIMEOUT``, else
        60 s).
    sampler, writer : optional
        TorchRL sampler (overrides ``num_slices``/``slice_len``/``replacement``) and
        writer (default ``ImmutableDatasetWriter``).
    transform : Transform, optional
        Applied by :meth:`sample` (e.g. ``CatFrames`` over slices).
    num_slices, slice_len : int, optional
        Sample slices of episodes with TorchRL's ``SliceSampler``; slices never cross
        an episode (the sampler gets :attr:`AtariZarrExperienceReplay.episodes` as trajectories).
    strict_len : bool
        If False, episodes shorter than a slice may appear (shorter slices). TorchRL's
        spelling ``strict_length`` is accepted too.
    replacement : bool
        If False, ``SliceSamplerWithoutReplacement`` (with slices) or
        ``SamplerWithoutReplacement``: every transition once per epoch.
    frame_stack : int
        Frames per observation, stacked by the reader (``[B, k, 84, 84]``); an
        alternative to TorchRL's ``CatFrames``.
    options : ReadOptions, optional
        How the store is read (:class:`~atari_zarr.read.options.ReadOptions`: the
        decoded-frame cache, decoding threads, ...); default ``ReadOptions()``.
    num_procs, mp_start_method :
        Accepted for compatibility; they have no effect (a download is converted
        with the conversion's own workers).
    **kwargs :
        Passed to TorchRL's ``TensorDictReplayBuffer`` (``prefetch``,
        ``pin_memory``, ``collate_fn``, ...).

    Attributes
    ----------
    available_datasets : list of str
        The ``"Game/run"`` stores under ``root``.
    origin : str
        Where the store was found: ``"cache"`` (``root``), ``"mirror"`` or ``"pulled"``.
    episodes : torch.Tensor
        Episode id of every row (for ``SliceSampler``).

    Examples
    --------
    >>> # dest_root: where `atari-zarr convert` wrote stores (here a small Pong/1 fixture run)
    >>> dataset = AtariZarrExperienceReplay("Pong/1", batch_size=32, root=dest_root, slice_len=8)
    >>> dataset.origin
    'cache'
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
        options: ReadOptions | None = None,
        mirrors: str | list[str] | None = None,
        timeout: Timeout = "default",
        **kwargs: Any,
    ) -> None:
        if "strict_length" in kwargs:
            strict_len = bool(kwargs.pop("strict_length"))
        request = Request.parse(str(dataset_id))
        dataset, found = open_request(
            request,
            home=root,
            mirrors=mirrors,
            download=download,  # type: ignore[arg-type]
            storage_options=storage_options,
            timeout=timeout,
            frame_stack=frame_stack,
            options=options,
        )
        self.storage_options = dict(found.storage_options)
        self.root = found.root
        self.dataset_id = request.dataset_id
        #: Where the store was found: ``"cache"``, ``"mirror"`` or ``"pulled"``.
        self.origin = found.origin
        storage = AtariZarrStorage(dataset, dataset_id=self.dataset_id)
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
        self._one_prefetch_thread()

    # -- batches drawn ahead ----------------------------------------------------------
    def _one_prefetch_thread(self) -> None:
        """Batches drawn ahead (``prefetch=k``) come from one thread, in order, ``k`` at
        most in flight. TorchRL's pool has ``k`` threads, which only take the GIL from
        each other: on a run far larger than its cache, ``sample()`` at ``prefetch=4``
        ran at 0.84x ``AtariZarrDataset.sample``, and at 0.97x with one thread
        (``docs/benchmarks/cores.md``). One thread also draws the indices in order."""
        pool = getattr(self, "_prefetch_executor", None)
        if pool is not None and self._prefetch_cap:
            pool.shutdown(wait=False)
            self._prefetch_executor = _prefetch_pool()
            after_fork(self._renew_prefetch)

    def _renew_prefetch(self) -> None:
        """In a forked child: the parent's prefetch thread is not there, its batches in
        flight are the parent's, and the locks it held while drawing one stay held."""
        if getattr(self, "_prefetch_executor", None) is not None:
            self._prefetch_executor = _prefetch_pool()
        self._prefetch_queue: collections.deque[Any] = collections.deque()
        self._futures_lock = threading.RLock()
        self._replay_lock = threading.RLock()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._one_prefetch_thread()

    def sample(
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        include_info: bool | None = None,
    ) -> Any:
        """A batch, as TorchRL's ``sample()``; with ``prefetch``, taken from those drawn ahead.

        Without ``prefetch``, with TorchRL's deprecated ``include_info``, or with a
        ``batch_size`` other than the constructor's, this is TorchRL's method. With
        ``prefetch``, the batches come in TorchRL's order and number (``prefetch`` in
        flight, fewer when a sampler without replacement runs out, each drawn after any
        update submitted before it), but the prefetch thread also does what TorchRL's
        ``sample()`` does to a batch once drawn: its ``info`` moved to the storage's
        device and set in it (``"index"``). The caller's thread only takes the batch.
        That part used to run on the caller's thread, where it took the GIL from the
        prefetch thread drawing the next batch: at a cache of 2% of the frames,
        ``prefetch=4`` went from 0.84-0.88x ``AtariZarrDataset.sample`` to 0.90-0.92x
        (``docs/benchmarks/cores.md``).

        Examples
        --------
        >>> ahead = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=dest_root, prefetch=2)
        >>> data, info = ahead.sample(return_info=True)
        >>> bool((data["index"] == info["index"]).all()), len(ahead._prefetch_queue)
        (True, 2)
        >>> ahead.shutdown()
        """
        if not self._prefetch or include_info is not None:
            return super().sample(batch_size, return_info=return_info, include_info=include_info)
        if self._delayed_init and not self.initialized:
            self._init()
        if self._service_shutdown:
            raise RuntimeError("A shut down replay buffer cannot be sampled.")
        if batch_size is None:
            batch_size = self._batch_size
        elif self._batch_size is not None and batch_size != self._batch_size:
            # TorchRL's one warning of a batch size other than the constructor's
            return super().sample(batch_size, return_info=return_info)
        with self._futures_lock:
            if len(self._prefetch_queue):
                drawn = self._prefetch_queue.popleft().result()
                if not isinstance(drawn, _Drawn):  # queued by TorchRL's own sample()
                    drawn = _with_info(*drawn, device=getattr(self.storage, "device", None))
            else:
                if self._sample_dependency is not None:
                    self._sample_dependency.result()
                drawn = self._drawn(batch_size)
            while (
                len(self._prefetch_queue)
                < min(self._sampler._remaining_batches, self._prefetch_cap)
                and not self._sampler.ran_out
            ):
                draw = functools.partial(self._drawn, batch_size)
                if self._sample_dependency is None:
                    future = self._prefetch_executor.submit(draw)
                else:
                    future = self._prefetch_executor.submit(
                        _run_after_futures, (self._sample_dependency,), draw
                    )
                self._prefetch_queue.append(future)
        return tuple(drawn) if return_info else drawn.data

    def _drawn(self, batch_size: int) -> _Drawn:
        """A batch drawn (TorchRL's ``_sample``), with what TorchRL's ``sample()`` adds."""
        data, info = self._sample(batch_size)
        return _with_info(data, info, device=getattr(self.storage, "device", None))

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
        """Save the replay buffer's state to the directory ``path``, as TorchRL's does.

        The sampler's state (a prioritized sampler's priorities, a sampler without
        replacement's epoch), the writer's, the generator's, the transforms' and the
        batch size are written by TorchRL; the storage writes which store they belong
        to, never its frames. The batches drawn ahead (``prefetch``), which the sampler
        has already drawn, are written as their rows and sampling info
        (:data:`AHEAD_FILE`), never their frames. :meth:`loads` reads them back into a
        dataset over the same store, the batches drawn ahead read again from it: the
        batches that follow are those the saved buffer gives.
        """
        super().dumps(path)

    def loads(self, path: Any) -> None:
        """Load what :meth:`dumps` saved; a dump of another store is refused in one line.

        The batches drawn ahead when it was saved are read again from the store and
        come first, in their order; a buffer made without ``prefetch`` refuses a dump
        that has some (their rows would be lost to the epoch). Whatever is refused is
        refused before anything of this buffer changes."""
        # which store first: a dump of another store is named as such, whatever else
        # its files hold
        self._storage.loads(Path(path).absolute() / "storage")
        self._ahead_saved: list[dict] = []
        try:
            super().loads(path)  # its batches drawn ahead: _restore_prefetch_queue_locked
        finally:
            self._ahead_saved = []

    # batches drawn ahead hold frames: TorchRL pickles them into the dump, which a
    # store-backed dataset neither writes nor unpickles. Their rows and info are saved
    # instead: the sampler has drawn them, so without them their rows would be lost
    def _dump_prefetch_state(self, path: Path, prefetch_state: Any) -> None:
        file = Path(path) / AHEAD_FILE
        queue = prefetch_state.get("queue") or ()
        doc = {
            "format": _AHEAD_FORMAT,
            "prefetch": int(prefetch_state.get("capacity") or 0),
            "batches": [_encode_info(info, str(file)) for _, info in queue],
        }
        file.write_text(json.dumps(doc) + "\n")

    def _load_prefetch_state(self, path: Path) -> None:
        """Read and check the batches drawn ahead (:data:`AHEAD_FILE`), before TorchRL's
        ``loads`` changes anything; they are read again from the store once the rest is
        loaded (:meth:`_restore_prefetch_queue_locked`)."""
        file = Path(path) / AHEAD_FILE
        try:
            doc = json.loads(file.read_text())
        except FileNotFoundError:  # a dump of before: nothing was drawn ahead, or lost
            return None
        except (OSError, ValueError) as err:
            raise InvalidArgumentError(
                f"{file} cannot be read as the JSON dumps() writes ({str(err)[:200]}); dump "
                f"the replay buffer again"
            ) from None
        try:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            if type(found) is not int or found != _AHEAD_FORMAT:
                raise ValueError(f"format {found!r:.20}, not {_AHEAD_FORMAT}")
            batches, prefetch = doc.get("batches"), doc.get("prefetch")
            if not isinstance(batches, list):
                raise ValueError("no list of batches")
            if type(prefetch) is not int or not 0 <= len(batches) <= prefetch:
                raise ValueError(f"{len(batches)} batches for prefetch={prefetch!r:.20}")
            infos = [_decode_info(entries) for entries in batches]
        except (ValueError, TypeError, OverflowError) as err:
            raise InvalidArgumentError(
                f"{file} is not the batches drawn ahead that dumps() writes ({str(err)[:200]}); "
                f"dump the replay buffer again"
            ) from None
        if infos and not self._prefetch:
            raise InvalidArgumentError(
                f"{file} holds {len(infos)} batches drawn ahead (the buffer was saved with "
                f"prefetch={prefetch}), which the sampler had already drawn, but this buffer "
                f"draws none ahead: make it with prefetch={prefetch} to load the dump"
            )
        self._check_ahead(infos, file)
        self._ahead_saved = infos
        return None

    def _check_ahead(self, infos: list[dict], file: Path) -> None:
        """Each saved batch reads rows of this store, as a sampler draws them: one flat
        index of row numbers within it, info of one value per row, and none that would
        replace what the store holds (frames, actions, rewards) but a sampler's flags."""
        n = len(self._storage)
        held = self._storage.get(np.zeros(0, dtype=np.int64))
        entries = set(held.keys(include_nested=True, leaves_only=True))

        def bad(b: int, what: str) -> InvalidArgumentError:
            return InvalidArgumentError(
                f"{file}: batch {b} drawn ahead {what}, not rows of the {n} of "
                f"{self.data_path} as a sampler draws them; dump the replay buffer again"
            )

        for b, info in enumerate(infos):
            index = info["index"]
            parts = index if isinstance(index, tuple) else (index,)
            rows = parts[0]
            if len(parts) != 1 or rows.ndim != 1:
                raise bad(b, f"has an index of {len(parts)} tensor(s), shape {tuple(rows.shape)}")
            if rows.dtype == torch.bool or rows.dtype.is_floating_point:
                raise bad(b, f"has an index of {rows.dtype}")
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n):
                raise bad(b, f"has rows {int(rows.min())} to {int(rows.max())}")
            for key, value in info.items():
                for part in value if isinstance(value, tuple) else (value,):
                    if part.ndim == 0 or part.shape[0] != rows.numel():
                        raise bad(b, f"has info {key!r} of shape {tuple(part.shape)}")
                    if key in entries and part.dtype != torch.bool:
                        raise bad(b, f"has info {key!r}, which the store holds")

    def _restore_prefetch_queue_locked(self, prefetch_state: Any, *args: Any, **kw: Any) -> None:
        # TorchRL's loads, once everything else is loaded (transforms included) and with
        # its locks held: the saved batches come first, before any other draw
        saved = getattr(self, "_ahead_saved", None)
        if prefetch_state is not None or not saved:
            return super()._restore_prefetch_queue_locked(prefetch_state, *args, **kw)  # type: ignore[no-any-return]
        self._ahead_saved = []
        for info in saved:
            future: Future[_Drawn] = Future()
            future.set_result(self._again(info))
            self._prefetch_queue.append(future)
        return None

    def _again(self, info: dict) -> _Drawn:
        """A batch drawn ahead and saved by :meth:`dumps`, read again from the store as
        TorchRL's ``_sample`` reads a batch once its sampler has drawn it."""
        index = info["index"]
        with self._replay_lock:
            data = self._storage.get(_storage_index(index, self._storage))
        if not isinstance(index, INT_CLASSES):
            data = self._collate_fn(data)
        if self._transform is not None and len(self._transform):
            is_td = is_tensor_collection(data)
            unlocked = data.unlock_() if is_td else contextlib.nullcontext()
            with unlocked, _set_dispatch_td_nn_modules(is_td):
                data = self._transform(data)
        return _with_info(data, info, device=getattr(self.storage, "device", None))

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
        version: str | None = None,
        overwrite: bool = False,
    ) -> PreprocessedStorage:
        """Apply ``fn`` to every sample once and write the results to ``dest``, compressed.

        TorchRL's signature and meaning (``fn`` maps a batch TensorDict to one of the
        same batch size; ``num_frames`` only the first ones): returns a TorchRL
        storage for a ``ReplayBuffer``. ``dest`` is a Zarr store (a local path or any
        fsspec URL), compressed as the stores are, where TorchRL writes memory maps:
        see :func:`atari_zarr.compat.preprocess.preprocess`. ``version`` and
        ``overwrite`` are this library's: ``dest`` records what made it and never mixes
        the outputs of two functions.
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
            version=version,
            overwrite=overwrite,
        )


#: ``torchrl.data.datasets.load_dataset("atari_zarr:Pong/5", ...)`` builds the drop-in.
REGISTRY_PREFIX = "atari_zarr"


def _register() -> None:
    """Register the drop-in in TorchRL's dataset registry (TorchRL >= 0.14 has one)."""
    try:
        from torchrl.data.datasets import register_dataset
    except ImportError:  # pragma: no cover - TorchRL before 0.14
        return
    register_dataset(
        REGISTRY_PREFIX, "atari_zarr.compat.torchrl:AtariZarrExperienceReplay", replace=True
    )


_register()
