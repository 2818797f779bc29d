"""TorchRL's ``preprocess`` for a store: a transform applied once, written compressed.

TorchRL's ``AtariDQNExperienceReplay.preprocess(fn, ..., dest=...)`` maps ``fn`` over
the dataset with worker processes and returns a new storage of the results, as
memory maps: a 50M-transition run would become a 350 GB memory map. Here the results
are written as a Zarr store, compressed as the stores are (Blosc zstd, crc32c per
chunk), and read back lazily by :class:`~atari_zarr.compat.torchrl_storage.PreprocessedStorage`:

.. code-block:: text

    dest/
      zarr.json                   attribute "atari_zarr_preprocess": source, keys, rows,
                                  complete (written last)
      observation, next/observation, action, ...   one array per key of fn's output
    dest.converting/              done markers while it is written (deleted at the end)

One writer per shard (a task writes whole units of :data:`UNIT_ROWS` rows), TorchRL's
workers and progress bar, resumable, and never two functions in one ``dest``
(:func:`fn_fingerprint`): ``docs/torchrl.md`` gives each rule. ``fn`` takes a batch
TensorDict (the dataset's TED samples, with ``metadata``) and returns a TensorDict of
the same batch size, as TorchRL's ``preprocess`` needs.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import multiprocessing as mp
import os
import re
import signal
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any, cast

import numpy as np
import torch
import zarr
from tensordict import TensorDictBase

from atari_zarr.arguments import whole_number
from atari_zarr.catalog import store_state
from atari_zarr.compat.torchrl_storage import METADATA, PREPROCESS_KEY, PreprocessedStorage
from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.errors import InvalidArgumentError, StoreExistsError
from atari_zarr.layout import codecs_for, for_writing, get_array
from atari_zarr.progress import progress_bar
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.resources import cpu_count
from atari_zarr.storage.paths import redact
from atari_zarr.storage.remote import open_zarr_store

__all__ = ["UNIT_ROWS", "fn_fingerprint", "preprocess"]

log = logging.getLogger("atari_zarr")

#: Rows of a write unit (a shard of frame-like arrays, a chunk of the others).
UNIT_ROWS = 4096
# Rows given to fn at a time (a task holds one unit of outputs in memory).
_BATCH = 256
# An array whose rows are at least this many bytes is chunked like frames.
_FRAME_LIKE = 1024


def fn_fingerprint(fn: Any, version: str | None = None) -> str:
    """What made a preprocessed ``dest``: ``version`` if given, else ``fn``'s code.

    The rule, exactly: with ``version=`` given, the fingerprint is that string and
    nothing else (you say when two functions give the same output). Without it, it is a
    digest of

    * the function's bytecode, constants and names (nested functions and lambdas
      included), its qualified name, its default arguments, and the values its closure
      holds (each by what it holds: sets and dicts in a canonical order, arrays and
      tensors by their bytes, objects by their attributes), recursively through
      functions in the closure;
    * for ``functools.partial``, the function, ``args`` and ``keywords``; for a bound
      method, the function and its object; for any other callable (an
      ``nn.Module``, an object with ``__call__``), its type's ``__call__``/``forward``
      code and the object's attributes.

    Not in it: globals and modules ``fn`` calls by name (a helper edited in another
    module, a model loaded into a global). A closure value that changes as ``fn`` runs
    (a counter, a cache) changes the fingerprint, and so does another Python version's
    bytecode. In those cases pass ``version=``.

    Examples
    --------
    >>> fn_fingerprint(lambda td: td) == fn_fingerprint(lambda td: td)
    True
    >>> fn_fingerprint(lambda td: td) == fn_fingerprint(lambda td: td * 2)
    False
    >>> fn_fingerprint(lambda td: td, version="v1") == fn_fingerprint(print, version="v1")
    True
    """
    if version is not None:
        return "version:" + str(version)
    h = hashlib.sha256()
    _digest(fn, h, depth=0)
    return "code:" + h.hexdigest()[:32]


def _digest(obj: Any, h: Any, depth: int) -> None:
    """Feed ``obj`` (a callable, or a value it holds) into the hash ``h``."""
    if depth > 20:  # a cycle through closures: what was fed so far decides
        return
    if isinstance(obj, functools.partial):
        h.update(b"partial")
        _digest(obj.func, h, depth + 1)
        _value(obj.args, h)
        _value(sorted(obj.keywords.items()), h)
    elif isinstance(obj, types.MethodType):
        h.update(b"method")
        _digest(obj.__func__, h, depth + 1)
        _value(obj.__self__, h)
    elif isinstance(obj, types.FunctionType):
        h.update(obj.__qualname__.encode())
        _code(obj.__code__, h)
        _value(obj.__defaults__, h)
        _value(sorted((obj.__kwdefaults__ or {}).items()), h)
        for cell in obj.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:  # an empty cell
                h.update(b"empty")
                continue
            if callable(held) and not isinstance(held, type):
                _digest(held, h, depth + 1)
            else:
                _value(held, h)
    elif callable(obj) and not isinstance(obj, (type, types.BuiltinFunctionType)):
        kind = type(obj)
        h.update(f"{kind.__module__}.{kind.__qualname__}".encode())
        for name in ("__call__", "forward"):
            method = getattr(kind, name, None)
            if isinstance(method, types.FunctionType):
                _code(method.__code__, h)
        _value(obj, h)
    else:
        h.update(repr(obj).encode())


def _code(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(const, h)
        elif isinstance(const, frozenset):  # set literals: their order follows the hash seed
            h.update(repr(sorted(map(repr, const))).encode())
        else:
            h.update(repr(const).encode())


def _value(value: Any, h: Any, depth: int = 0, seen: set[int] | None = None) -> None:
    """Feed a value into ``h`` by what it holds, the same in every process: sets and
    dicts in a canonical order (never the hash seed's), arrays and tensors by dtype,
    shape and bytes, objects (an ``nn.Module`` too) by type and attributes, addresses
    never (a ``repr`` is cleared of them)."""
    seen = set() if seen is None else seen
    if depth > 50:
        h.update(b"deep")
        return
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
        return
    if id(value) in seen:
        h.update(b"cycle;")
        return
    seen = seen | {id(value)}

    def sub(item: Any) -> bytes:
        inner = hashlib.sha256()
        _value(item, inner, depth + 1, seen)
        return inner.digest()

    if isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__}[{len(value)}]".encode())
        for item in value:
            h.update(sub(item))
    elif isinstance(value, (set, frozenset)):
        h.update(f"set[{len(value)}]".encode())
        for digest in sorted(sub(item) for item in value):
            h.update(digest)
    elif isinstance(value, dict):
        h.update(f"dict[{len(value)}]".encode())
        for pair in sorted(sub(k) + sub(v) for k, v in value.items()):
            h.update(pair)
    elif isinstance(value, np.ndarray):
        h.update(f"ndarray:{value.dtype.str}:{value.shape};".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        h.update(f"tensor:{data.dtype}:{tuple(data.shape)};".encode())
        h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        _digest(value, h, depth + 1)
    elif isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
        name = getattr(value, "__qualname__", getattr(value, "__name__", ""))
        h.update(f"{type(value).__name__}:{getattr(value, '__module__', '')}.{name};".encode())
    elif hasattr(value, "__dict__") or hasattr(type(value), "__slots__"):
        kind = type(value)
        h.update(f"object:{kind.__module__}.{kind.__qualname__};".encode())
        state = dict(getattr(value, "__dict__", {}))
        for slot in getattr(kind, "__slots__", ()):
            if isinstance(slot, str) and hasattr(value, slot):
                state[slot] = getattr(value, slot)
        h.update(sub(state))
    else:  # e.g. a lock: its kind, without the address its repr holds
        h.update(re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value)).encode())


def _leaves(td: TensorDictBase) -> dict[tuple[str, ...], torch.Tensor]:
    """The tensors of ``td`` by key tuple (non-tensor entries, the metadata, left out)."""
    out = {}
    for key in td.keys(include_nested=True, leaves_only=True):
        key = (key,) if isinstance(key, str) else tuple(key)
        if key[0] == METADATA:
            continue
        value = td.get(key)
        if isinstance(value, torch.Tensor):
            out[key] = value
    return out


class _Task:
    """Units of rows to transform and write, in a worker (or in the calling process)."""

    def __init__(
        self,
        dataset: AtariZarrDataset,
        fn: Any,
        dest: str,
        options: dict[str, Any],
        metadata: Any,
    ) -> None:
        self.dataset, self.fn, self.dest, self.options = dataset, fn, dest, options
        self.metadata = metadata

    def apply(self, rows: np.ndarray) -> dict[tuple[str, ...], torch.Tensor]:
        """``fn`` on the samples ``rows``, checked; a failure names the sample."""
        fn = self.fn
        if not callable(fn):  # cloudpickled for the workers
            import cloudpickle

            fn = self.fn = cloudpickle.loads(fn)
        td = self.dataset[rows].exclude("index")
        td.set_non_tensor(METADATA, self.metadata)
        try:
            out = fn(td)
        except Exception as exc:
            raise self._failure(rows, exc) from exc
        if not isinstance(out, TensorDictBase) or out.batch_size[:1] != torch.Size([len(rows)]):
            found = getattr(out, "batch_size", type(out).__name__)
            raise InvalidArgumentError(
                f"preprocess of {self.dataset.where}: fn returned {found} for the {len(rows)} "
                f"samples {int(rows[0])}..{int(rows[-1])} (first: sample {int(rows[0])}); "
                f"expected a TensorDict of batch size [{len(rows)}]. Keep the batch size in fn; "
                f"{redact(self.dest)} is not marked complete"
            )
        return _leaves(out)

    def _failure(self, rows: np.ndarray, exc: Exception) -> InvalidArgumentError:
        # which sample: fn again, one sample at a time
        bad = int(rows[0])
        for r in rows.tolist():
            td = self.dataset[np.array([r])].exclude("index")
            td.set_non_tensor(METADATA, self.metadata)
            try:
                self.fn(td)  # type: ignore[operator]
            except Exception:
                bad = r
                break
        return InvalidArgumentError(
            f"preprocess of {self.dataset.where}: fn fails on sample {bad} ({type(exc).__name__}: "
            f"{exc}); fix fn and run preprocess again with overwrite=True ({redact(self.dest)} "
            f"is not marked complete; its parts are kept only for the same fn, or when both "
            f"runs pass the same version=)"
        )

    def run(self, units: list[tuple[int, int, int]]) -> list[int]:
        store = open_zarr_store(self.dest, self.options, read_only=False)
        group = zarr.open_group(store, mode="r+")
        work = WorkDir(self.dest, self.options)
        done = []
        for unit, a, b in units:
            buffers: dict[tuple[str, ...], np.ndarray] = {}
            for lo in range(a, b, _BATCH):
                rows = np.arange(lo, min(lo + _BATCH, b), dtype=np.int64)
                for key, value in self.apply(rows).items():
                    if key not in buffers:
                        array = get_array(group, "/".join(key), self.dest)
                        buffers[key] = np.empty((b - a, *array.shape[1:]), dtype=array.dtype)
                    buffers[key][lo - a : lo - a + len(rows)] = value.numpy()
            for key, data in buffers.items():
                for_writing(get_array(group, "/".join(key), self.dest))[a:b] = data
            work.mark(f"unit-{unit}")
            done.append(unit)
        return done


def _run(task: _Task, units: list[tuple[int, int, int]]) -> list[int]:
    return task.run(units)


def _chunked(units: list[tuple[int, int, int]], per_task: int) -> Iterator[list[Any]]:
    for i in range(0, len(units), per_task):
        yield units[i : i + per_task]


def preprocess(
    dataset: AtariZarrDataset,
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
    metadata: Any = None,
    storage_options: dict[str, Any] | None = None,
    version: str | None = None,
    overwrite: bool = False,
) -> PreprocessedStorage:
    """Apply ``fn`` to every sample of ``dataset`` (or the first ``num_frames``) into ``dest``.

    The arguments are those of TorchRL's ``preprocess``, with the same meaning;
    ``generator``, ``index_with_generator`` and ``worker_threads`` are accepted and
    change nothing (the order samples are processed in does not show in ``dest``).

    ``dest`` never mixes the outputs of two functions: it records :func:`fn_fingerprint`
    of ``fn`` (or ``version``), and the rules of reuse, refusal and ``overwrite=True``
    are ``docs/torchrl.md``'s.

    Returns
    -------
    PreprocessedStorage
        A TorchRL storage of ``dest``, for a ``ReplayBuffer``.

    Raises
    ------
    InvalidArgumentError
        ``dim`` is not 0, ``num_frames`` is not a positive count, or ``fn`` fails or
        changes the batch size (naming the sample).
    StoreExistsError
        ``dest`` holds a complete preprocess of another source, output or ``fn``, or
        an unfinished one of another ``fn`` (without ``overwrite=True``).
    """
    where = dataset.where
    dest = os.fspath(dest)
    options = dict(storage_options or {})
    if dim != 0:
        raise InvalidArgumentError(
            f"preprocess of {where}: dim={dim} is not supported; samples are mapped along dim 0"
        )
    n = len(dataset)
    if num_frames is not None:
        n = min(n, whole_number(num_frames, "num_frames", f"preprocess of {where}"))
    del generator, index_with_generator, worker_threads  # accepted for TorchRL's signature
    fn_id = fn_fingerprint(fn, version)  # what made dest, as the caller passed it
    task = _Task(dataset, fn, dest, options, metadata)
    probe = task.apply(np.arange(1, dtype=np.int64))
    spec = {
        "/".join(key): [list(value.shape[1:]), str(value.numpy().dtype)]
        for key, value in probe.items()
    }
    fingerprint = hashlib.sha256(
        json.dumps(
            {
                "source": dataset.url,
                "plan": dataset.metadata.get("plan_digest"),
                "n": n,
                "spec": spec,
                "metadata": repr(metadata),
                "fn": fn_id,
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    group_meta = _preprocess_attrs(dest, options)
    if group_meta is not None and group_meta.get("complete") is True and not overwrite:
        if group_meta.get("fingerprint") == fingerprint:
            log.info("%s: already preprocessed; reading it", redact(dest))
            return PreprocessedStorage(dest, options)
        other = "fn" if group_meta.get("fn") not in (None, fn_id) else None
        raise StoreExistsError(
            f"{redact(dest)} holds a complete preprocess of another "
            f"{other or 'source or output'} ({group_meta.get('fn', 'no fn recorded')}; this "
            f"call is {fn_id}); pass overwrite=True to write it again, "
            f"or choose another dest"
        )
    begun_by = None if group_meta is None else group_meta.get("fn")
    if (
        group_meta is not None
        and group_meta.get("complete") is False
        and not overwrite
        and begun_by is not None
        and begun_by != fn_id
    ):
        raise StoreExistsError(
            f"{redact(dest)} was begun by another fn ({begun_by}; this call is "
            f"{fn_id}): the parts it holds would mix with this fn's "
            f"output. Pass overwrite=True to start it over with this fn, or run again the fn "
            f"that began it (or the same version=, which keeps its parts across an edit of fn)"
        )
    if group_meta is None and store_state(dest, options) != "absent":
        raise StoreExistsError(
            f"{redact(dest)} holds something that is not a preprocessed dataset; choose another "
            f"dest, or remove it"
        )
    work = WorkDir(dest, options)
    work.acquire(f"preprocess of {where} into {redact(dest)}")
    finished = False
    try:
        done: set[str] = set()
        if group_meta is not None and group_meta.get("fingerprint") == fingerprint:
            done = work.done() if work.plan_digest() == fingerprint else set()
        if not done:
            work.reset(fingerprint)
            _create(
                dest,
                options,
                probe,
                n,
                {
                    "complete": False,
                    "source": redact(dataset.url),
                    "num_frames": n,
                    "keys": [list(k) for k in probe],
                    "metadata": metadata,
                    "fingerprint": fingerprint,
                    "fn": fn_id,
                },
            )
        units = [
            (u, u * UNIT_ROWS, min((u + 1) * UNIT_ROWS, n))
            for u in range(-(-n // UNIT_ROWS))
            if f"unit-{u}" not in done
        ]
        per_task = 1
        if chunksize:
            per_task = max(1, -(-int(chunksize) // UNIT_ROWS))
        elif num_chunks:
            per_task = max(1, -(-len(units) // int(num_chunks)))
        tasks = list(_chunked(units, per_task))
        workers = cpu_count() if num_workers is None else int(num_workers)
        bar = progress_bar(len(units), f"preprocess {where}", unit="unit", enabled=pbar)
        try:
            if pool is not None:
                task.fn = _pickled(fn)
                for got in pool.imap_unordered(_run_star, [(task, t) for t in tasks]):
                    bar.update(len(got))
            elif workers <= 1 or len(tasks) <= 1:
                for t in tasks:
                    bar.update(len(task.run(t)))
            else:
                task.fn = _pickled(fn)
                context = mp.get_context(mp_start_method) if mp_start_method else None
                with ProcessPoolExecutor(
                    min(workers, len(tasks)),
                    mp_context=context,
                    max_tasks_per_child=max_tasks_per_child,
                    initializer=die_with_parent,
                    initargs=(os.getpid(),),
                ) as executor:
                    for fut in [executor.submit(_run, task, t) for t in tasks]:
                        bar.update(len(fut.result()))
        finally:
            bar.close()
        _mark_complete(dest, options)
        finished = True
    finally:
        work.release(remove_all=finished)
    return PreprocessedStorage(dest, options)


def die_with_parent(parent: int) -> None:
    """Make this worker process end when ``parent`` does, even by ``kill -9`` (Linux:
    the parent-death signal; elsewhere a no-op): a worker holds hundreds of MB."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)


def _run_star(args: tuple[_Task, list[tuple[int, int, int]]]) -> list[int]:
    return _run(*args)


def _pickled(fn: Any) -> bytes:
    """``fn`` for worker processes: cloudpickle takes lambdas and closures, as TorchRL's does."""
    import cloudpickle

    return cloudpickle.dumps(fn)


def _preprocess_attrs(dest: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The preprocess attribute of ``dest``, or None when there is none."""
    try:
        group = zarr.open_group(open_zarr_store(dest, options, read_only=True), mode="r")
    except (FileNotFoundError, ValueError):
        return None
    info = group.attrs.get(PREPROCESS_KEY)
    return info if isinstance(info, dict) else None


def _create(
    dest: str,
    options: dict[str, Any],
    probe: dict[tuple[str, ...], torch.Tensor],
    n: int,
    attrs: dict[str, Any],
) -> None:
    store = open_zarr_store(dest, options, read_only=False)
    group = zarr.open_group(store, mode="w", attributes={PREPROCESS_KEY: attrs})
    for key, value in probe.items():
        dtype = value.numpy().dtype
        row = tuple(value.shape[1:])
        frame_like = int(np.prod(row, dtype=np.int64)) * dtype.itemsize >= _FRAME_LIKE
        kwargs: dict[str, Any] = {}
        if frame_like:
            chunk_rows = 16
            kwargs["shards"] = {"shape": (UNIT_ROWS, *row), "index_location": "start"}
        else:
            chunk_rows = UNIT_ROWS
        group.create_array(
            "/".join(key),
            shape=(n, *row),
            dtype=dtype,
            chunks=(chunk_rows, *row),
            compressors=codecs_for(dtype.itemsize, frame=frame_like and dtype.itemsize == 1),
            fill_value=0,
            **kwargs,
        )


def _mark_complete(dest: str, options: dict[str, Any]) -> None:
    store = open_zarr_store(dest, options, read_only=False)
    group = zarr.open_group(store, mode="r+")
    info = dict(cast("dict[str, Any]", group.attrs[PREPROCESS_KEY]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        zarr.consolidate_metadata(group.store)
    group = zarr.open_group(store, mode="r+")
    info["complete"] = True
    group.attrs[PREPROCESS_KEY] = info
