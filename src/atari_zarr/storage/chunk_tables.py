"""Where the stored chunks of many arrays lie, on one axis: :class:`ChunkTables`.

A chunk of a local sharded array lies in its shard's memory map, at the offset its
shard's index gives. An engine (:class:`~atari_zarr.storage.engine.ChunkEngine`)
reads and checks each shard's index once and keeps every entry in a table. The
engines of a mixture's stores keep theirs in one ``ChunkTables``, one after another:

* engine ``e``'s chunk ``c`` is row ``chunk_base[e] + c`` of :attr:`ChunkTables.entries`
  (its offset and length in its shard);
* its shard ``s`` is row ``shard_base[e] + s`` of :attr:`ChunkTables.known` (its index
  learned) and of the tables' :class:`~atari_zarr.storage.fetch.MapTable` (its map).

So the chunks of a batch that touches hundreds of stores are located with a few array
steps for all of them (:meth:`ChunkTables.locate`), not a few steps per store. A
store read by itself has tables of its own.

The entries are address space until learned: a 50M-transition store's 3.1 million
frame chunks take 16 bytes each once its shards have been read, the shard indexes'
own size. The tables grow as engines join, keeping only the rows learned.

Examples
--------
>>> import tempfile, pathlib
>>> from atari_zarr.storage.fetch import LocalBytes
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "s0").write_bytes(b"..chunk0chunk1")
>>> tables = ChunkTables()
>>> tables.join(LocalBytes(root), lambda s: f"s{s}", chunks_per_shard=2, n_shards=1)
Rows(chunk_base=0, shard_base=0, member=0, chunks_per_shard=2)
>>> entries, known = tables.views(0, 0, chunks_per_shard=2, n_shards=1)
>>> entries[:] = [[2, 6], [8, 6]]; known[0] = True
>>> loc = tables.locate(np.array([1, 0]), np.array([0, 0]))
>>> import ctypes
>>> [ctypes.string_at(int(a), int(n)) for a, n in zip(loc.src, loc.srclen)]
[b'chunk1', b'chunk0']
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from atari_zarr.forks import after_fork
from atari_zarr.shard_format import MISSING
from atari_zarr.storage.fetch import LocalBytes, MapTable

__all__ = ["ChunkTables", "Located", "Rows"]


class Rows(NamedTuple):
    """Where one array lies in its :class:`ChunkTables` (:meth:`ChunkTables.join`)."""

    #: Row of its chunk 0 in the entries.
    chunk_base: int
    #: Row of its shard 0 in the shards learned and the maps.
    shard_base: int
    #: Its number among the arrays that joined (the row of its counters).
    member: int
    #: Chunks per shard.
    chunks_per_shard: int


class Located(NamedTuple):
    """Where chunks' stored bytes lie in this process's memory (:meth:`ChunkTables.locate`)."""

    #: ``uint64`` address of each chunk's bytes (its crc32c included); 0 where the
    #: chunk was not found in a map (absent, or its index does not fit the object).
    src: np.ndarray
    #: ``int64`` length of each.
    srclen: np.ndarray
    #: The maps the addresses point into: hold them until the chunks are decoded.
    keep: list[Any]


class _Arrays(NamedTuple):
    """The entries and the shards learned, replaced together (one attribute) as the
    tables grow, so a reader never pairs one generation's flags with the other's rows."""

    entries: np.ndarray  # (rows, 2) uint64: offset and length of each chunk in its shard
    known: np.ndarray  # bool per shard row: its index learned into ``entries``


class ChunkTables:
    """The chunk entries and shard maps of any number of arrays, on one axis each.

    An engine joins once (:meth:`join`), learns its shards into its rows
    (:meth:`views`), and anyone holding the rows of chunks of several engines locates
    them at once (:meth:`locate`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrays = _Arrays(np.empty((0, 2), dtype=np.uint64), np.zeros(0, dtype=bool))
        self.maps = MapTable()
        self._chunks = 0
        # per shard row: its first chunk row and its chunks (to keep what was learned)
        self._chunk0 = np.zeros(0, dtype=np.int64)
        self._cps = np.zeros(0, dtype=np.int64)
        # per member: chunks decoded by a compiled loop and their stored bytes
        self._counts = np.zeros((0, 2), dtype=np.int64)
        after_fork(self._renew_lock)

    def _renew_lock(self) -> None:
        """In a forked child: a lock a thread of the parent held stays held."""
        self._lock = threading.Lock()

    @property
    def known(self) -> np.ndarray:
        """Whether each shard row's index has been learned."""
        return self._arrays.known

    @property
    def entries(self) -> np.ndarray:
        """``(rows, 2)`` offset and length of each chunk row in its shard."""
        return self._arrays.entries

    def join(
        self,
        source: LocalBytes,
        key_of: Callable[[int], str],
        *,
        chunks_per_shard: int,
        n_shards: int,
    ) -> Rows:
        """An array of ``n_shards`` shards (objects ``key_of(s)`` of ``source``) of
        ``chunks_per_shard`` chunks each joins: where its rows are."""
        cps = int(chunks_per_shard)
        with self._lock:
            shard_base = self.maps.add(source, key_of, n_shards)
            chunk_base = self._chunks
            self._chunks += n_shards * cps
            shards = shard_base + n_shards
            self._chunk0 = np.concatenate(
                (self._chunk0[:shard_base], chunk_base + cps * np.arange(n_shards))
            )
            self._cps = np.concatenate((self._cps[:shard_base], np.full(n_shards, cps)))
            old = self._arrays
            if shards > len(old.known) or self._chunks > len(old.entries):
                self._arrays = self._grown(old, shards, self._chunks)
            member = len(self._counts)
            self._counts = np.concatenate((self._counts, np.zeros((1, 2), dtype=np.int64)))
            return Rows(chunk_base, shard_base, member, cps)

    def count(self, members: np.ndarray, chunks: np.ndarray, nbytes: np.ndarray) -> None:
        """Chunks ``chunks[i]`` of ``nbytes[i]`` stored bytes decoded for array
        ``members[i]`` (members unique): counted for all with one lock."""
        with self._lock:
            self._counts[members, 0] += chunks
            self._counts[members, 1] += nbytes

    def counted(self, member: int) -> tuple[int, int]:
        """Chunks counted (:meth:`count`) for array ``member``, and their stored bytes."""
        chunks, nbytes = self._counts[member].tolist()
        return chunks, nbytes

    def _grown(self, old: _Arrays, shards: int, chunks: int) -> _Arrays:
        """Larger arrays (twice at least) holding the rows learned of ``old``."""
        # the flags first: a shard learned after this line reads as unlearned in the new
        # arrays (learned again), never as learned without its rows
        known = np.zeros(max(shards, 2 * len(old.known)), dtype=bool)
        known[: len(old.known)] = old.known
        # np.empty: address space until rows are learned; only the learned are copied
        entries = np.empty((max(chunks, 2 * len(old.entries)), 2), dtype=np.uint64)
        learned = np.flatnonzero(known)
        if learned.size:
            counts = self._cps[learned]
            rows = np.repeat(self._chunk0[learned] - np.cumsum(counts) + counts, counts)
            rows += np.arange(len(rows))
            entries[rows] = old.entries[rows]
        return _Arrays(entries, known)

    def views(
        self, chunk_base: int, shard_base: int, *, chunks_per_shard: int, n_shards: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One array's rows: ``(entries, known)`` for its chunks and shards, numbered as
        in the array. Write a shard's entries before its flag; views taken before the
        tables grow may be written in vain (the shard is learned again)."""
        arrays = self._arrays
        return (
            arrays.entries[chunk_base : chunk_base + n_shards * chunks_per_shard],
            arrays.known[shard_base : shard_base + n_shards],
        )

    def unknown(self, shard_rows: np.ndarray) -> np.ndarray:
        """Those of ``shard_rows`` whose index has not been learned."""
        return shard_rows[~self._arrays.known[shard_rows]]

    def locate(self, chunk_rows: np.ndarray, shard_rows: np.ndarray) -> Located:
        """Where the chunks of rows ``chunk_rows`` (in shards of rows ``shard_rows``, all
        learned) lie in memory, their shards mapped as need be.

        A chunk whose entry is absent, whose shard is absent, or whose entry does not
        fit inside its shard's object (checked without overflow: any offset and length
        a crafted index may hold) gets address 0: the caller reads it the careful way,
        which names what is wrong.
        """
        arrays = self._arrays
        n = len(shard_rows)
        if n > 1 and bool((shard_rows[1:] >= shard_rows[:-1]).all()):  # sorted: no sort
            first = np.flatnonzero(shard_rows[1:] != shard_rows[:-1]) + 1
            uniq = shard_rows[np.concatenate(([0], first))]
            inverse = np.zeros(n, dtype=np.int64)
            inverse[first] = 1
            np.cumsum(inverse, out=inverse)
        else:
            uniq, inverse = np.unique(shard_rows, return_inverse=True)
        maps, addrs, sizes = self.maps.at(uniq)
        base, ends = addrs[inverse], sizes[inverse]
        entry = arrays.entries[chunk_rows]
        off, size = entry[:, 0], entry[:, 1]
        # an entry learned in other arrays (grown meanwhile) reads as not learned here
        unlearned = ~arrays.known[shard_rows]
        # never ``off + size``: a crafted entry (2**64 - 50, 60) wraps around to 10 in
        # uint64 and would pass, sending the compiled loop before its map
        bad = (off == MISSING) | (off > ends) | (size > ends - np.minimum(off, ends))
        bad |= (base == 0) | unlearned
        src = base + off
        src[bad] = 0
        srclen = size.astype(np.int64)
        srclen[bad] = 0
        return Located(src, srclen, [maps])
