"""Read a store back as TorchRL TED transitions: :class:`AtariZarrDataset`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.read.batch import collate_batch
from atari_zarr.read.draw import check_batch_size, check_prefetch, draw_ahead
from atari_zarr.read.indexing import normalize_index
from atari_zarr.read.items import Items
from atari_zarr.read.kept import DEFAULT_KEPT_BYTES
from atari_zarr.read.ranges import DEFAULT_COALESCE_GAP
from atari_zarr.read.store import StoreReader, check_frame_stack
from atari_zarr.storage.paths import redact

if TYPE_CHECKING:
    import pandas

    from atari_zarr.read.stream import EpochStream
    from atari_zarr.read.windows import WindowDataset

__all__ = ["AtariZarrDataset", "collate_batch"]

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
    stored). The two stacks are views of the same ``k + 1`` frames per row (not
    contiguous; call ``.contiguous()`` where that matters).

    It is a map-style :class:`torch.utils.data.Dataset` with a batched
    ``__getitems__``: ``DataLoader(ds, batch_size=B, collate_fn=collate_batch)``
    reads each batch with one frame fetch, and workers (``fork`` or ``spawn``)
    re-open the store from its URL. :meth:`windows` gives windows of consecutive
    steps (sequence models), :meth:`episode` whole episodes, and :meth:`stream` an
    epoch read shard by shard.

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
        (default 60); ``None`` for no limit. A read
        that runs out raises :class:`~atari_zarr.errors.RemoteTimeoutError`.
    frame_stack : int
        Number of frames per observation (1: single ``[84, 84]`` frames).
    partial : bool
        Open an unfinished recording (``ZarrCollector`` stopped before ``close()``):
        its flushed whole episodes only. Complete stores open as usual.
    full_action_space : bool
        ``action`` as one of ALE's 18 actions (the store's ``action_full`` array,
        written by ``convert --full-action-space``) instead of an index into the
        game's minimal action set: one action space for several games.

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
    #: Remote stores: frame chunks of one shard at most this many bytes apart are
    #: fetched with one request. The default is the cost model
    #: :func:`~atari_zarr.read.ranges.gap_for` for a bucket 20 ms away at 50 MB/s
    #: (16 KB); set ``AtariZarrDataset.coalesce_gap = gap_for(latency, bandwidth)``
    #: for another network, or -1 to fetch each chunk by itself.
    coalesce_gap: int = DEFAULT_COALESCE_GAP
    #: Remote stores: bound on the bytes requests brought that are kept in memory, per
    #: dataset (and per worker), so that no byte is fetched twice while kept.
    kept_bytes: int = DEFAULT_KEPT_BYTES

    def __init__(
        self,
        path_or_url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        cache: str | os.PathLike[str] | None = None,
        timeout: float | str | None = "default",
        frame_stack: int = 1,
        partial: bool = False,
        full_action_space: bool = False,
    ) -> None:
        self.frame_stack = check_frame_stack(frame_stack, redact(str(path_or_url)))
        self._open(
            {
                "path_or_url": str(path_or_url),
                "storage_options": storage_options,
                "cache": cache,
                "timeout": timeout,
                "partial": partial,
                "full_action_space": full_action_space,
            }
        )

    # -- opening, and re-opening in worker processes ---------------------------------
    def _open(self, state: dict[str, Any]) -> None:
        store = StoreReader(
            **state,
            frame_cache_bytes=self.frame_cache_bytes,
            coalesce_gap=self.coalesce_gap,
            kept_bytes=self.kept_bytes,
        )
        self._store = store
        self.url = store.url
        self.storage_options = store.storage_options
        self.cache = store.cache
        self.timeout = store.timeout
        self.partial = store.partial
        self.full_action_space = store.full_action_space
        self.metadata: dict[str, Any] = store.metadata
        #: The store's URL for messages, credentials removed.
        self.where = store.where

    def __getstate__(self) -> dict[str, Any]:
        # zarr stores hold file-system handles and event loops that must not cross a fork.
        return {**self._store.reopen_state(), "frame_stack": self.frame_stack}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.frame_stack = state.pop("frame_stack", 1)
        if "url" in state:  # pickled by an earlier release
            state["path_or_url"] = state.pop("url")
        self._open(state)

    # -- indexing -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        game, run = self.metadata.get("game"), self.metadata.get("run")
        return (
            f"AtariZarrDataset({self.where!r}, game={game!r}, run={run!r}, transitions={len(self)})"
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
        return self._store.frames.read(rows)

    def __getitem__(self, idx: Any) -> TensorDict:
        rows, scalar = normalize_index(idx, len(self), self.where)
        td = self._store.read_items(rows, length=1, stack=self.frame_stack)
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
        size = check_batch_size(batch_size, self.where)
        if len(self) == 0:
            raise IndexError(f"{self.where} holds no transitions; there is nothing to sample")
        rows = torch.randint(0, len(self), (size,), generator=generator)
        return self[rows]

    def fetch_ahead(self, rows: np.ndarray) -> None:
        """Start fetching the frames that reading ``rows`` will need (remote stores).

        See :meth:`~atari_zarr.read.chunks.ChunkReader.fetch_ahead`.
        """
        plan = self._store.frame_plan(np.asarray(rows, dtype=np.int64), 1, self.frame_stack)
        self._store.frames.fetch_ahead(plan.rows[plan.valid])

    def sample_iter(
        self,
        batch_size: int,
        *,
        batches: int | None = None,
        prefetch: int = 4,
        generator: torch.Generator | None = None,
    ) -> Iterator[TensorDict]:
        """Batches of :meth:`sample`, with the next ``prefetch`` batches drawn ahead.

        The rows of each batch are drawn from ``generator`` in order, exactly as
        repeated ``sample(batch_size, generator=generator)`` calls draw them, so the
        batches are the same with any ``prefetch``. While one batch is decoded, the
        encoded frame chunks of the next ``prefetch`` batches are on their way
        (:meth:`fetch_ahead`, requests of one shard merged), which hides a remote
        store's latency. A local store reads as with :meth:`sample`.

        Parameters
        ----------
        batch_size : int
            Transitions per batch.
        batches : int, optional
            Number of batches (default: without end).
        prefetch : int
            Batches drawn ahead, as TorchRL's ``prefetch`` (0: none). They are drawn
            and fetched in groups of ``prefetch`` batches, a new group when half of
            the previous one is read, so between ``prefetch / 2`` and ``1.5 *
            prefetch`` batches are ahead. Memory: the encoded bytes of their
            shards' ranges.
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
        n, size = len(self), check_batch_size(batch_size, self.where)
        yield from draw_ahead(
            lambda: torch.randint(0, n, (size,), generator=generator).numpy(),
            self.__getitem__,
            self.fetch_ahead,
            prefetch=prefetch,
            batches=batches,
        )

    # -- episodes ---------------------------------------------------------------------
    @property
    def num_episodes(self) -> int:
        """Episodes in the store."""
        return len(self._store.episodes)

    def _episode_number(self, i: Any) -> int:
        n = self.num_episodes
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise TypeError(f"an episode number must be an int; got {i!r} for {self.where}")
        if not -n <= i < n:
            raise IndexError(
                f"episode {int(i)} is out of range for {self.where}, which holds {n} episodes "
                f"(0 to {n - 1})"
            )
        return int(i) % n if n else 0

    def episode_rows(self, i: int) -> range:
        """The rows of episode ``i`` (negative counts from the end).

        Examples
        --------
        >>> ds = AtariZarrDataset(store_url)
        >>> rows = ds.episode_rows(0)
        >>> rows.start, len(rows) == int(ds.episode_table["length"][0])
        (0, True)
        """
        e = self._episode_number(i)
        table = self._store.episodes
        return range(int(table.starts[e]), int(table.ends[e]) + 1)

    def read_steps(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Per-step values at ``rows``, no frame read: ``action``, ``reward``,
        ``terminated``, ``truncated`` and ``episode``, each ``(len(rows),)``.

        Examples
        --------
        >>> steps = AtariZarrDataset(store_url).read_steps(np.arange(3))
        >>> sorted(steps), steps["action"].shape
        (['action', 'episode', 'reward', 'terminated', 'truncated'], (3,))
        """
        rows, _ = normalize_index(np.asarray(rows, dtype=np.int64), len(self), self.where)
        store = self._store
        return {
            "action": store.action[rows],
            "reward": store.reward[rows],
            "terminated": store.terminated[rows],
            "truncated": store.truncated[rows],
            "episode": store.episode[rows],
        }

    def episode(self, i: int) -> TensorDict:
        """Episode ``i`` (negative counts from the end) as one TED TensorDict of shape ``[T]``.

        Besides the keys of ``ds[rows]`` it has, as windows do, ``timestep`` ``[T]``
        (the true step of each row: a fragment, whose first steps are not in the
        store, starts at the steps played before it, or at 0 where the source does not
        tell) and ``fragment`` ``[T]`` bool.

        Examples
        --------
        >>> ds = AtariZarrDataset(store_url)
        >>> ep = ds.episode(0)
        >>> bool(ep["next", "done"][-1]), int(ep["next", "done"].sum())
        (True, 1)
        >>> len(ep) == int(ds.episode_table["length"][0])
        True
        """
        rows = self.episode_rows(i)
        td = self._store.read_items(np.asarray(rows), length=1, stack=self.frame_stack)
        before, fragment = self._store.steps_before(np.array([self._episode_number(i)]))
        # as windows give them: the true step of each row, and whether the episode's
        # first steps are missing from the store
        td["timestep"] = torch.arange(int(before[0]), int(before[0]) + len(rows))
        td["fragment"] = torch.full((len(rows),), bool(fragment[0]))
        return td

    def episode_video(
        self,
        i: int,
        path: str | os.PathLike[str],
        *,
        scale: int = 4,
        fps: float = 15.0,
        caption: bool = True,
        lossless: bool = False,
    ) -> Path:
        """Write episode ``i`` as an MP4 or a GIF (by ``path``'s suffix) and return its path.

        Frames are upscaled ``scale`` times (nearest neighbour), played at ``fps``, with a
        caption strip (step, action, reward, return so far) unless ``caption=False``.
        Only the episode's frames are read. Needs the ``video`` extra (PyAV, Pillow);
        see :func:`atari_zarr.explore.video.write_video`.

        Examples
        --------
        >>> import tempfile
        >>> AtariZarrDataset(store_url).episode_video(0, tempfile.mkdtemp() + "/e.mp4").suffix
        '.mp4'
        """
        from atari_zarr.explore.video import episode_video

        return episode_video(
            self, i, path, scale=scale, fps=fps, caption=caption, lossless=lossless
        )

    def show_episode(self, i: int, *, scale: int = 4, fps: float = 15.0) -> Any:
        """An inline player of episode ``i`` for Jupyter: play/pause, a step slider, the
        frame with its action, reward and return so far.

        Only the episode's frames are read. It is plain HTML with its own script
        (:class:`atari_zarr.explore.player.EpisodePlayer`): it plays in JupyterLab,
        VS Code and notebooks exported to HTML; ``.save(path)`` writes it as a page.

        Examples
        --------
        >>> AtariZarrDataset(store_url).show_episode(0)
        EpisodePlayer('Pong/1, episode 0 (...)', steps=...)
        """
        from atari_zarr.explore.player import episode_player

        return episode_player(self, i, scale=scale, fps=fps)

    def iter_episodes(self, episodes: Any = None) -> Iterator[TensorDict]:
        """Episodes one after the other (default: all, in order), each a TensorDict ``[T]``.

        Consecutive episodes share the frame chunk between them through the chunk
        cache: a pass over every episode decodes each frame chunk once.
        """
        which = range(self.num_episodes) if episodes is None else episodes
        for e in which:
            yield self.episode(int(e))

    @property
    def episode_table(self) -> pandas.DataFrame:
        """One row per episode: where it is, how long, how it ended, its return.

        Columns: ``first_row``, ``length``, ``return`` (sum of ``next/reward``),
        ``terminated`` (False: the episode was cut, by a gap, a limit or the end of
        the data), ``checkpoint`` (the DQN Replay checkpoint or RL Unplugged shard
        holding its first row; missing for recordings) and, for RL Unplugged stores,
        ``source_return`` and ``source_clipped_return`` (the returns the source
        recorded); then ``first_step`` and ``fragment`` (the true step of its first
        row, -1 where the source does not tell; a fragment's first steps are not in
        the store: ``docs/format.md``, "Fragments").

        Examples
        --------
        >>> table = AtariZarrDataset(store_url).episode_table
        >>> list(table.columns)
        ['first_row', 'length', 'return', 'terminated', 'checkpoint', 'first_step', 'fragment']
        >>> int(table["length"].sum()) == len(AtariZarrDataset(store_url))
        True
        """
        import pandas as pd

        from atari_zarr.episodes import episode_columns

        columns = episode_columns(self.metadata, self._store.episodes)
        frame = pd.DataFrame(columns)
        frame.index.name = "episode"
        if "checkpoint" in frame:
            frame["checkpoint"] = frame["checkpoint"].astype("Int64")
        return frame

    # -- other readers of this store --------------------------------------------------
    def windows(self, length: int, *, pad: bool = False) -> WindowDataset:
        """Windows of ``length`` consecutive steps of one episode, for sequence models.

        See :class:`~atari_zarr.read.windows.WindowDataset`.

        Examples
        --------
        >>> w = AtariZarrDataset(store_url, frame_stack=4).windows(8)
        >>> item = w[0]
        >>> item.batch_size, item["observation"].shape, item["return_to_go"].shape
        (torch.Size([8]), torch.Size([8, 4, 84, 84]), torch.Size([8, 1]))
        """
        from atari_zarr.read.windows import WindowDataset

        return WindowDataset(self._store, length, pad=pad, frame_stack=self.frame_stack)

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
        units_ahead: int | None = None,
        unit_rows: int | None = None,
    ) -> EpochStream:
        """One epoch as TED batches, each transition exactly once, read unit by unit.

        Whole frame shards are fetched with one request each, ``units_ahead`` in
        flight, in an order drawn from ``(seed, epoch)``; transitions leave through a
        shuffle buffer of decoded units. Batches have the keys, shapes and
        ``frame_stack`` of ``ds[idx]``. See ``docs/streaming.md``.

        Parameters
        ----------
        batch_size : int
            Transitions per batch (the last batch may be smaller, alike on every
            consumer).
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
            Every consumer (rank x DataLoader worker) yields the same number of
            batches either way. False (default): consumers short of the largest
            count repeat one of their own transitions, as ``DistributedSampler``
            pads. True: only whole batches, and fewer than ``consumers *
            batch_size`` transitions are left out of the epoch.
        units_ahead : int, optional
            Units fetched and decoded ahead of the one being read (default 4).
        unit_rows : int, optional
            Rows per read unit (default: a shard), a multiple of the chunk rows.

        Returns
        -------
        EpochStream
            Iterable of batches, and a ``torch.utils.data.IterableDataset`` with
            ``state_dict()``/``load_state_dict()``.

        Examples
        --------
        >>> ds = AtariZarrDataset(store_url, frame_stack=4)
        >>> batch = next(iter(ds.stream(32, seed=0)))
        >>> batch["observation"].shape, batch["next", "observation"].shape
        (torch.Size([32, 4, 84, 84]), torch.Size([32, 4, 84, 84]))
        """
        from atari_zarr.read.stream import stream_over

        return stream_over(
            [self._store],
            [Items.transitions(len(self))],
            batch_size,
            frame_stack=self.frame_stack,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            units_ahead=units_ahead,
            unit_rows=unit_rows,
        )

    # -- convenience ------------------------------------------------------------------
    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row (for TorchRL's ``SliceSampler``)."""
        ids = self._store.episode.to_numpy()[: len(self)]
        return torch.from_numpy(ids.astype(np.int64, copy=False))

    @property
    def game(self) -> str | None:
        return self.metadata.get("game")

    @property
    def run(self) -> str | None:
        return self.metadata.get("run")
