"""The one dataset: items of one store or several, read at random, sampled and streamed.

:class:`ItemDataset` is a map-style :class:`torch.utils.data.Dataset` over
``(stores, items, weights)``: the opened stores
(:class:`~atari_zarr.read.store.StoreReader`), what an item of each is
(:class:`~atari_zarr.read.items.Items`: a transition, or a window of ``K`` rows),
and, for several stores, the weight of each. Everything a reader does with items is
written here once: indexing and the batched ``__getitems__`` of ``DataLoader``,
:meth:`~ItemDataset.sample`, :meth:`~ItemDataset.sample_iter` with batches drawn
ahead, :meth:`~ItemDataset.stream` (the epoch stream of :mod:`atari_zarr.read.stream`)
and pickling for DataLoader workers. The front doors are thin constructors of it:

* :class:`~atari_zarr.AtariZarrDataset`: the transitions of one store, plus its
  episodes and their pictures;
* ``AtariZarrDataset.windows(K)`` (:class:`~atari_zarr.read.windows.WindowDataset`):
  the windows of one store;
* :class:`~atari_zarr.MultiGameDataset` and its ``windows(K)``: several stores, each
  item tagged with ``game_id`` (:func:`~atari_zarr.read.mixture.tag_items`), stores
  drawn by weight (:func:`~atari_zarr.read.mixture.draw_mixture`).

One store is a mixture of one: item ``i`` is item ``i - offsets[g]`` of store ``g``,
and a batch is read by :func:`~atari_zarr.read.store.read_items`, each store it
touches once, assembled once.

``sample_iter`` *draws* batches ahead (:func:`draw_ahead`) and hands each group to
``fetch_ahead``, so close chunks of a shard share one request. (Chunks are *fetched*
ahead by ``ChunkReader.fetch_ahead``, *decoded* ahead of a sequential reader, and
stream units *read* ahead by ``stream(units_ahead=k)``.)
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from tensordict import TensorDict

from atari_zarr.arguments import whole_number
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.layout import ARRAYS, OBSERVATION
from atari_zarr.read.chunks import ReaderSet
from atari_zarr.read.episode_index import EpisodeIndex
from atari_zarr.read.indexing import normalize_index
from atari_zarr.read.items import Items, item_rows
from atari_zarr.read.member import Member, open_stores
from atari_zarr.read.mixture import draw_mixture, tag_items
from atari_zarr.read.options import ReadOptions
from atari_zarr.read.step_axis import StepAxis
from atari_zarr.read.store import StoreReader, plan_items, read_items
from atari_zarr.resources import process_memory

if TYPE_CHECKING:
    from atari_zarr.read.stream import EpochStream


#: Bytes of one frame (84 x 84 uint8).
FRAME_BYTES = int(np.prod(ARRAYS[OBSERVATION].row_shape))


__all__ = ["ItemDataset", "draw_ahead"]

T = TypeVar("T")


class ItemDataset(torch.utils.data.Dataset):
    """Items of one store or several (see the module); the front doors construct it.

    Parameters
    ----------
    members : sequence of Member
        The stores, each with its items, weight and ``game_id``
        (:func:`~atari_zarr.read.member.members`); a store known by its catalog entry
        is opened when a batch or a stream first needs it.
    frame_stack : int
        Frames per observation.
    weighted : bool
        True when the weights were asked for (a stream then orders each consumer's
        units by them); False: by items, every item alike.
    where : str, optional
        This dataset in messages (default: the one store's URL).

    Examples
    --------
    >>> from atari_zarr.read.member import members
    >>> store = StoreReader(store_url)
    >>> both = ItemDataset(members([store, store], [Items.transitions(len(store))] * 2,
    ...                            game_ids=[0, 1]))
    >>> len(both) == 2 * len(store), both[len(store)]["game_id"].item()
    (True, 1)
    """

    def __init__(
        self,
        members: Sequence[Member],
        *,
        frame_stack: int = 1,
        weighted: bool = False,
        where: str | None = None,
    ) -> None:
        #: This dataset in messages.
        self.where = where or members[0].store.where
        # the item spec is checked here once: its length and padding by Items
        self.frame_stack = whole_number(frame_stack, "frame_stack", self.where, unit="frames")
        self.weighted = weighted
        self._set_members(list(members))

    def _set_members(self, members: list[Member]) -> None:
        for name in self._rebuilt:  # made from other members
            self.__dict__.pop(name, None)
        #: The stores, each with its items, weight and game_id.
        self.members = members
        #: Global item number of each store's first item.
        self.offsets = np.cumsum([0, *(len(m.items) for m in members)], dtype=np.int64)
        #: Global index of each store's first row (the ``index`` of several stores' items).
        self.row_offsets = np.cumsum([0, *(len(m.store) for m in members)], dtype=np.int64)
        #: Probability of drawing each store (sums to 1; 0 for stores without items).
        self.weights = np.array([m.weight for m in members], dtype=np.float64)
        tagged = members[0].game_id is not None
        #: Game of each store, the ``game_id`` of its items (None: items untagged).
        self.game_ids = np.array([m.game_id for m in members], np.int64) if tagged else None

    @property
    def options(self) -> ReadOptions:
        """How the (first) store is read."""
        return self.members[0].store.options

    @property
    def _items(self) -> Items:
        return self.members[0].items

    @property
    def _unit(self) -> str:
        return "transitions" if self._items.identity else "windows"

    #: Attributes made again from the members after unpickling (not pickled).
    _rebuilt: tuple[str, ...] = (
        "_index",
        "_axis",
        "_frames",
        "_store_list",
        "_all_opened",
        "_streams",  # this process's streams of it, which close() stops
    )

    def _made(self, name: str, make: Callable[[], Any]) -> Any:
        """``make()``, kept under ``name`` (one of :attr:`_rebuilt`) once made."""
        made = self.__dict__.get(name)
        if made is None:
            made = self.__dict__[name] = make()
        return made

    @property
    def _stores(self) -> list[StoreReader]:
        """Every member's store, in order."""
        return self._made("_store_list", lambda: [m.store for m in self.members])  # type: ignore[no-any-return]

    @property
    def _episode_index(self) -> EpisodeIndex | None:
        """The stores' episodes on one axis (several stores), made on first use."""
        if len(self.members) == 1:
            return None
        return self._made("_index", lambda: EpisodeIndex(self._stores))  # type: ignore[no-any-return]

    @property
    def _step_axis(self) -> StepAxis | None:
        """The stores' actions and rewards on one axis (several stores), made on first use."""
        if len(self.members) == 1:
            return None
        return self._made("_axis", lambda: StepAxis(self._stores))  # type: ignore[no-any-return]

    @property
    def _frame_readers(self) -> ReaderSet | None:
        """The stores' frame readers read together (several stores), made on first use."""
        if len(self.members) == 1:
            return None
        stores = self._stores
        return self._made("_frames", lambda: ReaderSet(len(stores), lambda g: stores[g].frames))  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        # each store pickles as what opens it again (one known by its entry, unopened);
        # the dataset it is a view of is this process's
        return {k: v for k, v in self.__dict__.items() if k not in (*self._rebuilt, "_viewed")}

    def _view_of(self, dataset: ItemDataset) -> None:
        """This dataset is a view of ``dataset`` (its :meth:`windows`, reading its stores):
        the close of ``dataset`` stops this one's streams too."""
        self.__dict__["_viewed"] = weakref.ref(dataset)

    def close(self) -> None:
        """Stop every stream iterator of this dataset and of its views (its
        :meth:`windows`, which read its stores) not done yet (their threads
        stopped and joined; their next ``next()`` raises
        :class:`~atari_zarr.errors.DatasetClosedError`), stop the threads that read the
        stores, drop their decoded chunks and let their files go: what a ``with`` block
        does at its end. The dataset reads again when asked.

        Examples
        --------
        >>> from atari_zarr import AtariZarrDataset
        >>> with AtariZarrDataset(store_url) as ds:
        ...     it = iter(ds.stream(8, unit_rows=64))
        ...     first = next(it)
        >>> next(it)
        Traceback (most recent call last):
        ...
        atari_zarr.errors.DatasetClosedError: ...
        """
        for stream in list(self._made("_streams", weakref.WeakSet)):
            stream.close("its dataset was closed")
        for m in self.members:
            m.store.close()

    def __enter__(self) -> ItemDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _opened(self, which: Any) -> list[StoreReader]:
        """Every store, those numbered ``which`` opened (together); once all of them are
        (a store stays opened), no store is asked again."""
        stores = self._stores
        if not self.__dict__.get("_all_opened"):
            open_stores([stores[g] for g in which])
            self.__dict__["_all_opened"] = all(s.opened for s in stores)
        return stores

    # -- indexing ---------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _split(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store and item within it of each global item."""
        # side="right" skips stores without items: their offset equals the next store's
        store = np.searchsorted(self.offsets, items, side="right") - 1
        return store, items - self.offsets[store]

    def _locate_rows(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Store, first row and real rows (None: all) of each of ``items``."""
        store, local = self._split(items)
        return (store, *item_rows([m.items for m in self.members], store, local))

    def read(self, items: np.ndarray) -> TensorDict:
        """A batch of items (global numbers, in ``[0, len(self))``), assembled once."""
        store, starts, real = self._locate_rows(np.asarray(items, dtype=np.int64))
        first = self._items
        td = read_items(
            self._opened(np.unique(store).tolist()),
            store,
            starts,
            length=first.length,
            stack=self.frame_stack,
            real=real,
            windowed=not first.identity,
            index=self._episode_index,
            axis=self._step_axis,
            frames=self._frame_readers,
        )
        if self.game_ids is None:
            return td
        return tag_items(td, store, self.row_offsets, self.game_ids)

    def __getitem__(self, idx: Any) -> TensorDict:
        items, scalar = normalize_index(idx, len(self), self.where, unit=self._unit)
        td = self.read(items)
        return td[0] if scalar else td

    def __getitems__(self, indices: list[int]) -> TensorDict:
        """A whole batch at once: what ``DataLoader`` calls with automatic batching.

        Use it with ``collate_fn=collate_batch`` (the default collate would split the
        batch back into items).
        """
        # checked as any index (never cast first: 1.5 would be row 1)
        return self[np.asarray(indices)]

    def locate(self, idx: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(store, item within it)`` of each index (any index ``__getitem__`` takes)."""
        items, _ = normalize_index(idx, len(self), self.where, unit=self._unit)
        return self._split(items)

    # -- sampling ---------------------------------------------------------------------
    def _nothing(self) -> IndexError:
        first = self._items
        if first.identity:
            return IndexError(f"{self.where} holds no transitions; there is nothing to sample")
        return IndexError(f"{self.where} has no window of {first.length} steps to sample")

    def _batch_size(self, batch_size: int) -> int:
        """``batch_size``, checked: a whole number whose batch fits this process's memory."""
        size = whole_number(batch_size, "batch_size", self.where, low=0, unit="items")
        # frames of an item: a stack per step, and the next observation's
        need = size * self._items.length * 2 * self.frame_stack * FRAME_BYTES
        if need > process_memory():
            raise InvalidArgumentError(
                f"batch_size {size:,} asks for {need / 2**30:,.0f} GiB of frames in one batch "
                f"of {self.where}, more than the {process_memory() / 2**30:,.0f} GiB this "
                f"process may use; pass a smaller batch_size"
            )
        return size

    def _drawer(self, batch_size: int, generator: torch.Generator | None) -> Any:
        """What draws the item numbers of one batch (checked once)."""
        size = self._batch_size(batch_size)
        if len(self) == 0:
            raise self._nothing()
        offsets, weights = self.offsets, self.weights
        return lambda: draw_mixture(offsets, weights, size, generator)

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> TensorDict:
        """A batch of ``batch_size`` items drawn uniformly with replacement (several
        stores: each item's store drawn by weight, then a uniform item of it).

        Parameters
        ----------
        batch_size : int
            Number of items.
        generator : torch.Generator, optional
            For reproducible batches.
        """
        return self[self._drawer(batch_size, generator)()]

    def fetch_ahead(self, items: np.ndarray) -> None:
        """Start fetching the frames that reading ``items`` will need (remote stores).

        See :meth:`~atari_zarr.read.chunks.ChunkReader.fetch_ahead`.
        """
        store, starts, real = self._locate_rows(np.asarray(items, dtype=np.int64))
        stores = self._opened(np.unique(store).tolist())
        plan, sel_of = plan_items(
            stores,
            store,
            starts,
            length=self._items.length,
            stack=self.frame_stack,
            real=real,
            index=self._episode_index,
        )
        for g, sel in sel_of.items():
            rows, valid = plan.rows[sel], plan.valid[sel]
            stores[g].frames.fetch_ahead(rows[valid])

    def sample_iter(
        self,
        batch_size: int,
        *,
        batches: int | None = None,
        prefetch: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[TensorDict]:
        """Batches of :meth:`sample`, with the next ``prefetch`` batches drawn ahead.

        The items of each batch are drawn from ``generator`` in order, exactly as
        repeated ``sample(batch_size, generator=generator)`` calls draw them, so the
        batches are the same with any ``prefetch``. While one batch is decoded, the
        encoded frame chunks of the next ``prefetch`` batches are on their way
        (:meth:`fetch_ahead`, requests of one shard merged), which hides a remote
        store's latency. A local store reads as with :meth:`sample`.

        Parameters
        ----------
        batch_size : int
            Items per batch.
        batches : int, optional
            Number of batches (default: without end).
        prefetch : int, optional
            Batches drawn ahead, as TorchRL's ``prefetch`` (0: none; default
            ``ReadOptions.prefetch``, 4). They are drawn and fetched in groups of
            ``prefetch`` batches, a new group when half of the previous one is read,
            so between ``prefetch / 2`` and ``1.5 * prefetch`` batches are ahead.
            Memory: the encoded bytes of their shards' ranges, bounded by
            ``ReadOptions.kept_bytes``.
        generator : torch.Generator, optional
            For reproducible batches; drawn ``prefetch`` batches ahead of the one
            returned.

        Examples
        --------
        >>> from atari_zarr import AtariZarrDataset
        >>> ds = AtariZarrDataset(store_url)
        >>> g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        >>> ahead = list(ds.sample_iter(16, batches=3, prefetch=2, generator=g1))
        >>> plain = [ds.sample(16, generator=g2) for _ in range(3)]
        >>> all((a["index"] == b["index"]).all() for a, b in zip(ahead, plain))
        True
        """
        ahead = self.options.prefetch if prefetch is None else prefetch
        ahead = whole_number(ahead, "prefetch", self.where, low=0, unit="batches")
        draw = self._drawer(batch_size, generator)
        return draw_ahead(
            lambda: draw().numpy(),
            self.__getitem__,
            self.fetch_ahead,
            prefetch=ahead,
            batches=batches,
        )

    # -- the epoch stream -------------------------------------------------------------
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
        keep_units: bool = False,
    ) -> EpochStream:
        """One epoch as TED batches, each item exactly once, read unit by unit.

        Whole frame shards are fetched with one request each, ``units_ahead`` in
        flight, in an order drawn from ``(seed, epoch)``; items leave through a
        shuffle buffer of decoded units. Batches have the keys, shapes and
        ``frame_stack`` of ``self[idx]``; a read unit's windows are those that start
        in it. Several stores: each batch takes from every store a multinomial
        share by weight (stores that ran out leave the mix). See
        ``docs/streaming.md``.

        Parameters
        ----------
        batch_size : int
            Items per batch (the last batch may be smaller, alike on every consumer).
        seed, epoch : int
            The order of units and of items is drawn from these.
        shuffle : bool
            False: the stored order (each consumer's units in order).
        shuffle_buffer : int, optional
            Rows held decoded for mixing (default
            :data:`~atari_zarr.read.units.DEFAULT_SHUFFLE_BUFFER`, 4 shards):
            batches mix ``shuffle_buffer // unit_rows`` units. More is more random
            and costs ``84 * 84`` bytes per row.
        rank, world_size : int, optional
            This process's part (default: from ``torch.distributed`` when
            initialised, else the whole epoch). DataLoader workers split it further.
        drop_last : bool
            Every consumer (rank x DataLoader worker) yields the same number of
            batches either way. False (default): consumers short of the largest
            count repeat one of their own items, as ``DistributedSampler`` pads.
            True: only whole batches, and fewer than ``consumers * batch_size`` items
            are left out of the epoch.
        units_ahead : int, optional
            Units fetched and decoded ahead of the one being read (default 4).
        unit_rows : int, optional
            Rows per read unit (default: a shard), a multiple of the chunk rows.
        keep_units : bool
            Keep every unit decoded from one epoch to the next, so that the epochs
            after the first decode nothing (:class:`~atari_zarr.read.units.Slots`),
            up to the stores' decoded-frame budget (``ReadOptions.frame_cache_bytes``;
            an epoch whose units do not fit it stops with one line). False (default):
            a window of units, within ``stream_memory_bound``.

        Returns
        -------
        EpochStream
            Iterable of batches, and a ``torch.utils.data.IterableDataset`` with
            ``state_dict()``/``load_state_dict()``.

        Examples
        --------
        >>> from atari_zarr import AtariZarrDataset
        >>> ds = AtariZarrDataset(store_url, frame_stack=4)
        >>> batch = next(iter(ds.stream(32, seed=0)))
        >>> batch["observation"].shape, batch["next", "observation"].shape
        (torch.Size([32, 4, 84, 84]), torch.Size([32, 4, 84, 84]))
        """
        from atari_zarr.read.stream import (
            DEFAULT_SHUFFLE_BUFFER,
            DEFAULT_UNITS_AHEAD,
            EpochStream,
        )

        # the plan cuts each store along its shards: read from the zarr.json of those not
        # opened yet, together (a bucket's 32 at a time); each opens when first read
        size = self._batch_size(batch_size)
        open_stores([m.store for m in self.members], StoreReader.frame_rows)
        stream = EpochStream(
            self.members,
            size,
            frame_stack=self.frame_stack,
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            shuffle_buffer=DEFAULT_SHUFFLE_BUFFER if shuffle_buffer is None else shuffle_buffer,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            units_ahead=DEFAULT_UNITS_AHEAD if units_ahead is None else units_ahead,
            unit_rows=unit_rows,
            keep_units=keep_units,
            weighted=self.weighted,
            where=self.where,
        )
        owner: ItemDataset | None = self
        while owner is not None:  # its own, and of the datasets it is a view of
            owner._made("_streams", weakref.WeakSet).add(stream)
            viewed = owner.__dict__.get("_viewed")
            owner = viewed() if viewed is not None else None
        return stream


def draw_ahead(
    draw: Callable[[], np.ndarray],
    read: Callable[[np.ndarray], T],
    fetch_ahead: Callable[[np.ndarray], object],
    *,
    prefetch: int,
    batches: int | None = None,
) -> Iterator[T]:
    """Yield ``read(rows)`` for ``batches`` draws (forever when None), drawn ahead.

    Parameters
    ----------
    draw : callable
        Draws the rows of the next batch (the generator's state advances as it would
        with one ``sample()`` per batch).
    read : callable
        Reads a batch of rows.
    fetch_ahead : callable
        Starts fetching what the rows of a whole group of batches need.
    prefetch : int
        Batches drawn ahead; a new group is drawn when half of them are used (the
        first batch is drawn alone, and the first group while it is read). 0: one
        batch at a time, nothing fetched ahead.
    batches : int, optional
        How many batches in all.

    Examples
    --------
    >>> rows = iter([np.array([0]), np.array([1]), np.array([2])])
    >>> asked = []
    >>> got = draw_ahead(lambda: next(rows), lambda r: int(r[0]), asked.append,
    ...                     prefetch=2, batches=3)
    >>> list(got), [a.tolist() for a in asked]
    ([0, 1, 2], [[1, 2]])
    """
    queue: deque[np.ndarray] = deque()
    drawn = 0
    while True:
        if len(queue) <= prefetch // 2 and (batches is None or drawn < batches):
            # the first batch alone, read at once: its group's fetch would only delay it;
            # the next group is drawn and on its way while it is read
            first = drawn == 0
            count = 1 if first else max(1, prefetch)
            if batches is not None:
                count = min(count, batches - drawn)
            group = [draw() for _ in range(count)]
            drawn += count
            if prefetch and not first:
                fetch_ahead(np.concatenate(group))
            queue.extend(group)
            if first:
                continue
        if not queue:
            return
        yield read(queue.popleft())
