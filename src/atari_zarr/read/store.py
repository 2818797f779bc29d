"""An opened store, as every reader sees it: :class:`StoreReader`.

Random access, the epoch stream and windows all read a store through one
:class:`StoreReader`. It opens the store (format, completion, arrays) and holds the
frames (:class:`~atari_zarr.read.chunks.ChunkReader` on the
:class:`~atari_zarr.storage.engine.ChunkEngine`), the lazily loaded per-step columns
(:mod:`atari_zarr.read.columns`), the per-episode table, the return-to-go of every
row (per episode, on first use), and :meth:`StoreReader.read_items`: a TED batch of
items read with one frame fetch, built by :mod:`atari_zarr.read.batch`.

It imports nothing above it: the dataset, the stream and windows build on it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from tensordict import TensorDict
from zarr.core.metadata.v3 import ArrayV3Metadata

from atari_zarr.catalog import CATALOG, CatalogEntry, check_entry, content_id
from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.commands import store_remedy
from atari_zarr.episodes import EpisodeTable, episode_table, return_to_go
from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    RemoteAccessError,
    StoreChangedError,
    StoreCorruptError,
    StoreFormatError,
    StoreIncompleteError,
    StoreNotFoundError,
)
from atari_zarr.forks import after_fork
from atari_zarr.layout import (
    ACTION,
    ACTION_FULL,
    EPISODE,
    FINAL_OBSERVATION,
    FLUSHED_KEY,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
    get_array,
    has_member,
    is_complete,
    read_metadata,
)
from atari_zarr.opening import changed_or_damaged, open_store
from atari_zarr.place import current_place, quiet_worker_exit
from atari_zarr.read.batch import FrameBuffer, FramePlan, assemble_batch, steps_before_by_store
from atari_zarr.read.chunks import ChunkReader, ReaderSet, read_rows_of
from atari_zarr.read.columns import StepColumn, open_step_columns
from atari_zarr.read.episode_index import EpisodeIndex
from atari_zarr.read.options import ReadOptions
from atari_zarr.read.pool import BufferPool
from atari_zarr.read.step_axis import StepAxis
from atari_zarr.storage.engine import DEFAULT_REMEDY
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.paths import is_url, redact

__all__ = ["StoreReader", "plan_items", "read_items"]

log = logging.getLogger("atari_zarr")


class StoreReader:
    """One opened store: frames, per-step columns, episodes, and TED items read from them.

    Parameters
    ----------
    path_or_url : str
        A store written by ``atari-zarr convert`` or ``collect``.
    storage_options : dict, optional
        fsspec options.
    cache : path, optional
        Local directory keeping every byte range fetched from a remote store.
    partial : bool
        Open an unfinished recording: its flushed whole episodes only.
    full_action_space : bool
        ``action`` is ALE's 18-action id (the store's ``action_full`` array) instead of
        the index into the game's minimal action set.
    options : ReadOptions, optional
        How the store is read (:class:`~atari_zarr.read.options.ReadOptions`: the
        request deadline, the decoded-chunk and encoded-byte bounds, coalescing);
        kept when the store is opened again in another process.
    entry : CatalogEntry, optional
        Its entry in its root's ``catalog.json``: the store is then known by it (game,
        run, length) and opened on first need (:meth:`open`), so a mixture of a
        catalogued root opens with the catalog's one request. A store that changed
        since warns when it opens; one gone, or changed in length, stops with an error.

    Raises
    ------
    StoreNotFoundError, StoreIncompleteError, StoreFormatError, StoreCorruptError
        As :class:`~atari_zarr.AtariZarrDataset` documents.

    Examples
    --------
    >>> # store_url: a converted Pong/1 fixture store (shared by the examples)
    >>> store = StoreReader(store_url)
    >>> len(store), len(store.episodes) == store.metadata["counts"]["episodes"]
    (300, True)
    >>> td = store.read_items(np.array([0, 9]), length=3, stack=4)
    >>> td.batch_size, td["observation"].shape
    (torch.Size([2, 3]), torch.Size([2, 3, 4, 84, 84]))
    """

    def __init__(
        self,
        path_or_url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        cache: str | os.PathLike[str] | None = None,
        partial: bool = False,
        full_action_space: bool = False,
        options: ReadOptions | None = None,
        entry: CatalogEntry | None = None,
    ) -> None:
        #: How this store is read (kept when it is opened again in another process).
        self.options = options or ReadOptions()
        self.url = str(path_or_url)
        self.storage_options = dict(storage_options or {})
        self.cache = None if cache is None else os.fspath(cache)
        self.timeout: float | None = self.options.timeout  # type: ignore[assignment]
        self.partial = bool(partial)
        self.full_action_space = bool(full_action_space)
        #: The store's URL for messages, credentials removed.
        self.where = redact(self.url)
        #: Its root's catalog entry, when it was known by it (then opened on first need).
        self.entry = entry
        self._rows: tuple[int, int, bool] | None = None  # the frames' cut, from zarr.json
        self._open_lock = threading.Lock()
        after_fork(self._renew_locks)
        #: True once the store is opened: at once, or, known by its entry, on first need.
        self.opened = False
        self._content: str | None = None  # its content id, once opened
        if entry is None:
            self._open()
        else:
            self.n = int(entry["transitions"])  # type: ignore[arg-type]

    def _renew_locks(self) -> None:
        """In a forked child: a lock a reading thread of the parent held stays held."""
        self._open_lock = threading.Lock()
        if self.opened:
            self._lock = threading.Lock()

    def open(self) -> StoreReader:
        """This store, opened: at the first call when it is known by its catalog entry
        (then checked against the entry, and against the cut a stream made of it)."""
        with self._open_lock:
            if not self.opened:
                self._open_entry()
        return self

    def _open_entry(self) -> None:
        entry, n = self.entry, self.n
        assert entry is not None
        listed = f"listed in its root's {CATALOG}"
        root = self.where.rstrip("/").rsplit("/", 2)[0]
        again = f"run `atari-zarr index {root}` again and open the root again"
        try:
            self._open()
        except (StoreNotFoundError, StoreIncompleteError) as exc:
            raise type(exc)(
                f"{self.where}, {listed}, is no longer a complete store ({exc}); {again}."
            ) from exc
        check_entry(entry, self.metadata, self.url)
        # what the catalog claims is checked, whatever its content id says (an entry
        # edited by hand keeps it): the mixture numbered its items by these
        if self.n != n or self.game not in (None, entry["game"]):
            raise StoreFormatError(
                f"{self.where} holds {self.n:,} transitions of {self.game}, but the "
                f"{n:,} of {entry['game']} {listed} numbered this dataset's items; {again}."
            )
        if self._rows is not None and self._frame_rows() != self._rows:
            (chunk, shard, _), (was_chunk, was_shard, _) = self._frame_rows(), self._rows
            raise StoreFormatError(
                f"{self.where} now has frame shards of {shard} rows in chunks of {chunk}, "
                f"but a stream cut its units along the {was_shard}-row shards of {was_chunk} "
                f"it had; {again}, and make the stream again."
            )

    def _open(self) -> None:
        # A remote store rebuilds its file system after a fork (remote.RemoteStore), so
        # a forked DataLoader worker never shares the parent's sockets or event loop.
        group, meta = open_store(
            self.url,
            self.storage_options,
            timeout=self.timeout,
            cache=self.cache,
            require_complete=not self.partial,
        )
        n = None  # rows to use: all of a complete store, the flushed prefix of a recording
        if not is_complete(meta):
            if not isinstance(meta.get(FLUSHED_KEY), dict):
                read_metadata(group, self.url)  # raises the usual StoreIncompleteError
            n = int(meta[FLUSHED_KEY]["transitions"])
        self.metadata: dict[str, Any] = meta
        self._content = content_id(meta)
        self.group = group
        self.remedy = store_remedy(meta, self.url) or DEFAULT_REMEDY
        self.observation = get_array(group, OBSERVATION, self.url)
        self.n = int(self.observation.shape[0]) if n is None else n
        #: Frame after each episode's last row, where the writer kept it.
        self.final_observation = (
            get_array(group, FINAL_OBSERVATION, self.url)
            if has_member(group, FINAL_OBSERVATION)
            else None
        )
        self._finals = (
            None
            if self.final_observation is None
            else ChunkReader(
                self.final_observation,
                where=self.where,
                cache_bytes=8 << 20,
                threads=1,
                decode_ahead=False,
                remedy=self.remedy,
                # a cache of its own: a mixture's shared cache is its frames' budget
                options=self.options.replace(budget=None),
            )
        )
        self.frames = ChunkReader(
            self.observation,
            where=self.where,
            remedy=self.remedy,
            options=self.options,
            cache_bytes=self._frame_cache_bytes,
        )
        #: The frame array's engine, shared by every reader of this store.
        self.engine = self.frames.engine
        # Per-step columns load lazily (``column[rows] -> ndarray``): opening a
        # 50M-transition store must not read ~1 GB of per-step data.
        steps = open_step_columns(
            group, meta, self.url, n=self.n, remedy=self.remedy, options=self.options
        )
        if self.full_action_space:
            if not has_member(group, ACTION_FULL):
                raise InvalidArgumentError(
                    f"{self.where} has no {ACTION_FULL!r} array, so its actions cannot be given "
                    f"as ALE's 18 actions: expected a store converted with --full-action-space. "
                    f"Convert it again with --full-action-space, or read it without "
                    f"full_action_space."
                )
            steps[ACTION] = StepColumn(
                get_array(group, ACTION_FULL, self.url),
                where=self.where,
                remedy=self.remedy,
                options=self.options,
            )
        self.columns = steps
        columns = (getattr(c, "reader", None) for c in steps.values())
        #: Every chunk reader of the store: its frames, final frames and columns.
        self.readers = [r for r in (self.frames, self._finals, *columns) if r is not None]
        if is_complete(meta):
            # every chunk of a complete store was written: a missing one is damage, and
            # damage found while reading may mean the store was replaced meanwhile
            for reader in self.readers:
                reader.engine.guard(self._damage_or_change)
        self.action = steps[ACTION]
        self.reward = steps[REWARD]
        self.terminated = steps[TERMINATED]
        self.truncated = steps[TRUNCATED]
        self.episode = steps[EPISODE]
        self.done = steps["done"]
        #: Episode ids and ends come from the episode table (not per-step arrays).
        self.episodes_in_table = not isinstance(self.episode, StepColumn)
        self._episodes: EpisodeTable | None = None
        self._rtg: np.ndarray | None = None
        self._rtg_ready: np.ndarray | None = None
        self._lock = threading.Lock()
        #: Memory for the frames of batches, reused once no batch refers to it.
        self.pool = BufferPool()
        self.opened = True

    def __len__(self) -> int:
        return self.n

    @property
    def game(self) -> str | None:
        """The store's game, or None where it does not say (its entry's, not opened)."""
        return self.metadata.get("game") if self.opened else self.entry["game"]  # type: ignore[index]

    @property
    def run(self) -> str | None:
        """The store's run, or None where it does not say (its entry's, not opened)."""
        return self.metadata.get("run") if self.opened else self.entry["run"]  # type: ignore[index]

    @property
    def content(self) -> str | None:
        """Which store this is: the content id of its attributes (its entry's, not opened)."""
        return self._content if self.opened else self.entry.get("content")  # type: ignore[union-attr]

    @property
    def remote(self) -> bool:
        """True when the store is reached over a network."""
        return is_url(self.url)

    def frame_rows(self) -> tuple[int, int, bool]:
        """How the frames' rows are cut: ``(chunk_rows, shard_rows, fast)``, ``fast``
        when the engine reads them (else zarr's chunks, in shards of about 4096 rows).

        A store not opened yet tells from its ``zarr.json`` alone (one request, no
        array opened), and is checked against it when it opens."""
        with self._open_lock:
            if not self.opened and self._rows is None:
                self._rows = self._peek()
            if not self.opened and self._rows is not None:
                return self._rows
        return self.open()._frame_rows()

    def _peek(self) -> tuple[int, int, bool] | None:
        """The frames' chunking as the consolidated metadata says (None: not known so)."""
        try:
            fs, path = get_fs(self.url, self.storage_options, timeout=self.timeout)
            doc = json.loads(fs.cat_metadata(f"{path.rstrip('/')}/zarr.json"))
            frames = doc["consolidated_metadata"]["metadata"][OBSERVATION]
            chain = row_chunks(ArrayV3Metadata.from_dict(frames))
        except RemoteAccessError:
            raise  # a server that fails (or stalls) fails once, within its timeout
        except (OSError, ValueError, KeyError, TypeError, UnsupportedChunks, AtariZarrError):
            return None  # opening the store tells, or says what is wrong
        if chain.shard_rows is None:
            return None
        return chain.chunk_rows, chain.shard_rows, True

    def _frame_rows(self) -> tuple[int, int, bool]:
        grid = self.engine.grid
        if grid is not None and grid.shard_rows is not None:
            return grid.chunk_rows, grid.shard_rows, True
        chunks = int(self.observation.chunks[0])
        return chunks, max(chunks, -(-4096 // chunks) * chunks), False

    def _frame_cache_bytes(self) -> int:
        """The decoded-frame bound of this process: a share of memory is divided among
        the DataLoader workers that read the dataset (asked again in each of them)."""
        return self.options.frame_cache_limit(current_place().workers)

    def __getstate__(self) -> dict[str, Any]:
        # file-system handles, locks and memory maps never cross processes: the store is
        # opened again by its URL (a DataLoader worker, spawned or forked)
        keep = ("storage_options", "cache", "partial", "full_action_space", "options", "entry")
        state = {"path_or_url": self.url, **{k: getattr(self, k) for k in keep}}
        # which store this is: a process that opens it again must find the same one (one
        # known by its entry stays unopened, and is checked against its entry when opened)
        return {**state, "content": self._content, "rows": self._rows}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        content, rows = state.pop("content", None), state.pop("rows", None)
        self.__init__(state.pop("path_or_url"), **state)  # type: ignore[misc]
        self._rows = rows
        # opened where it was pickled: opened here too, and the same store
        if content is not None and self.open()._content != content:
            raise StoreChangedError(
                f"{self.where} was replaced since this dataset was opened in the process that "
                f"handed it here (content {content}, now {self._content}): that "
                f"process reads the store as it was, this one would read another. Open the "
                f"dataset again (and make its DataLoader again) once the store is written."
            )

    # -- episodes ---------------------------------------------------------------------
    @property
    def episodes(self) -> EpisodeTable:
        """The per-episode table (lengths, end kinds, returns; first and last rows)."""
        if self._episodes is None:
            table = episode_table(self.metadata, self.n)
            if table is None:  # an unfinished recording: from the per-step arrays
                table = EpisodeTable.from_steps(
                    self.episode.to_numpy(), self.terminated.to_numpy(), self.reward.to_numpy()
                )
            self._episodes = table
        return self._episodes

    def first_row(self, rows: np.ndarray) -> np.ndarray:
        """First row of the episode of each of ``rows``."""
        return self.episodes.starts[self.episode[rows]]  # type: ignore[no-any-return]

    def steps_before(self, episodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Steps played before each episode's first stored row, and its fragment flag.

        0 for a whole episode; for a fragment the steps its source says were played
        before it (0 where the source does not tell: its ``timestep`` then counts from
        its first stored row, and the flag says so).
        """
        first = self.episodes.first_step
        if first is None:
            return np.zeros(len(episodes), np.int64), np.zeros(len(episodes), bool)
        f = first[np.asarray(episodes, dtype=np.int64)]
        return np.maximum(f, 0), f != 0

    def return_to_go(self, rows: np.ndarray) -> np.ndarray:
        """``(len(rows),)`` float32: the sum of ``next/reward`` from each row to its episode's end.

        Computed for a whole episode the first time one of its rows is asked for
        (:func:`atari_zarr.episodes.return_to_go`, the definition the converter's
        ``--return-to-go`` array uses) and kept.
        """
        rows = np.asarray(rows, dtype=np.int64)
        table = self.episodes
        if self._rtg is None:
            # untouched pages cost no memory: this grows with the episodes read
            self._rtg = np.empty(self.n, dtype=np.float32)
            self._rtg_ready = np.zeros(len(table), dtype=bool)
        assert self._rtg_ready is not None
        eps = self.episode[rows] if rows.size else np.zeros(0, dtype=np.int64)
        todo = np.unique(eps[~self._rtg_ready[eps]])
        if todo.size:
            with self._lock:
                for e in todo.tolist():
                    if self._rtg_ready[e]:
                        continue
                    a, b = int(table.starts[e]), int(table.ends[e]) + 1
                    done = np.zeros(b - a, dtype=bool)
                    done[-1] = True
                    rew = self.reward[np.arange(a, b)]
                    self._rtg[a:b] = return_to_go(rew, done).astype(np.float32)
                    self._rtg_ready[e] = True
        return self._rtg[rows]

    def close(self) -> None:
        """Stop this store's reading threads and drop its decoded chunks (it reads again
        when asked, starting anew)."""
        for reader in self.readers if self.opened else ():
            reader.close()

    def final_frames(self, episodes: np.ndarray) -> np.ndarray:
        """The frames after the last rows of ``episodes`` (``final_observation``)."""
        assert self._finals is not None
        return self._finals.read(np.asarray(episodes, dtype=np.int64))

    def _damage_or_change(self, err: StoreCorruptError) -> Exception:
        """``err``, or the error saying the store was replaced while it was read."""
        return changed_or_damaged(
            err, self.url, self.storage_options, self.metadata, timeout=self.timeout
        )

    # -- items ----------------------------------------------------------------------
    def read_items(self, starts: np.ndarray, **how: Any) -> TensorDict:
        """A TED batch of items of this store starting at rows ``starts``: the module's
        :func:`read_items` (``length``, ``stack``, ``real``, ``windowed``) for one store."""
        starts = np.asarray(starts, dtype=np.int64)
        return read_items([self], np.zeros(len(starts), dtype=np.int64), starts, **how)

    def step_values(
        self, rows: np.ndarray, window: bool, names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The per-step values of ``rows`` that ``assemble_batch`` takes
        (:func:`~atari_zarr.read.batch.step_fields`); only ``names`` of them where given
        (of ``action``, ``reward`` and ``return_to_go``: what a mixture's
        :class:`~atari_zarr.read.episode_index.EpisodeIndex` does not give)."""
        if names is not None:
            columns = {"action": self.action, "reward": self.reward}
            return {
                name: self.return_to_go(rows) if name == "return_to_go" else columns[name][rows]
                for name in names
            }
        values = {
            "action": self.action[rows],
            "reward": self.reward[rows],
            "terminated": self.terminated[rows],
            "truncated": self.truncated[rows],
            "episode": self.episode[rows],
        }
        values["first"] = self.episodes.starts[values["episode"]]
        if window:
            values["return_to_go"] = self.return_to_go(rows)
        return values

    def finals_of(
        self, plan: FramePlan, sel: Any = slice(None)
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The kept frame after an episode's end, where an item's last real row ends one:
        ``(items, frames)``, items numbered among ``plan``'s items ``sel`` (this store's)."""
        done = plan.last_done[sel]
        if self.final_observation is None or not done.any():
            return None
        items = np.flatnonzero(done)
        last = plan.starts[sel][items] + plan.real[sel][items] - 1
        return items, self.final_frames(self.episode[last])


def plan_items(
    stores: Sequence[StoreReader],
    which: np.ndarray,
    starts: np.ndarray,
    *,
    length: int = 1,
    stack: int = 1,
    real: np.ndarray | None = None,
    index: EpisodeIndex | None = None,
) -> tuple[FramePlan, dict[int, Any]]:
    """The frames of items of any of ``stores``: the one
    :class:`~atari_zarr.read.batch.FramePlan` of random access, each store's inputs
    from its own episode table and columns, and the items of each store touched (a
    slice of all of them where one store is).

    Parameters
    ----------
    stores : sequence of StoreReader
    which : numpy.ndarray
        ``(B,)`` the store of each item.
    starts : numpy.ndarray
        ``(B,)`` first row of each item, in its store.
    length : int
        Rows per item: 1 gives transitions (batch ``[B]``), more gives windows
        (batch ``[B, length]``, with ``return_to_go``, ``timestep`` and ``mask``).
    stack : int
        Frames per observation.
    real : numpy.ndarray, optional
        ``(B,)`` rows of each item that exist (a padded window); default all.
    index : EpisodeIndex, optional
        The episodes of ``stores`` on one axis
        (:class:`~atari_zarr.read.episode_index.EpisodeIndex`): items of several
        stores are then planned with one lookup, not one per store touched.
    """
    which = np.asarray(which, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    b = len(starts)
    n_real = np.full(b, length, dtype=np.int64) if real is None else np.asarray(real, np.int64)
    sel_of = items_of(which)
    groups = list(sel_of)
    one = len(groups) == 1
    n_rows: Any
    if not one and _indexed(stores, groups, index):
        assert index is not None
        got = index.lookup(which, starts)
        first = got.first
        whole = length == 1 and real is None  # an item's last row is its first
        last_done = got.done if whole else index.lookup(which, starts + n_real - 1).done
        n_rows = index.lengths[which]
    else:
        first = np.empty(b, dtype=np.int64)
        last_done = np.empty(b, dtype=bool)
        # only the stores this batch touches: a mixture of hundreds pays for those alone
        n_rows = np.empty(b, dtype=np.int64)
        for g, sel in sel_of.items():
            first[sel] = stores[g].first_row(starts[sel])
            last_done[sel] = stores[g].done[starts[sel] + n_real[sel] - 1]
            n_rows[sel] = len(stores[g])
        if one:
            n_rows = len(stores[groups[0]])
    plan = FramePlan(
        starts=starts,
        length=length,
        stack=stack,
        first=first,
        last_done=last_done,
        n_rows=n_rows,
        valid=real,
    )
    return plan, sel_of


def items_of(which: np.ndarray) -> dict[int, Any]:
    """The items of each store ``which`` names: ``{store: items}``, stores in order,
    the items a slice of all where there is one store, else their positions (found
    with one sort, not one comparison per store).

    Examples
    --------
    >>> {g: s.tolist() for g, s in items_of(np.array([2, 0, 2, 1])).items()}
    {0: [1], 1: [3], 2: [0, 2]}
    >>> items_of(np.array([4, 4]))
    {4: slice(None, None, None)}
    """
    which = np.asarray(which, dtype=np.int64)
    if which.size == 0:
        return {0: slice(None)}
    groups, counts = np.unique(which, return_counts=True)
    if len(groups) == 1:
        return {int(groups[0]): slice(None)}
    order = np.argsort(which, kind="stable")
    ends = np.cumsum(counts).tolist()
    # slices of one array, not np.split: a mixture's batch has one part per store touched
    return {
        g: order[e - c : e] for g, c, e in zip(groups.tolist(), counts.tolist(), ends, strict=True)
    }


def _indexed(stores: Sequence[StoreReader], groups: list[int], index: Any) -> bool:
    """True when ``index`` answers for every store of ``groups`` (opened): each of them
    takes its episodes from its table (not from per-step arrays)."""
    return index is not None and bool(index.answers(groups))


def read_items(
    stores: Sequence[StoreReader],
    which: np.ndarray,
    starts: np.ndarray,
    *,
    windowed: bool | None = None,
    index: EpisodeIndex | None = None,
    axis: StepAxis | None = None,
    frames: ReaderSet | None = None,
    **how: Any,
) -> TensorDict:
    """One TED batch of items of any of ``stores``: ``length`` consecutive rows of one
    episode from row ``starts[i]`` of store ``which[i]``.

    Random access to one store or a mixture: each store touched reads its frames (one
    call of its frame reader) and per-step values, and the batch is assembled once, so
    a batch's cost beyond its frames is a few array operations per store touched.
    ``length``, ``stack`` and ``real`` are :func:`plan_items`'s; ``windowed`` gives
    the window layout even for ``length == 1`` (default: ``length > 1``). With the
    stores' ``index`` (:class:`~atari_zarr.read.episode_index.EpisodeIndex`), a batch
    of several stores takes its episode values with one lookup for all of them; with
    their ``axis`` (:class:`~atari_zarr.read.step_axis.StepAxis`) its actions and
    rewards with one gather, else store by store. With their ``frames``
    (:class:`~atari_zarr.read.chunks.ReaderSet` of their frame readers), what the
    gather of frames asks of each store is kept between batches.
    """
    quiet_worker_exit()  # in a DataLoader worker: a quiet exit when broken out of
    which = np.asarray(which, dtype=np.int64)
    plan, sel_of = plan_items(stores, which, starts, index=index, **how)
    starts, b, length, stack = plan.starts, len(plan.starts), plan.length, plan.stack
    groups = list(sel_of)
    one, g0 = len(groups) == 1, groups[0]
    buffer = FrameBuffer(stores[g0].pool, b, length, stack, tuple(stores[g0].observation.shape[1:]))
    # positions that are padding read a row that exists and are zeroed after
    rows = np.where(plan.valid, plan.rows, 0)
    if one:  # every frame in one call, straight into the batch's buffer
        stores[g0].frames.read(buffer.flat(rows), out=buffer.frames)
    else:  # every frame in one gather where the stores share a cache
        each = np.broadcast_to(which[:, None], rows.shape)
        readers: ReaderSet | list[Any] | None = frames
        if readers is None:  # taken for this batch alone
            readers = [None] * len(stores)
            for g in groups:  # the stores touched (opened)
                readers[g] = stores[g].frames
        read_rows_of(readers, buffer.flat(each), buffer.flat(rows), buffer.frames)
    offsets = np.arange(length, dtype=np.int64)[None, :]
    safe = starts[:, None] + offsets
    if plan.padded:
        safe = np.where(offsets < plan.real[:, None], safe, starts[:, None])
    window = length > 1 if windowed is None else windowed
    if not one and _indexed(stores, groups, index):
        assert index is not None
        steps = _indexed_steps(stores, index, axis, which, safe, sel_of, window)
    else:
        parts = {g: stores[g].step_values(safe[sel_of[g]].ravel(), window) for g in groups}
        steps = {name: _joined(parts, name, sel_of, b, length) for name in parts[g0]}
    # the kept final frames, of the stores whose items end an episode
    ending = groups if one else np.unique(which[plan.last_done]).tolist()
    finals = [(sel_of[g], stores[g].finals_of(plan, sel_of[g])) for g in ending]
    kept = [(sel, f) for sel, f in finals if f is not None]
    final = None
    if kept:
        idx = [np.arange(b)[sel][f[0]] for sel, f in kept]
        final = (np.concatenate(idx), np.concatenate([f[1] for _, f in kept]))
    return assemble_batch(
        plan,
        buffer,
        steps,
        window=window,
        # asked of the stores only where the batch's windows count their steps
        steps_before=(
            stores[g0].steps_before if one else functools.partial(_steps_before, stores, which)
        ),
        finals=final,
    )


def _steps_before(
    stores: Sequence[StoreReader], which: np.ndarray, episodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`StoreReader.steps_before` of ``episodes``, those of item ``i`` asked of
    store ``which[i]``."""
    each = {g: stores[g].steps_before for g in np.unique(which).tolist()}
    return steps_before_by_store(each, which)(episodes)  # type: ignore[no-any-return]


def _joined(
    parts: dict[int, dict[str, np.ndarray]], name: str, sel_of: dict[int, Any], b: int, length: int
) -> np.ndarray:
    """Value ``name`` of every item, from each store's ``parts`` for its items ``sel_of``."""
    groups = list(sel_of)
    if len(groups) == 1:
        return parts[groups[0]][name]
    order = np.concatenate([sel_of[g] for g in groups])
    values = np.concatenate([parts[g][name] for g in groups])
    out = np.empty((b, length), dtype=values.dtype)
    out[order] = values.reshape(-1, length)
    return out.ravel()


def _indexed_steps(
    stores: Sequence[StoreReader],
    index: EpisodeIndex,
    axis: StepAxis | None,
    which: np.ndarray,
    safe: np.ndarray,
    sel_of: dict[int, Any],
    window: bool,
) -> dict[str, np.ndarray]:
    """The per-step values of rows ``safe`` (``(B, length)``) of stores ``which``:
    the episode values from ``index`` at once, actions and rewards from ``axis`` at once
    where every store touched is on it, else store by store, as ``return_to_go``."""
    b, length = safe.shape
    each = np.repeat(which, length)
    got = index.lookup(each, safe.ravel())
    # actions and rewards in one gather where every store touched is on the axis
    steps = (axis.values(each, safe.ravel(), ["action", "reward"]) if axis else None) or {}
    per_store = [
        *(["action", "reward"] if not steps else []),
        *(["return_to_go"] if window else []),
    ]
    if per_store:
        parts = {
            g: stores[g].step_values(safe[sel].ravel(), window, per_store)
            for g, sel in sel_of.items()
        }
        steps.update({name: _joined(parts, name, sel_of, b, length) for name in per_store})
    steps.update(
        terminated=got.terminated, truncated=got.truncated, episode=got.episode, first=got.first
    )
    return steps
