"""Stores opened when first read: :class:`PendingStore`, and :func:`open_all`.

A mixture of a root with a ``catalog.json`` knows each store's game, run and length
from its entry, so it opens with the catalog's one request: each store is a
:class:`PendingStore` until a batch, a stream or an attribute first needs it, and the
stores one batch needs are opened together (:func:`open_all`). A store opened late
is checked against its entry then: changed, it warns as an eager open does; changed
in length, it stops with an error, since the mixture already numbered its items.

Examples
--------
>>> from atari_zarr.catalog import content_id
>>> content = content_id(StoreReader(store_url).metadata)  # the converted Pong/1 fixture
>>> entry = {"game": "Pong", "run": "1", "transitions": 300, "content": content}
>>> p = PendingStore(store_url, entry)
>>> (p.game, p.run, len(p)), p.opened
(('Pong', '1', 300), False)
>>> len(p.episodes) > 0, p.opened  # an attribute of the store opens it
(True, True)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from zarr.core.metadata.v3 import ArrayV3Metadata

from atari_zarr.catalog import CATALOG, CatalogEntry, check_entry
from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.errors import (
    AtariZarrError,
    RemoteAccessError,
    StoreFormatError,
    StoreIncompleteError,
    StoreNotFoundError,
)
from atari_zarr.layout import OBSERVATION
from atari_zarr.read.options import ReadOptions
from atari_zarr.read.store import StoreReader
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.paths import is_url, redact

__all__ = ["OPENERS", "PendingStore", "open_all"]

T = TypeVar("T")
U = TypeVar("U")

#: Stores opened at once: opening is a few requests, mostly waiting on the network.
OPENERS = 32


def open_all(
    things: list[T],
    open_one: Callable[[T], U],
    expected: tuple[type[BaseException], ...] = (),
    *,
    remote: bool = True,
) -> list[tuple[Any, BaseException | None]]:
    """``open_one`` of each of ``things``, in order: ``(result, None)``, or
    ``(None, error)`` for an error of a type in ``expected`` (others are raised).

    Opening a store is a few requests; a mixture of 240 stores in a bucket
    (``remote``) opens them ``OPENERS`` at a time on threads, so it waits for about
    ``240 / OPENERS`` round trips of them, not 240. Local stores open one after the
    other: their opening is CPU, which threads would only contend for.

    Examples
    --------
    >>> open_all([1, 2, 0], lambda x: 6 // x, (ZeroDivisionError,))[:2]
    [(6, None), (3, None)]
    """

    def attempt(thing: T) -> tuple[Any, BaseException | None]:
        try:
            return open_one(thing), None
        except expected as exc:
            return None, exc

    if len(things) <= 1 or not remote:
        return [attempt(t) for t in things]
    threads = min(OPENERS, len(things))
    with ThreadPoolExecutor(threads, thread_name_prefix="atari_zarr-open") as pool:
        return list(pool.map(attempt, things))


class PendingStore:
    """A store known by its catalog entry, opened (a :class:`StoreReader`) on first use.

    Its ``url``, ``where``, ``options``, ``game``, ``run`` and length are the entry's,
    and :meth:`frame_rows` its ``zarr.json``'s; any other attribute is the opened
    store's. It pickles as pending.

    Parameters
    ----------
    url : str
        The store.
    entry : CatalogEntry
        Its entry in its root's ``catalog.json``.
    **open_args
        :class:`StoreReader`'s keyword arguments.
    """

    def __init__(self, url: str, entry: CatalogEntry, **open_args: Any) -> None:
        self.url, self.where, self.entry = str(url), redact(str(url)), entry
        self.game, self.run = entry["game"], entry["run"]
        self.n = int(entry["transitions"])  # type: ignore[arg-type]
        self.options: ReadOptions = open_args.get("options") or ReadOptions()
        self.remote = is_url(self.url)
        self._args = open_args
        self._store: StoreReader | None = None
        self._rows: tuple[int, int, bool] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    @property
    def opened(self) -> bool:
        """True once the store was opened."""
        return self._store is not None

    def open(self) -> StoreReader:
        """The store, opened the first time and checked against its entry."""
        with self._lock:
            if self._store is None:
                self._store = self._open()
            return self._store

    def _open(self) -> StoreReader:
        listed = f"listed in its root's {CATALOG}"
        root = self.where.rstrip("/").rsplit("/", 2)[0]
        again = f"run `atari-zarr index {root}` again and open the root again"
        try:
            store = StoreReader(self.url, **self._args)
        except (StoreNotFoundError, StoreIncompleteError) as exc:
            raise type(exc)(
                f"{self.where}, {listed}, is no longer a complete store ({exc}); {again}."
            ) from exc
        check_entry(self.entry, store.metadata, self.url)
        # what the catalog claims is checked, whatever its content id says (an entry
        # edited by hand keeps it): the mixture numbered its items by these
        if len(store) != self.n or store.game not in (None, self.game):
            raise StoreFormatError(
                f"{self.where} holds {len(store):,} transitions of {store.game}, but the "
                f"{self.n:,} of {self.game} {listed} numbered this dataset's items; {again}."
            )
        if self._rows is not None and store.frame_rows() != self._rows:
            (chunk, shard, _), (was_chunk, was_shard, _) = store.frame_rows(), self._rows
            raise StoreFormatError(
                f"{self.where} now has frame shards of {shard} rows in chunks of {chunk}, "
                f"but a stream cut its units along the {was_shard}-row shards of {was_chunk} "
                f"it had; {again}, and make the stream again."
            )
        return store

    def frame_rows(self) -> tuple[int, int, bool]:
        """:meth:`StoreReader.frame_rows`, from the store's ``zarr.json`` alone while it
        is not opened (one request, no array opened); the store is checked against it
        when it opens."""
        with self._lock:
            if self._store is None and self._rows is None:
                self._rows = self._peek()
            if self._rows is not None:
                return self._rows
        return self.open().frame_rows()

    def _peek(self) -> tuple[int, int, bool] | None:
        """The frames' chunking as the consolidated metadata says (None: not known so)."""
        try:
            fs, path = get_fs(
                self.url, self._args.get("storage_options"), timeout=self.options.timeout
            )
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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # unpickling asks before __dict__ is filled
            raise AttributeError(name)
        return getattr(self.open(), name)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "entry": self.entry, "open_args": self._args, "rows": self._rows}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["entry"], **state["open_args"])  # type: ignore[misc]
        self._rows = state.get("rows")
