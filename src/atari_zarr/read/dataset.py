"""Read a store back as TorchRL TED transitions: :class:`AtariZarrDataset`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.batch import collate_batch
from atari_zarr.read.core import ItemDataset
from atari_zarr.read.indexing import normalize_index
from atari_zarr.read.items import Items
from atari_zarr.read.member import members
from atari_zarr.read.options import ReadOptions
from atari_zarr.read.store import StoreReader
from atari_zarr.storage.paths import redact

if TYPE_CHECKING:
    import pandas

    from atari_zarr.read.windows import WindowDataset

__all__ = ["AtariZarrDataset", "collate_batch"]

log = logging.getLogger("atari_zarr")


def _of_store(name: str, doc: str) -> Any:
    """A read-only attribute of the dataset that is its store's."""
    return property(lambda self: getattr(self._store, name), doc=doc)


class AtariZarrDataset(ItemDataset):
    """Random access to one store, item by item or in batches, in TorchRL's TED layout.

    Row ``i`` is the transition ``(o_i, a_i, r_i, o_{i+1})``. Items are
    :class:`tensordict.TensorDict` objects with:

    .. code-block:: text

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
    epoch read shard by shard. Random access, sampling, the stream and pickling are
    those of :class:`~atari_zarr.read.core.ItemDataset`, the one dataset behind
    every front door.

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
        (default: ``options.timeout``, 60); ``None`` for no limit. A read that runs
        out raises :class:`~atari_zarr.errors.RemoteTimeoutError`.
    frame_stack : int
        Number of frames per observation (1: single ``[84, 84]`` frames).
    partial : bool
        Open an unfinished recording (``ZarrCollector`` stopped before ``close()``):
        its flushed whole episodes only. Complete stores open as usual.
    full_action_space : bool
        ``action`` as one of ALE's 18 actions (the store's ``action_full`` array,
        written by ``convert --full-action-space``) instead of an index into the
        game's minimal action set: one action space for several games.
    options : ReadOptions, optional
        How the store is read (:class:`~atari_zarr.read.options.ReadOptions`: the
        decoded-chunk cache, coalescing of remote requests, the encoded bytes kept,
        ``sample_iter``'s prefetch, the deadline, decoding threads). Frozen, and
        handed to DataLoader workers with the dataset.

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
        options: ReadOptions | None = None,
    ) -> None:
        options = ReadOptions.of(options, redact(str(path_or_url)))
        if timeout != "default":
            options = options.replace(timeout=timeout)
        store = StoreReader(
            str(path_or_url),
            storage_options=storage_options,
            cache=cache,
            partial=partial,
            full_action_space=full_action_space,
            options=options,
        )
        super().__init__(members([store], [Items.transitions(len(store))]), frame_stack=frame_stack)

    @classmethod
    def _over(cls, store: StoreReader, frame_stack: int) -> AtariZarrDataset:
        """The dataset of a store made already (opened, or known by its catalog entry)."""
        ds = cls.__new__(cls)
        ItemDataset.__init__(
            ds, members([store], [Items.transitions(len(store))]), frame_stack=frame_stack
        )
        return ds

    # -- the store ------------------------------------------------------------------
    @property
    def _store(self) -> StoreReader:
        return self.members[0].store.open()

    # the store's own values, as it was opened
    url = _of_store("url", "The store's path or URL, as given.")
    storage_options = _of_store("storage_options", "fsspec options of the store.")
    cache = _of_store("cache", "Local directory keeping the byte ranges fetched, or None.")
    timeout = _of_store("timeout", "Seconds per remote request (None: no limit).")
    partial = _of_store("partial", "True: an unfinished recording, its flushed episodes.")
    full_action_space = _of_store("full_action_space", "True: actions are ALE's 18.")

    metadata = _of_store("metadata", "The store's attributes (game, run, counts, episodes, ...).")

    # -- indexing -------------------------------------------------------------------
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

    def read_steps(
        self, rows: np.ndarray | range, names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Per-step values at ``rows``, no frame read: ``action``, ``reward``,
        ``terminated``, ``truncated`` and ``episode`` (or those of ``names``), each
        ``(len(rows),)``.

        ``rows`` is an array of row numbers, or a ``range``: a range of step 1 is read
        without an array of row numbers, so a whole 50 M-row column costs its values only.

        Examples
        --------
        >>> ds = AtariZarrDataset(store_url)
        >>> steps = ds.read_steps(np.arange(3))
        >>> sorted(steps), steps["action"].shape
        (['action', 'episode', 'reward', 'terminated', 'truncated'], (3,))
        >>> every = ds.read_steps(range(len(ds)), ["episode"])["episode"]
        >>> bool((every == ds.read_steps(np.arange(len(ds)))["episode"]).all())
        True
        """
        store = self._store
        columns = {
            "action": store.action,
            "reward": store.reward,
            "terminated": store.terminated,
            "truncated": store.truncated,
            "episode": store.episode,
        }
        asked = columns if names is None else names
        if isinstance(rows, range) and rows.step == 1 and 0 <= rows.start <= rows.stop <= len(self):
            return {name: columns[name].span(rows.start, rows.stop) for name in asked}
        rows, _ = normalize_index(np.asarray(rows, dtype=np.int64), len(self), self.where)
        return {name: columns[name][rows] for name in asked}

    def return_to_go(self, rows: np.ndarray) -> np.ndarray:
        """``(len(rows),)`` float32: the sum of ``next/reward`` from each row to the end of
        its episode (:func:`atari_zarr.episodes.return_to_go`, as the windows give it).

        Examples
        --------
        >>> ds = AtariZarrDataset(store_url)
        >>> rows = np.asarray(ds.episode_rows(0))
        >>> bool(np.isclose(ds.return_to_go(rows[:1])[0], ds.read_steps(rows)["reward"].sum()))
        True
        """
        rows, _ = normalize_index(np.asarray(rows, dtype=np.int64), len(self), self.where)
        return self._store.return_to_go(rows)

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
        if isinstance(episodes, (str, bytes)) or not (
            episodes is None or isinstance(episodes, Iterable)
        ):
            raise InvalidArgumentError(
                f"episodes must be None (every episode) or episode numbers, e.g. range(10); "
                f"got {episodes!r} for {self.where}"
            )
        which = range(self.num_episodes) if episodes is None else episodes
        for e in which:
            yield self.episode(e)  # 1.5 is refused here as by episode(1.5)

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

        view = WindowDataset(self._store, length, pad=pad, frame_stack=self.frame_stack)
        view._view_of(self)
        return view

    # -- convenience ------------------------------------------------------------------
    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row (for TorchRL's ``SliceSampler``)."""
        ids = self._store.episode.to_numpy()[: len(self)]
        return torch.from_numpy(ids.astype(np.int64, copy=False))

    game = _of_store("game", "The store's game, or None where it does not say.")
    run = _of_store("run", "The store's run, or None where it does not say.")
