"""Windows of ``K`` consecutive steps of one episode, for sequence models: :class:`WindowDataset`.

Decision Transformer and its successors train on windows of consecutive steps
with returns-to-go and timesteps. :meth:`AtariZarrDataset.windows
<atari_zarr.AtariZarrDataset.windows>` gives them as a map-style dataset, read by
the same engine and batch builder as every other reader:

* item ``j`` is a TensorDict of shape ``[K]`` with the TED keys of ``ds[rows]``
  (``frame_stack`` applied) for ``K`` consecutive rows of one episode, plus
  ``index`` ``[K]`` (the rows), ``return_to_go`` ``[K, 1]`` float32 (the sum of
  ``next/reward`` from that row to the last stored row of its episode),
  ``timestep`` ``[K]`` int64 (the episode's true step: the row minus its
  episode's first row, plus the steps played before that row where the episode is
  a fragment whose start the source tells), ``fragment`` ``[K]`` bool (the episode's
  first steps are not in the store: it began in a checkpoint left out, or before a
  missed log; see :func:`atari_zarr.episodes.first_steps`) and ``mask`` ``[K]``
  bool. A fragment's ``return_to_go`` is exact: it only looks forward;
* windows never cross an episode boundary: without ``pad`` the items are every
  start row ``s`` such that ``s .. s + K - 1`` lie in one episode, in row order
  (an episode of length ``L`` gives ``max(0, L - K + 1)`` items); with ``pad``,
  an episode shorter than ``K`` also gives one item, right-padded with zeros and
  ``mask`` False (``index`` -1 there);
* frame stacks are views of the ``K + k`` distinct frames of a window
  (:mod:`atari_zarr.read.batch`): ``.contiguous()`` where a contiguous tensor is
  needed;
* :meth:`WindowDataset.sample` draws ``[B, K]`` batches, :meth:`WindowDataset.stream`
  yields every window once per epoch across ranks and workers (the epoch stream of
  :mod:`atari_zarr.read.stream`, with its determinism and resume).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.draw import check_batch_size, check_prefetch, draw_ahead
from atari_zarr.read.indexing import normalize_index
from atari_zarr.read.items import Items
from atari_zarr.read.store import StoreReader
from atari_zarr.read.stream import EpochStream, stream_over

__all__ = ["WindowDataset", "check_window_length"]


def check_window_length(length: Any, pad: bool, longest: int, where: str) -> int:
    """``length`` as a window length, or a one-line error naming the store and its longest episode.

    Examples
    --------
    >>> check_window_length(30, False, 100, "s.zarr")
    30
    >>> check_window_length(300, False, 100, "s.zarr")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: windows of 300 steps: no episode of s.zarr is that \
