"""Read a store back as TorchRL TED transitions: :class:`AtariZarrDataset`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import zarr
from tensordict import TensorDict

from atari_zarr.episodes import episode_table
from atari_zarr.errors import InvalidArgumentError, StoreNotFoundError
from atari_zarr.layout import (
    ACTION,
    EPISODE,
    FINAL_OBSERVATION,
    FLUSHED_KEY,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
    get_array,
    read_metadata,
)
from atari_zarr.read.ahead import batches_ahead, check_prefetch
from atari_zarr.read.chunks import ChunkReader
from atari_zarr.read.columns import open_step_columns
from atari_zarr.read.indexing import normalize_index
from atari_zarr.storage.deadline import default_timeout
from atari_zarr.storage.paths import is_url, redact
from atari_zarr.storage.remote import open_zarr_store

if TYPE_CHECKING:
    from atari_zarr.read.stream import AtariZarrStream

__all__ = ["AtariZarrDataset", "collate_batch", "stacked_rows"]

log = logging.getLogger("atari_zarr")


class AtariZarrDataset(torch.utils.data.Dataset):
    """Random access to one store, item by item or in batches, in TorchRL's TED layout.

    Row ``i`` is the transition ``(o_i, a_i, r_i, o_{i+1})``. Items are
    :class:`tensordict.TensorDict` objects with::

        observation           [B, 84, 84] uint8
        action                [B] int64
        episode, index        [B] int64
        done, terminated, truncated   [B, 1] bool (False: stored states are not final)
        next/observation      [B, 84, 84] uint8 (after a terminated or truncated row: the
                              episode's final frame where the store keeps it (recorded
                              stores), zeros otherwise (DQN Replay, as TorchRL does))
        next/reward           [B, 1] float32
        next/terminated, next/truncated, next/done   [B, 1] bool

    With ``frame_stack=k`` (k > 1) ``observation`` and ``next/observation`` are
    ``[B, k, 84, 84]``: the k most recent frames of the same episode, oldest first,
    zero-padded at an episode start as dopamine stacks them. The stack after a
    terminated or truncated row ends with the zero frame (the frame DQN Replay never
    stored).

    It is a map-style :class:`torch.utils.data.Dataset` with a batched
    ``__getitems__``: ``DataLoader(ds, batch_size=B, collate_fn=collate_batch)``
    reads each batch with one frame fetch, and workers (``fork`` or ``spawn``)
    re-open the store from its URL.

    Parameters
    ----------
    path_or_url : str
        A store written by ``atari-zarr convert`` (``.../Pong/1.zarr``), local path or
        fsspec URL.
    storage_options : dict, optional
        fsspec options, e.g. ``{"token": "anon"}``.
    cache : path, optional
        Local directory that keeps every chunk (byte range) fetched from a remote
        store, so the next epoch reads it locally. Shared safely by worker processes.
    timeout : float or None, optional
        Seconds each request to a remote store may take, retries included
        (default 60, or ``$ATARI_ZARR_TIMEOUT``); ``None`` for no limit. A read
        that runs out raises :class:`~atari_zarr.errors.RemoteTimeoutError`.
    frame_stack : int
        Number of frames per observation (1: single ``[84, 84]`` frames).
    partial : bool
        Open an unfinished recording (``ZarrCollector`` stopped before ``close()``):
        its flushed whole episodes only. Complete stores open as usual.

    Raises
    ------
    StoreNotFoundError
        If nothing is at ``path_or_url``.
    StoreIncompleteError
        If the store's writer has not finished (and ``partial`` does not apply): the
        message names the command that finishes it.
    StoreFormatError
        If the location is not an atari_zarr store this version can read.
    StoreCorruptError
        If a store marked complete has lost arrays (or, from ``__getitem__``, bytes).
    RemoteAccessError, RemoteTimeoutError
        If the remote store cannot be read (also later, from ``__getitem__``).

    Examples
    --------
    >>> # store_url: a store made by `atari-zarr convert` (here a small Pong/1 fixture run)
    >>> ds = AtariZarrDataset(store_url)
    >>> batch = ds[[0, 1, 2]]
    >>> batch["observation"].shape, batch["next", "reward"].shape
    (torch.Size([3, 84, 84]), torch.Size([3, 1]))
    >>> ds.sample(8, generator=torch.Generator().manual_seed(0)).batch_size
    torch.Size([8])
    >>> AtariZarrDataset(store_url, frame_stack=4)[[0, 1]]["next", "observation"].shape
    torch.Size([2, 4, 84, 84])
    """

    #: Bound on decoded frame chunks kept between batches, per dataset (and per worker).
    frame_cache_bytes: int = 128 << 20

    def __init__(
        self,
        path_or_url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        cache: str | os.PathLike[str] | None = None,
        timeout: float | str | None = "default",
        frame_stack: int = 1,
        partial: bool = False,
    ) -> None:
        self.url = str(path_or_url)
        self.storage_options = dict(storage_options or {})
        self.cache = None if cache is None else os.fspath(cache)
        self.timeout = default_timeout() if timeout == "default" else timeout
        if isinstance(frame_stack, bool) or not isinstance(frame_stack, int) or frame_stack < 1:
            raise InvalidArgumentError(
                f"frame_stack must be a positive integer (frames per observation); "
                f"got {frame_stack!r} for {self.url}"
            )
        self.frame_stack = frame_stack
        self.partial = bool(partial)
        self._open()

    # -- opening, and re-opening in worker processes ---------------------------------
    def _open(self) -> None:
        # A remote store rebuilds its file system after a fork (remote.RemoteStore), so
        # a forked DataLoader worker never shares the parent's sockets or event loop.
        store = open_zarr_store(
            self.url, self.storage_options, read_only=True, timeout=self.timeout, cache=self.cache
        )
        try:
            # zarr_format=3: no probes for v2 keys; the root zarr.json carries the
            # consolidated metadata, so opening costs one request plus the step arrays.
            group = zarr.open_group(store, mode="r", zarr_format=3)
        except FileNotFoundError as exc:
            raise StoreNotFoundError(
                f"{redact(self.url)} is not a Zarr store: expected a directory or URL written "
                f"by `atari-zarr convert` (e.g. DEST/Pong/1.zarr). Check the path."
            ) from None if is_url(self.url) else exc
        meta = read_metadata(group, self.url, require_complete=not self.partial)
        n = None  # rows to use: all of a complete store, the flushed prefix of a recording
        if not meta.get("complete"):
            if not isinstance(meta.get(FLUSHED_KEY), dict):
                read_metadata(group, self.url)  # raises the usual StoreIncompleteError
            n = int(meta[FLUSHED_KEY]["transitions"])
        self.metadata: dict[str, Any] = meta
        #: The store's URL for messages, credentials removed.
        self.where = redact(self.url)
        self._group = group
        self._obs = get_array(group, OBSERVATION, self.url)
        # rows in use: all of a complete store, the flushed prefix of a recording
        self._n = int(self._obs.shape[0]) if n is None else n
        # Frame after each episode's last row, where the writer kept it (collector).
        self._final_obs = (
            get_array(group, FINAL_OBSERVATION, self.url) if FINAL_OBSERVATION in group else None
        )
        remedy = _remedy(meta)
        self._frames = ChunkReader(
            self._obs, where=self.url, cache_bytes=self.frame_cache_bytes, remedy=remedy
        )
        # Per-step columns load lazily (``column[rows] -> ndarray``): opening a
        # 50M-transition store must not read ~1 GB of per-step data.
        steps = open_step_columns(group, self.metadata, self.url, n=self._n, remedy=remedy)
        self._action = steps[ACTION]
        self._episode = steps[EPISODE]
        self._reward = steps[REWARD]
        self._terminated = steps[TERMINATED]
        self._truncated = steps[TRUNCATED]
        self._done = steps["done"]
        self._first_rows: np.ndarray | None = None  # first row of each episode, on demand

    def __getstate__(self) -> dict[str, Any]:
        # zarr stores hold file-system handles and event loops that must not cross a fork.
        return {
            "url": self.url,
            "storage_options": self.storage_options,
            "cache": self.cache,
            "timeout": self.timeout,
            "frame_stack": self.frame_stack,
            "partial": self.partial,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url = state["url"]
        self.storage_options = state["storage_options"]
        self.cache = state.get("cache")
        self.timeout = state.get("timeout", default_timeout())
        self.frame_stack = state.get("frame_stack", 1)
        self.partial = state.get("partial", False)
        self._open()

    # -- indexing -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        game, run = self.metadata.get("game"), self.metadata.get("run")
        return (
            f"AtariZarrDataset({redact(self.url)!r}, game={game!r}, run={run!r}, "
            f"transitions={len(self)})"
        )

    def read_frames(self, rows: np.ndarray) -> np.ndarray:
        """Frames at ``rows`` (any order, repeats allowed), each chunk read once.

        Parameters
        ----------
        rows : numpy.ndarray of int64
            Row numbers in ``[0, len(self))``.

        Returns
        -------
        numpy.ndarray
            ``(len(rows), 84, 84)`` uint8.
        """
        # the chunk reader groups rows by chunk, decodes each chunk once (GIL released) and
        # caches it; layouts it does not know go through zarr's generic indexing.
        return self._frames.read(rows)

    def _episode_first_row(self, rows: np.ndarray) -> np.ndarray:
        """First row of the episode of each of ``rows`` (episode ids run 0, 1, ... in order)."""
        if self._first_rows is None:
            table = episode_table(self.metadata, len(self))
            if table is not None:
                self._first_rows = table.starts
            else:  # no usable table (an unfinished recording): one pass over the ids
                ep = self._episode.to_numpy()
                self._first_rows = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]]) if ep.size else ep
        return self._first_rows[self._episode[rows]]

    def _observations(self, rows: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Observations and next observations of ``rows``, with one frame fetch."""
        if self.frame_stack == 1:
            # next frame rows: only where the episode goes on; ask for both sets at once
            has_next = ~done
            frames = self.read_frames(np.concatenate([rows, rows[has_next] + 1]))
            obs = frames[: len(rows)]
            next_obs = np.zeros_like(obs)
            next_obs[has_next] = frames[len(rows) :]
            return obs, next_obs
        k = self.frame_stack
        # rows r-k+1 .. r+1: the first k are the stack of r, the last k the next stack
        window, valid = stacked_rows(rows + 1, self._episode_first_row(rows), k + 1)
        # the frame after the end of an episode was never stored
        valid[:, -1] &= ~done & (window[:, -1] < len(self))
        frames = self.read_frames(window[valid])
        out = np.zeros((len(rows), k + 1, *frames.shape[1:]), dtype=np.uint8)
        out[valid] = frames
        return out[:, :k], out[:, 1:]

    def __getitem__(self, idx: Any) -> TensorDict:
        rows, scalar = normalize_index(idx, len(self), self.where)
        done = self._done[rows]
        obs, next_obs = self._observations(rows, done)
        if self._final_obs is not None and done.any():
            # episode ends: the frame the writer kept (one row per episode id) is the
            # last frame of the next observation
            ep_uniq, ep_inv = np.unique(self._episode[rows[done]], return_inverse=True)
            finals = np.asarray(self._final_obs.get_orthogonal_selection((ep_uniq,)))
            if self.frame_stack == 1:
                next_obs[done] = finals[ep_inv]
            else:
                next_obs[done, -1] = finals[ep_inv]
        b = len(rows)
        false = torch.zeros((b, 1), dtype=torch.bool)
        term = torch.from_numpy(self._terminated[rows].reshape(b, 1))
        trunc = torch.from_numpy(self._truncated[rows].reshape(b, 1))
        td = TensorDict(
            {
                "observation": torch.from_numpy(obs),
                "action": torch.from_numpy(self._action[rows].astype(np.int64)),
                "episode": torch.from_numpy(self._episode[rows].astype(np.int64)),
                "index": torch.from_numpy(rows),
                "done": false,
                "terminated": false.clone(),
                "truncated": false.clone(),
                "next": TensorDict(
                    {
                        "observation": torch.from_numpy(next_obs),
                        "reward": torch.from_numpy(self._reward[rows].reshape(b, 1).copy()),
                        "terminated": term,
                        "truncated": trunc,
                        "done": term | trunc,
                    },
                    batch_size=[b],
                ),
            },
            batch_size=[b],
        )
        return td[0] if scalar else td

    def __getitems__(self, indices: list[int]) -> TensorDict:
        """A whole batch at once: what ``DataLoader`` calls with automatic batching.

        Use it with ``collate_fn=collate_batch`` (the default collate would split the
        batch back into items).
        """
        return self[np.asarray(indices, dtype=np.int64)]

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> TensorDict:
        """A batch of ``batch_size`` transitions drawn uniformly with replacement.

        Parameters
        ----------
        batch_size : int
            Number of transitions.
        generator : torch.Generator, optional
            For reproducible batches.
        """
        if len(self) == 0:
            raise IndexError(f"{self.url} holds no transitions; there is nothing to sample")
        rows = torch.randint(0, len(self), (int(batch_size),), generator=generator)
        return self[rows]

    def sample_iter(
        self,
        batch_size: int,
        *,
        batches: int | None = None,
        prefetch: int = 4,
        generator: torch.Generator | None = None,
    ) -> Iterator[TensorDict]:
        """Batches of :meth:`sample`, with the next ``prefetch`` batches fetched ahead.

        The rows of each batch are drawn from ``generator`` in order, exactly as
        repeated ``sample(batch_size, generator=generator)`` calls draw them, so the
        batches are the same with any ``prefetch``. While one batch is decoded, the
        encoded frame chunks of the next ``prefetch`` batches are on their way
        (:meth:`~atari_zarr.read.chunks.ChunkReader.prefetch`, requests of one
        shard merged), which hides a remote store's latency. A local store reads
        as with :meth:`sample`.

        Parameters
        ----------
        batch_size : int
            Transitions per batch.
        batches : int, optional
            Number of batches (default: without end).
        prefetch : int
            Batches whose frames are fetched ahead (0: none). They are drawn and
            fetched in groups of ``prefetch`` batches, a new group when half of the
            previous one is read, so between ``prefetch / 2`` and ``1.5 * prefetch``
            batches are ahead. Memory: the encoded bytes of their shards' ranges.
        generator : torch.Generator, optional
            For reproducible batches; drawn ``prefetch`` batches ahead of the one
            returned.

        Examples
        --------
        >>> ds = AtariZarrDataset(store_url)
        >>> g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        >>> ahead = list(ds.sample_iter(16, batches=3, prefetch=2, generator=g1))
        >>> plain = [ds.sample(16, generator=g2) for _ in range(3)]
        >>> all((a["index"] == b["index"]).all() for a, b in zip(ahead, plain))
        True
        """
        prefetch = check_prefetch(prefetch, self.where)
        if len(self) == 0:
            raise IndexError(f"{self.where} holds no transitions; there is nothing to sample")
        n, size = len(self), int(batch_size)
        yield from batches_ahead(
            lambda: torch.randint(0, n, (size,), generator=generator).numpy(),
            self.__getitem__,
            lambda rows: self._frames.prefetch(self._frame_rows(rows)),
            prefetch=prefetch,
            batches=batches,
        )

    def _frame_rows(self, rows: np.ndarray) -> np.ndarray:
        """The frame rows :meth:`_observations` reads for ``rows`` (for prefetching)."""
        done = self._done[rows]
        if self.frame_stack == 1:
            return np.concatenate([rows, rows[~done] + 1])
        window, valid = stacked_rows(rows + 1, self._episode_first_row(rows), self.frame_stack + 1)
        valid[:, -1] &= ~done & (window[:, -1] < len(self))
        return window[valid]

    # -- epoch stream (read/stream.py) ------------------------------------------------
    def stream(
        self,
        batch_size: int,
        *,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        prefetch: int | None = None,
        unit_rows: int | None = None,
    ) -> AtariZarrStream:
        """One epoch as TED batches, each transition exactly once, read unit by unit.

        Whole frame shards are fetched with one request each, ``prefetch`` in flight,
        in an order drawn from ``(seed, epoch)``; transitions leave through a shuffle
        buffer of decoded units. Batches have the keys, shapes and ``frame_stack`` of
        ``ds[idx]``. See ``docs/streaming.md``.

        Parameters
        ----------
        batch_size : int
            Transitions per batch (the last batch of each consumer may be smaller).
        seed, epoch : int
            The order of units and of transitions is drawn from these.
        shuffle : bool
            False: the stored order (each consumer's units in order).
        shuffle_buffer : int, optional
            Transitions held decoded for mixing (default
            :data:`~atari_zarr.read.stream.DEFAULT_SHUFFLE_BUFFER`, 4 shards):
            batches mix ``shuffle_buffer // unit_rows`` units. More is more random
            and costs ``84 * 84`` bytes per transition.
        rank, world_size : int, optional
            This process's part (default: from ``torch.distributed`` when
            initialised, else the whole store). DataLoader workers split it further.
        drop_last : bool
            Every consumer yields the same number of whole batches (what DDP
            needs); the few transitions beyond are left out of the epoch.
        prefetch : int, optional
            Units fetched ahead (default 4).
        unit_rows : int, optional
            Rows per read unit (default: a shard), a multiple of the chunk rows.

        Returns
        -------
        AtariZarrStream
            Iterable of batches, and a ``torch.utils.data.IterableDataset`` with
            ``state_dict()``/``load_state_dict()``.

        Examples
        --------
        >>> ds = AtariZarrDataset(store_url, frame_stack=4)
        >>> batch = next(iter(ds.stream(32, seed=0)))
        >>> batch["observation"].shape, batch["next", "observation"].shape
        (torch.Size([32, 4, 84, 84]), torch.Size([32, 4, 84, 84]))
        """
        from atari_zarr.read.stream import (
            DEFAULT_PREFETCH,
            DEFAULT_SHUFFLE_BUFFER,
            AtariZarrStream,
        )

        return AtariZarrStream(
            self,
            batch_size,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            shuffle_buffer=DEFAULT_SHUFFLE_BUFFER if shuffle_buffer is None else shuffle_buffer,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            prefetch=DEFAULT_PREFETCH if prefetch is None else prefetch,
            unit_rows=unit_rows,
        )

    # -- convenience ------------------------------------------------------------------
    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row (for TorchRL's ``SliceSampler``)."""
        return torch.from_numpy(self._episode.to_numpy()[: len(self)].astype(np.int64, copy=False))

    @property
    def game(self) -> str | None:
        return self.metadata.get("game")

    @property
    def run(self) -> str | None:
        return self.metadata.get("run")


def _remedy(meta: dict[str, Any]) -> str | None:
    """What to do about a damaged chunk of this store: run its command again, from scratch."""
    command = meta.get("command")
    if not isinstance(command, str) or not command:
        return None
    if "--overwrite" not in command.split():
        command += " --overwrite"
    return f"write it again ({command}), or copy the object again if it was transferred."


def stacked_rows(
    rows: np.ndarray, episode_start: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers of the ``k``-frame stack ending at each of ``rows``, and which exist.

    Parameters
    ----------
    rows : numpy.ndarray of int64
        ``(B,)`` the newest row of each stack.
    episode_start : numpy.ndarray of int64
        ``(B,)`` the first row of each row's episode: earlier rows belong to another
        episode and are padding (zero frames), as dopamine stacks.
    k : int
        Frames per stack.

    Returns
    -------
    window : numpy.ndarray of int64
        ``(B, k)`` rows ``r-k+1 .. r``, oldest first.
    valid : numpy.ndarray of bool
        ``(B, k)`` False where the row is before the episode start.

    Examples
    --------
    >>> w, v = stacked_rows(np.array([5, 9]), np.array([4, 0]), 3)
    >>> w.tolist(), v.tolist()
    ([[3, 4, 5], [7, 8, 9]], [[False, True, True], [True, True, True]])
    """
    rows = np.asarray(rows, dtype=np.int64)
    window = rows[:, None] + np.arange(1 - k, 1, dtype=np.int64)[None, :]
    valid = window >= np.asarray(episode_start, dtype=np.int64)[:, None]
    return window, valid


def collate_batch(batch: Any) -> Any:
    """``collate_fn`` for ``DataLoader`` over the datasets of this package.

    A batch from ``__getitems__`` is already a :class:`~tensordict.TensorDict` and is
    returned as is; a list of single items (a dataset without ``__getitems__``) is
    stacked.

    Examples
    --------
    >>> td = TensorDict({"a": torch.arange(3)}, batch_size=[3])
    >>> collate_batch(td) is td
    True
    >>> collate_batch([td[0], td[1]])["a"].tolist()
    [0, 1]
    """
    from tensordict import TensorDictBase

    if isinstance(batch, TensorDictBase):
        return batch
    return torch.stack(list(batch))