long (the longest has 100 steps); use a shorter window, or pad=True to pad shorter episodes
    """
    if isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 1:
        raise InvalidArgumentError(
            f"window length must be a positive number of steps; got {length!r} for {where}"
        )
    if not pad and length > longest:
        raise InvalidArgumentError(
            f"windows of {int(length)} steps: no episode of {where} is that long (the longest "
            f"has {longest} steps); use a shorter window, or pad=True to pad shorter episodes"
        )
    return int(length)


class WindowDataset(torch.utils.data.Dataset):
    """Windows of ``length`` consecutive steps of one episode of a store (see the module).

    Made by :meth:`AtariZarrDataset.windows <atari_zarr.AtariZarrDataset.windows>`.
    A map-style dataset with a batched ``__getitems__`` (``DataLoader(w,
    batch_size=B, collate_fn=collate_batch)`` reads a batch with one frame fetch).

    Parameters
    ----------
    store : StoreReader
        The opened store.
    length : int
        ``K``, steps per window.
    pad : bool
        Also give one padded window per episode shorter than ``K``.
    frame_stack : int
        Frames per observation.

    Raises
    ------
    InvalidArgumentError
        ``length`` below 1, or longer than every episode without ``pad``.

    Examples
    --------
    >>> from atari_zarr import AtariZarrDataset
    >>> w = AtariZarrDataset(store_url).windows(5)
    >>> batch = w.sample(4, generator=torch.Generator().manual_seed(0))
    >>> batch.batch_size, batch["timestep"].dtype, bool(batch["mask"].all())
    (torch.Size([4, 5]), torch.int64, True)
    >>> rows = batch["index"]
    >>> bool(((rows[:, 1:] - rows[:, :-1]) == 1).all())  # consecutive rows
    True
    """

    def __init__(
        self, store: StoreReader, length: int, *, pad: bool = False, frame_stack: int = 1
    ) -> None:
        self._store = store
        self.where = store.where
        self.frame_stack = int(frame_stack)
        longest = int(store.episodes.length.max()) if len(store.episodes) else 0
        self.length = check_window_length(length, pad, longest, store.where)
        self.pad = bool(pad)
        self.items = Items.windows(store.episodes, self.length, pad=self.pad)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return (
            f"WindowDataset({self.where!r}, length={self.length}, pad={self.pad}, "
            f"frame_stack={self.frame_stack}, windows={len(self)})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "store": self._store.reopen_state(),
            "length": self.length,
            "pad": self.pad,
            "frame_stack": self.frame_stack,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            StoreReader(**state["store"]),
            state["length"],
            pad=state["pad"],
            frame_stack=state["frame_stack"],
        )

    @property
    def store(self) -> StoreReader:
        """The opened store."""
        return self._store

    def starts(self, idx: Any) -> np.ndarray:
        """First row of each window ``idx``."""
        items, _ = normalize_index(idx, len(self), self.where, unit="windows")
        return self.items.starts(items)

    def __getitem__(self, idx: Any) -> TensorDict:
        items, scalar = normalize_index(idx, len(self), self.where, unit="windows")
        td = self._store.read_items(
            self.items.starts(items),
            length=self.length,
            stack=self.frame_stack,
            real=self.items.real(items),
            windowed=True,
        )
        return td[0] if scalar else td

    def __getitems__(self, indices: list[int]) -> TensorDict:
        """A whole batch at once (``DataLoader`` automatic batching; use ``collate_batch``)."""
        return self[np.asarray(indices, dtype=np.int64)]

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> TensorDict:
        """A ``[batch_size, K]`` batch of windows drawn uniformly with replacement."""
        size = check_batch_size(batch_size, self.where)
        if len(self) == 0:
            raise IndexError(f"{self.where} has no window of {self.length} steps to sample")
        return self[torch.randint(0, len(self), (size,), generator=generator)]

    def fetch_ahead(self, items: np.ndarray) -> None:
        """Start fetching the frames that reading windows ``items`` will need (remote stores)."""
        items = np.asarray(items, dtype=np.int64)
        plan = self._store.frame_plan(
            self.items.starts(items), self.length, self.frame_stack, self.items.real(items)
        )
        self._store.frames.fetch_ahead(plan.rows[plan.valid])

    def sample_iter(
        self,
        batch_size: int,
        *,
        batches: int | None = None,
        prefetch: int = 4,
        generator: torch.Generator | None = None,
    ) -> Any:
        """Batches of :meth:`sample`, the next ``prefetch`` drawn ahead and their frames fetched.

        As :meth:`AtariZarrDataset.sample_iter <atari_zarr.AtariZarrDataset.sample_iter>`.
        """
        prefetch = check_prefetch(prefetch, self.where)
        if len(self) == 0:
            raise IndexError(f"{self.where} has no window of {self.length} steps to sample")
        n, size = len(self), check_batch_size(batch_size, self.where)
        return draw_ahead(
            lambda: torch.randint(0, n, (size,), generator=generator).numpy(),
            self.__getitem__,
            self.fetch_ahead,
            prefetch=prefetch,
            batches=batches,
        )

    def stream(self, batch_size: int, **kwargs: Any) -> EpochStream:
        """One epoch of windows as ``[B, K]`` batches, each window exactly once.

        The options, determinism and ``state_dict()`` resume are those of
        :meth:`AtariZarrDataset.stream <atari_zarr.AtariZarrDataset.stream>`; a
        read unit's windows are those that start in it (the frames of a window
        that runs past the unit come with the unit).

        Examples
        --------
        >>> from atari_zarr import AtariZarrDataset
        >>> w = AtariZarrDataset(store_url).windows(5)
        >>> starts = torch.cat([b["index"][:, 0] for b in w.stream(64, seed=0, unit_rows=64)])
        >>> sorted(starts.tolist()) == w.starts(np.arange(len(w))).tolist()
        True
        """
        return stream_over(
            [self._store], [self.items], batch_size, frame_stack=self.frame_stack, **kwargs
        )
