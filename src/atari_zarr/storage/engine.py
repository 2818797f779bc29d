"""The one engine every reader calls: plan the byte ranges of chunks, fetch, verify, decode.

zarr-python's generic indexing costs about 1 ms per chunk it touches, while
decoding a 16-frame Blosc chunk costs 20-50 µs (``docs/codec-choice.md``). The
readers of this package (random access in :mod:`atari_zarr.read.chunks`, the epoch
stream and windows in :mod:`atari_zarr.read.stream`, and :mod:`atari_zarr.verify`'s
checks of every object) therefore read the bytes a
zarr client would read, without its machinery, and all through one
:class:`ChunkEngine` per array:

* **where a chunk lies** (:class:`ChunkGrid`): the array's chunking and codecs as
  :func:`atari_zarr.codec_chain.row_chunks` recognises them, and each shard's
  index, read once (a range at the start of the shard object, or its last bytes
  when the index is stored at the end), checked and kept in a bounded cache;
* **fetching** (:meth:`ChunkEngine.fetch` for scattered chunks, with ranges of one
  shard merged into one request over a network; :meth:`ChunkEngine.fetch_span`
  for a run of chunks, a whole shard object with one request): at most two
  rounds of concurrent requests, the second only for chunks whose shard index
  was not known before;
* **verifying and decoding** (:meth:`ChunkEngine.decode`): every chunk's length,
  crc32c and Blosc header are checked, then Blosc decodes it straight into its
  destination (:func:`blosc_decoder`: c-blosc2 where python-blosc2 is installed,
  the base install, else numcodecs' c-blosc1; :func:`background_decoder` for a
  thread that decodes beside a Python loop, as the stream's units are). A damaged
  chunk raises :class:`~atari_zarr.errors.StoreCorruptError` naming the store,
  array, chunk, rows, object and bytes.

Layouts the engine does not recognise (other codecs, chunks that split rows,
big-endian data) are read through zarr-python (:attr:`ChunkEngine.fast` is False):
the same values, only slower. The module is generic (any Zarr v3 array, no Atari
names).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import zarr

from atari_zarr.codec_chain import UnsupportedChunks, row_chunks
from atari_zarr.errors import StoreCorruptError
from atari_zarr.fingerprints import foreign_object_message, object_crc, recorded
from atari_zarr.forks import after_fork
from atari_zarr.resources import cpu_count
from atari_zarr.shard_format import MISSING, check_crc, index_size, parse_index
from atari_zarr.storage.blosc import blosc_decoder, libblosc2_decoder
from atari_zarr.storage.chunk_loop import ChunkLoop, Destinations, RowCopies
from atari_zarr.storage.chunk_tables import ChunkTables, Located, Rows
from atari_zarr.storage.fetch import LocalBytes, StoreBytes, byte_source
from atari_zarr.storage.kept import DEFAULT_KEPT_BYTES, KeptBytes, KeptView
from atari_zarr.storage.ranges import DEFAULT_COALESCE_GAP, ByteRange, coalesce_ranges

__all__ = [
    "DEFAULT_REMEDY",
    "ChunkEngine",
    "ChunkGrid",
    "EncodedChunk",
    "background_decoder",
    "blosc_decoder",
    "corrupt_chunk",
    "decode_chunk",
]

log = logging.getLogger("atari_zarr")

#: What a damaged-chunk error tells the user to do, unless the caller knows better.
DEFAULT_REMEDY = "write it again, or copy the object again if it was transferred."
# At most this many chunks are located one by one, without array steps (a mixture's store).
_FEW_CHUNKS = 4
# Shard indexes kept per array (4 KB each for 4096-frame shards of 16-frame chunks).
_INDEX_CACHE = 16384


def background_decoder() -> Callable[[Any, np.ndarray], Any]:
    """The decoder for a thread that decodes while a Python loop runs beside it.

    The epoch stream decodes its units on a thread of their own while the loop that
    gathers batches runs on the main thread. python-blosc2 holds the GIL while it
    decodes, so that loop would wait for every chunk decoded; c-blosc2 called through
    ctypes (:func:`~atari_zarr.storage.blosc.libblosc2_decoder`) releases it at the
    same speed per chunk, and numcodecs' c-blosc1, where that does not load, releases
    it at about half the speed (``docs/benchmarks/stream.md``). On one core nothing
    runs beside the decoding, and :func:`blosc_decoder`'s default is used.

    Examples
    --------
    >>> from numcodecs import Blosc
    >>> data = Blosc(cname="zstd").encode(np.arange(16, dtype=np.uint8))
    >>> out = np.empty(16, dtype=np.uint8)
    >>> _ = background_decoder()(data, out)
    >>> int(out[-1])
    15
    """
    if cpu_count() <= 1:
        return blosc_decoder()
    return blosc_decoder("libblosc2" if libblosc2_decoder() is not None else "numcodecs")


def decode_chunk(
    src: Any,
    dest: np.ndarray,
    *,
    checksum: bool,
    chunk_nbytes: int,
    decoder: Callable[[Any, np.ndarray], Any] | None = None,
) -> str | None:
    """Check one stored chunk (crc32c, Blosc header, size) and decode it into ``dest``.

    Returns None when it decoded, else what is wrong with it, for the caller's
    :func:`corrupt_chunk` message. ``decoder`` is :func:`blosc_decoder`'s by default.

    Examples
    --------
    >>> import numpy as np
    >>> from numcodecs import Blosc
    >>> data = Blosc(cname="zstd").encode(np.arange(16, dtype=np.uint8))
    >>> out = np.empty(16, dtype=np.uint8)
    >>> decode_chunk(data, out, checksum=False, chunk_nbytes=16), int(out[-1])
    (None, 15)
    >>> decode_chunk(data, out, checksum=True, chunk_nbytes=16)
    'fails its crc32c check'
    """
    if checksum:
        if not check_crc(src):
            return "fails its crc32c check"
        src = src[:-4]
    # Blosc header: nbytes (decoded) at bytes 4-8, cbytes (encoded) at 12-16.
    head = bytes(src[:16])
    if len(head) < 16 or int.from_bytes(head[12:16], "little") != len(src):
        return "is not a whole Blosc buffer"
    nbytes = int.from_bytes(head[4:8], "little")
    if nbytes != chunk_nbytes:
        return f"decodes to {nbytes} bytes, expected {chunk_nbytes}"
    try:
        (decoder or blosc_decoder())(src, dest)
    except Exception as exc:
        return f"does not decode ({exc})"
    return None


def corrupt_chunk(
    where: str,
    name: str,
    chunk: int,
    rows: tuple[int, int],
    key: str,
    span: tuple[int, int] | None,
    what: str,
    remedy: str,
) -> StoreCorruptError:
    """The one message of a damaged chunk: store, array, chunk, rows, object, bytes, problem."""
    where_bytes = f" (bytes {span[0]}-{span[0] + span[1] - 1})" if span is not None else ""
    return StoreCorruptError(
        f"{where}: chunk {chunk} of array {name!r} (rows {rows[0]}-{rows[1]}), stored in "
        f"{key!r}{where_bytes}, {what}. The store is damaged; {remedy}"
    )


def _noted(err: StoreCorruptError, note: str | None) -> StoreCorruptError:
    """``err`` with ``note`` (what a copy fetched anew showed) added as its last sentence."""
    if not note:
        return err
    return StoreCorruptError(f"{str(err).rstrip('.')}. {note}")


class ChunkGrid:
    """Where the chunks of an array lie, derived from its metadata.

    Raises :class:`~atari_zarr.codec_chain.UnsupportedChunks` for layouts the
    engine does not handle (the shared check of the shard encoder too).
    """

    def __init__(self, array: zarr.Array) -> None:
        chain = row_chunks(array)
        meta = array.metadata
        self.shape = tuple(array.shape)
        self.row_shape = self.shape[1:]
        self.dtype = np.dtype(array.dtype)
        self.sharded = chain.shard_rows is not None
        self.shard_rows = chain.shard_rows
        self.index_at_start = chain.index_at_start
        self.checksum = chain.checksum
        self.chunk_rows = chain.chunk_rows
        #: Chunks per shard (1 for an unsharded array: every chunk is an object).
        self.chunks_per_shard = (
            chain.shard_rows // chain.chunk_rows if chain.shard_rows is not None else 1
        )
        #: Bytes of a shard index: an offset and a length per chunk, and a crc32c.
        self.index_size = index_size(self.chunks_per_shard)
        self.n_chunks = -(-self.shape[0] // self.chunk_rows)
        #: Objects along the rows: shards (or chunks, where unsharded).
        self.n_shards = -(-self.n_chunks // self.chunks_per_shard)
        self.chunk_shape = (self.chunk_rows, *self.row_shape)
        self.chunk_nbytes = int(np.prod(self.chunk_shape)) * self.dtype.itemsize
        fill = meta.fill_value
        self.fill_value = np.asarray(fill if fill is not None else 0, dtype=self.dtype)
        self.path = array.store_path.path
        self.encode_key = meta.encode_chunk_key
        self._keys: dict[int, str] = {}

    def object_key(self, coord: int) -> str:
        """Key of stored object ``coord`` along the rows: a shard, or an unsharded chunk."""
        key = self._keys.get(coord)
        if key is None:
            key = self.encode_key((coord, *([0] * len(self.row_shape))))
            key = self._keys[coord] = f"{self.path}/{key}" if self.path else key
        return key


class EncodedChunk(NamedTuple):
    """The stored bytes of one chunk, as fetched, and where they came from."""

    #: Chunk number along the rows.
    cid: int
    #: The bytes (a read-only buffer), or None when the chunk (or its shard) is absent.
    data: Any
    #: Object holding it.
    key: str
    #: Offset of the chunk in its object (None: the chunk is a whole object).
    offset: int | None
    #: Length the shard index gives (None: a whole object, length unknown).
    size: int | None


class ChunkEngine:
    """Chunk bytes of one Zarr v3 array: located, fetched, verified and decoded.

    Parameters
    ----------
    array : zarr.Array
        Any array; rows are along axis 0.
    where : str
        URL or path of the store, for error messages (credentials removed).
    remedy : str, optional
        What to do about a damaged chunk, ending the error message.
    coalesce_gap : int
        Byte ranges of one shard at most this many bytes apart are fetched with one
        request (remote stores only; -1: never merge).
    kept_bytes : int
        Bound on the encoded bytes remote requests brought that are kept in memory
        (:class:`~atari_zarr.storage.kept.KeptBytes`: the one encoded-byte cache of
        the array, which what is fetched ahead waits in too; 0 keeps nothing).
    shared : KeptBytes, optional
        The encoded-byte cache several arrays share (a mixture's stores, each joining
        with its ``kept_bytes``); default one of the array's own.
    tables : ChunkTables, optional
        Where the chunks of several local arrays are located together (a mixture's
        stores: :class:`~atari_zarr.storage.chunk_tables.ChunkTables`); default tables
        of the array's own.

    Attributes
    ----------
    stats : dict
        ``requests`` (asked of a remote store, after merging), ``fetched_bytes``
        (encoded bytes of the chunks decoded), ``decoded`` (chunks), ``kept_hits``
        (ranges served from the bytes kept).

    Examples
    --------
    >>> import numpy as np, zarr
    >>> from zarr.codecs import BloscCodec, Crc32cCodec
    >>> a = zarr.create_array({}, shape=(100, 3), chunks=(8, 3), shards=(32, 3), dtype="int16",
    ...                       compressors=[BloscCodec(cname="zstd"), Crc32cCodec()])
    >>> a[:] = np.arange(300).reshape(100, 3)
    >>> engine = ChunkEngine(a, where="memory")
    >>> [chunk] = engine.fetch([12])
    >>> out = np.empty((8, 3), dtype="int16")
    >>> engine.decode(chunk, out) > 0  # encoded bytes decoded
    True
    >>> out[0].tolist()
    [288, 289, 290]
    """

    def __init__(
        self,
        array: zarr.Array,
        *,
        where: str,
        remedy: str | None = None,
        coalesce_gap: int = DEFAULT_COALESCE_GAP,
        kept_bytes: int = DEFAULT_KEPT_BYTES,
        shared: KeptBytes | None = None,
        tables: ChunkTables | None = None,
    ) -> None:
        self.array = array
        self.where = where
        self.remedy = remedy or DEFAULT_REMEDY
        self.name = array.path or array.name
        self.coalesce_gap = coalesce_gap
        self._stats = {"requests": 0, "fetched_bytes": 0, "decoded": 0, "kept_hits": 0}
        try:
            self.grid: ChunkGrid | None = ChunkGrid(array)
        except UnsupportedChunks as exc:
            log.info("%s/%s: generic zarr reads (%s)", where, self.name, exc)
            self.grid = None
        from atari_zarr.storage.cache import RangeCacheStore

        store = array.store_path.store
        self.bytes = byte_source(store)
        # The range cache keeps each range asked for as one file: merged ranges differ
        # from batch to batch, so the next epoch would find none of them. Per-chunk
        # ranges there, which it serves again whatever the rows.
        # A cache of whole objects reads ranges from local files: nothing to merge.
        self.merge = (
            self.bytes.remote
            and not isinstance(store, RangeCacheStore)
            and not getattr(store, "local_ranges", False)
        )
        #: What remote requests brought: the array's one encoded-byte cache, or its
        #: part of the one its mixture's stores share (their bound the sum of theirs).
        kept_bytes = kept_bytes if self.bytes.remote else 0
        self.kept: KeptBytes | KeptView = (
            shared.join(kept_bytes) if shared is not None and kept_bytes else KeptBytes(kept_bytes)
        )
        self._indexes: OrderedDict[int, np.ndarray | None] = OrderedDict()
        self._index_lock = threading.Lock()
        #: True when :meth:`locate` finds chunks in memory: a local sharded array.
        self.locatable = (
            self.grid is not None
            and self.grid.sharded
            and isinstance(self.bytes, LocalBytes)
            and not self.bytes.remote
        )
        #: What a compiled loop needs alike of the arrays it decodes in one run (decoded
        #: chunk bytes, crc32c or not); None where :meth:`locate` finds nothing.
        self.loop_kind = (
            (self.grid.chunk_nbytes, self.grid.checksum)
            if self.locatable and self.grid is not None
            else None
        )
        # every chunk's (offset, length) in its shard, for :meth:`locate`: in the tables
        # given (a mixture's) or its own, joined on first use and filled a shard at a time
        self._tables = tables
        self._joined: tuple[ChunkTables, Rows] | None = None
        #: The crc32c its writer recorded for each object (None: none recorded).
        self.fingerprints = recorded(array) if self.grid is not None else None
        self._stats_lock = threading.Lock()
        #: A chunk with no bytes (no object, or no entry in its shard's index) is damage,
        #: not the fill value: set by :meth:`guard` for a store marked complete.
        self.missing_is_damage = False
        self._on_damage: Callable[[StoreCorruptError], Exception] | None = None
        # objects whose local copy was thrown away and fetched anew (a note for each):
        # the other damaged chunks of the same bytes are read from the new copy, not
        # each one more download of the whole object
        self._renewed: dict[str, str] = {}
        after_fork(self._renew_locks)

    def _renew_locks(self) -> None:
        """In a forked child: a lock a reading thread of the parent held stays held."""
        self._index_lock, self._stats_lock = threading.Lock(), threading.Lock()

    def guard(self, on_damage: Callable[[StoreCorruptError], Exception] | None = None) -> None:
        """Read as a store marked complete: every chunk of it was written.

        A chunk found missing is then damage (:class:`StoreCorruptError` naming the
        object and its rows) instead of zarr's fill value, and every damaged-chunk
        error goes through ``on_damage``, which may give another error instead (the
        store changed while it was being read, say).
        """
        self.missing_is_damage = True
        self._on_damage = on_damage

    def _damaged(self, err: StoreCorruptError) -> Exception:
        return err if self._on_damage is None else self._on_damage(err)

    @property
    def fast(self) -> bool:
        """True when chunks are read by the engine, False when through zarr-python."""
        return self.grid is not None

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``requests`` (ranges asked of a remote store), ``fetched_bytes``
        (stored chunk bytes used), ``decoded`` (chunks) and ``kept_hits``; those a
        mixture's batches counted in its chunk tables included."""
        out = dict(self._stats)
        if self._joined is not None:
            chunks, nbytes = self._joined[0].counted(self._joined[1].member)
            out["decoded"] += chunks
            out["fetched_bytes"] += nbytes
        return out

    def _count(self, key: str, n: int) -> None:
        with self._stats_lock:
            self._stats[key] += n

    def count_decoded(self, chunks: int, nbytes: int) -> None:
        """Add to the ``decoded`` and ``fetched_bytes`` counters (once per group of chunks)."""
        with self._stats_lock:
            self._stats["decoded"] += chunks
            self._stats["fetched_bytes"] += nbytes

    # -- requests ---------------------------------------------------------------------
    def get(self, ranges: Sequence[ByteRange], *, merge: bool | None = None) -> list[Any]:
        """Bytes of ``ranges`` in one round of requests.

        Over a network (unless ``merge=False``), bounded ranges already kept are
        taken from memory and what each request brought is kept; outside a range
        cache, the others of one object lying close together are fetched with one
        request (never bridging bytes kept).
        """
        remote = self.bytes.remote
        if merge is False or not remote or (not self.merge and not self.kept.max_bytes):
            if remote:
                self._count("requests", len(ranges))
            return self.bytes.get(ranges)
        out: list[Any] = [None] * len(ranges)
        bounded: list[int] = []
        others: list[int] = []
        for i, r in enumerate(ranges):
            if not r.bounded:
                others.append(i)
                continue
            at_hand = self.kept.get(r.key, int(r.start), int(r.stop))  # type: ignore[arg-type]
            if at_hand is None:
                bounded.append(i)
            else:
                out[i] = at_hand
        if len(bounded) < len(ranges) - len(others):
            self._count("kept_hits", len(ranges) - len(others) - len(bounded))
        spans = [(ranges[i].key, int(ranges[i].start), int(ranges[i].stop)) for i in bounded]  # type: ignore[arg-type]
        gap = self.coalesce_gap if self.merge else -1
        merged, parts = coalesce_ranges(spans, gap, held=self.kept.holds)
        if not merged and not others:
            return out
        data = self.bytes.get([*merged, *(ranges[i] for i in others)])
        self._count("requests", len(merged) + len(others))
        for rng, got in zip(merged, data, strict=False):
            start, stop = int(rng.start or 0), int(rng.stop or 0)
            if got is not None and len(got) == stop - start:  # not cut short
                self.kept.add(rng.key, start, got)
        for i, (m, off, length) in zip(bounded, parts, strict=True):
            d = data[m]
            out[i] = None if d is None else d[off : off + length]
        for j, i in enumerate(others):
            out[i] = data[len(merged) + j]
        return out

    # -- shard indexes ------------------------------------------------------------------
    def index_range(self, shard: int) -> ByteRange:
        """Where shard ``shard``'s index lies in its object."""
        g = self.grid
        assert g is not None
        key = g.object_key(shard)
        if g.index_at_start:
            return ByteRange(key, 0, g.index_size)
        return ByteRange.suffix(key, g.index_size)

    def _cached_index(self, shard: int) -> tuple[bool, np.ndarray | None]:
        with self._index_lock:
            if shard in self._indexes:
                self._indexes.move_to_end(shard)
                return True, self._indexes[shard]
        return False, None

    def _keep_index(self, shard: int, index: np.ndarray | None) -> None:
        with self._index_lock:
            self._indexes[shard] = index
            self._indexes.move_to_end(shard)
            while len(self._indexes) > _INDEX_CACHE:
                self._indexes.popitem(last=False)

    def _parse_index(self, shard: int, raw: Any) -> np.ndarray:
        g = self.grid
        assert g is not None
        key = g.object_key(shard)
        note = None
        for _ in range(2):
            try:
                index = parse_index(
                    raw, size=g.index_size, where=self.where, name=self.name, key=key,
                    remedy=self.remedy,
                )  # fmt: skip
                self.check_fingerprint(shard, raw)
                return index  # type: ignore[no-any-return]
            except StoreCorruptError as err:
                if note is not None or (note := self._again(key)) is None:
                    raise self._damaged(_noted(err, note)) from None
                log.debug("%s: %s; fetching it again", self.where, err)
                [raw] = self.get([self.index_range(shard)], merge=False)
                if raw is None:
                    raise self._damaged(_noted(err, note)) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _again(self, key: str) -> str | None:
        """Forget what is kept of object ``key``, which failed a check, so that the next
        read fetches it anew: the bytes kept in memory, and a local cache's copy of the
        whole object (thrown away). None where nothing comes anew (a local store); else
        what a message of the same failure then adds ("" where no copy was on disk)."""
        if not self.bytes.remote:
            return None
        self.kept.forget(key)
        if key in self._renewed:  # already fetched anew by this reader: read that copy
            return self._renewed[key]
        note = self.bytes.discard(key) if isinstance(self.bytes, StoreBytes) else ""
        self._renewed[key] = note
        return note

    def _fingerprinted(self, coord: int, key: str, raw: Any) -> Any:
        """The whole object ``raw`` of ``coord`` once its recorded crc32c holds; fetched
        once more where a copy kept of it fails (a remote store's)."""
        try:
            self.check_fingerprint(coord, raw)
            return raw
        except StoreCorruptError as err:
            note = self._again(key)
            if note is None:
                raise self._damaged(err) from None
            [again] = self.get([ByteRange.whole(key)], merge=False)
            try:
                if again is None:
                    raise err from None
                self.check_fingerprint(coord, again)
            except StoreCorruptError as err2:
                raise self._damaged(_noted(err2, note)) from None
            return again

    def check_fingerprint(self, coord: int, raw: Any) -> None:
        """Refuse object ``coord`` whose crc32c (the last 4 bytes of ``raw``, its shard
        index or its whole bytes) is not the one recorded: another writer's object."""
        want = self.fingerprints
        if want is None or coord >= len(want) or want[coord] == 0 or len(raw) < 4:
            return
        found = object_crc(raw)
        if found != int(want[coord]):
            assert self.grid is not None
            raise StoreCorruptError(
                foreign_object_message(
                    self.where, self.name, self.grid.object_key(coord), int(want[coord]), found
                )
            )

    def index_of_buffer(self, shard: int, buf: Any) -> np.ndarray:
        """The index of a whole shard object ``buf``, parsed, checked and kept."""
        g = self.grid
        assert g is not None
        raw = buf[: g.index_size] if g.index_at_start else buf[len(buf) - g.index_size :]
        index = self._parse_index(shard, raw)
        self._keep_index(shard, index)
        return index

    def indexes(self, shards: Iterable[int]) -> dict[int, np.ndarray | None]:
        """The index of each shard (None: the shard object is absent), fetching unknown ones."""
        out: dict[int, np.ndarray | None] = {}
        todo = []
        for s in sorted(set(shards)):
            known, index = self._cached_index(s)
            if known:
                out[s] = index
            else:
                todo.append(s)
        if todo:
            raws = self.get([self.index_range(s) for s in todo], merge=False)
            for s, raw in zip(todo, raws, strict=True):
                index = None if raw is None else self._parse_index(s, raw)
                self._keep_index(s, index)
                out[s] = index
        return out

    def chunk_in(self, c: int, index: np.ndarray | None) -> tuple[str, int | None, int | None]:
        """``(key, offset, length)`` of chunk ``c`` given its shard's index (None: absent,
        its entry Zarr's marker of an absent chunk, both ``2**64 - 1``)."""
        g = self.grid
        assert g is not None
        cps = g.chunks_per_shard
        key = g.object_key(c // cps)
        off, size = index[c % cps].tolist() if index is not None else (MISSING, MISSING)
        if off == MISSING and size == MISSING:
            return key, None, None
        # any other entry is fetched as it says (half an absent marker too): what does not
        # fit its object comes back cut short, and is named
        return key, int(off), int(size)

    # -- fetching -----------------------------------------------------------------------
    def fetch(self, cids: Sequence[int]) -> list[EncodedChunk]:
        """The encoded bytes of chunks ``cids`` (any order), in one or two rounds of requests.

        Over a network, ranges of one shard close together are one request
        (``coalesce_gap``).
        """
        g = self.grid
        assert g is not None, "the generic path reads through zarr"
        cids = [int(c) for c in cids]
        if not g.sharded:
            keys = [g.object_key(c) for c in cids]
            data = self.get([ByteRange.whole(k) for k in keys])
            for i, (c, d) in enumerate(zip(cids, data, strict=True)):
                if d is not None:
                    data[i] = self._fingerprinted(c, keys[i], d)
            return [
                EncodedChunk(c, d, k, None, None) for c, d, k in zip(cids, data, keys, strict=True)
            ]
        cps = g.chunks_per_shard
        indexes = self.indexes(c // cps for c in cids)
        ranges: list[ByteRange] = []
        located: list[tuple[int, str, int | None, int | None, int | None]] = []
        for c in cids:
            key, off, size = self.chunk_in(c, indexes[c // cps])
            if off is None:
                located.append((c, key, None, None, None))
            else:
                assert size is not None
                located.append((c, key, off, size, len(ranges)))
                ranges.append(ByteRange(key, off, off + size))
        data = self.get(ranges)
        return [
            EncodedChunk(c, None if i is None else data[i], key, off, size)
            for c, key, off, size, i in located
        ]

    def fetch_span(
        self, lo: int, hi: int, extra: Sequence[int] = ()
    ) -> tuple[list[EncodedChunk], list[EncodedChunk]]:
        """Chunks of rows ``[lo, hi)`` (inside one shard), and chunks ``extra``, fetched at once.

        A span that is a whole shard is fetched as the whole shard object with one
        request (its index comes with it); a shorter span as one range from its
        first to its last chunk. ``extra`` chunks (other shards' edges, say) are
        fetched in the same round when their shard's index is known, else in a
        second round after it.

        Returns
        -------
        span : list of EncodedChunk
            The chunks covering ``[lo, hi)``, in order.
        extra : list of EncodedChunk
            The chunks ``extra``, in the order given.
        """
        g = self.grid
        assert g is not None and g.sharded and g.shard_rows is not None
        cr, cps = g.chunk_rows, g.chunks_per_shard
        c0, c1 = lo // cr, -(-hi // cr)
        shard = lo // g.shard_rows
        if (hi - 1) // g.shard_rows != shard:
            raise ValueError(f"rows {lo}-{hi - 1} are not inside one shard of {g.shard_rows}")
        start = shard * g.shard_rows
        whole = lo == start and hi == min(start + g.shard_rows, g.shape[0])
        extra = [int(c) for c in extra]
        known: dict[int, np.ndarray | None] = {}
        unknown: set[int] = set()
        for s in {c // cps for c in extra} | (set() if whole else {shard}):
            ok, index = self._cached_index(s)
            if ok:
                known[s] = index
            else:
                unknown.add(s)
        key = g.object_key(shard)

        def span_range(index: np.ndarray | None) -> ByteRange | None:
            if index is None:
                return None
            rows = index[c0 % cps : (c1 - 1) % cps + 1]
            present = rows[rows[:, 0] != MISSING]
            if not len(present):
                return None
            # the ends saturate at 2**64 - 1: a crafted entry must not wrap around in
            # uint64 to a short range (it is then fetched cut short, and named)
            ends = present[:, 0] + np.minimum(present[:, 1], MISSING - present[:, 0])
            a, b = int(present[:, 0].min()), int(ends.max())
            return ByteRange(key, a, b)

        # round 1: the whole shard, unknown indexes, and what known indexes locate
        first: list[ByteRange] = []
        if whole:
            first.append(ByteRange.whole(key))
        elif shard in known:
            rng = span_range(known[shard])
            if rng is not None:
                first.append(rng)
        n_span = len(first)
        index_order = sorted(unknown)
        first.extend(self.index_range(s) for s in index_order)
        ready = [c for c in extra if c // cps in known]
        first_extra = []
        for c in ready:
            ckey, off, size = self.chunk_in(c, known[c // cps])
            if off is not None and size is not None:
                first_extra.append((c, len(first)))
                first.append(ByteRange(ckey, off, off + size))
        got = self.get(first, merge=False) if first else []
        span_buf, span_base = (got[0], 0) if n_span else (None, 0)
        if n_span and not whole:
            span_base = int(first[0].start)  # type: ignore[arg-type]
        for s, raw in zip(index_order, got[n_span : n_span + len(index_order)], strict=True):
            index = None if raw is None else self._parse_index(s, raw)
            self._keep_index(s, index)
            known[s] = index
        if whole:
            known[shard] = None if span_buf is None else self.index_of_buffer(shard, span_buf)
        extra_data: dict[int, Any] = {c: got[i] for c, i in first_extra}
        # round 2: what the indexes of round 1 located
        second: list[ByteRange] = []
        span_second = False
        if not whole and n_span == 0:
            rng = span_range(known[shard])
            if rng is not None:
                second.append(rng)
                span_second = True
        late = []
        for c in extra:
            if c in extra_data or c // cps not in unknown:
                continue
            ckey, off, size = self.chunk_in(c, known[c // cps])
            if off is not None and size is not None:
                late.append((c, len(second)))
                second.append(ByteRange(ckey, off, off + size))
        if second:
            got2 = self.get(second, merge=False)
            if span_second:
                span_buf, span_base = got2[0], int(second[0].start)  # type: ignore[arg-type]
            for c, i in late:
                extra_data[c] = got2[i]
        index = known[shard]
        span = []
        for c in range(c0, c1):
            ckey, off, size = self.chunk_in(c, index)
            if off is None or span_buf is None:
                span.append(EncodedChunk(c, None, ckey, None, None))
            else:
                assert size is not None
                a = off - span_base
                span.append(EncodedChunk(c, span_buf[a : a + size], ckey, off, size))
        out_extra = []
        for c in extra:
            ckey, off, size = self.chunk_in(c, known[c // cps])
            out_extra.append(EncodedChunk(c, extra_data.get(c), ckey, off, size))
        return span, out_extra

    # -- decoding -----------------------------------------------------------------------
    def decode_into(
        self,
        cids: Sequence[int],
        dests: Sequence[np.ndarray],
        decoder: Callable[[Any, np.ndarray], Any] | None = None,
    ) -> None:
        """Fetch, verify and decode chunks ``cids`` into ``dests`` (whole chunks each),
        with ``decoder`` (default :func:`blosc_decoder`'s).

        Chunks of a local sharded array take the short way: each is sliced from its
        shard's memory map, its crc32c and Blosc header checked, and decoded, a few
        microseconds of Python each. Random access far beyond the cache decodes about
        300 chunks a batch, and the steps of :meth:`fetch` and :meth:`decode` cost
        more than the decoding did. Anything else, and any chunk the short way finds
        absent or wrong, goes through :meth:`fetch` and :meth:`decode`, which refetch,
        judge and name the problem. The counters are kept as by those.
        """
        g = self.grid
        assert g is not None
        mapped = getattr(self.bytes, "mapped", None)
        if mapped is None or self.bytes.remote or not g.sharded or not g.checksum:
            self.decode_all(self.fetch(list(cids)), dests, decoder)
            return
        import google_crc32c

        crc, decode = google_crc32c.value, decoder or blosc_decoder()
        cps, want = g.chunks_per_shard, g.chunk_nbytes
        indexes = self.indexes(int(c) // cps for c in cids)
        maps: dict[int, Any] = {}
        slow_cids: list[int] = []
        slow_dests: list[np.ndarray] = []
        nbytes = 0
        for c, dest in zip(cids, dests, strict=True):
            shard, at = divmod(int(c), cps)
            index = indexes[shard]
            mm = maps.get(shard)
            if mm is None and index is not None:
                mm = maps[shard] = mapped(g.object_key(shard))
            if (
                index is None
                or mm is None
                or index[at, 0] == MISSING
                or dest.nbytes != want
                or not dest.flags.c_contiguous
            ):
                slow_cids.append(int(c))
                slow_dests.append(dest)
                continue
            off, size = int(index[at, 0]), int(index[at, 1])
            data = mm[off : off + size]
            body = data[:-4]
            if (
                len(data) != size  # past the end of the object: a slice stops short there
                or len(data) < 20
                or crc(body) != int.from_bytes(data[-4:], "little")
                or int.from_bytes(body[4:8], "little") != want
                or int.from_bytes(body[12:16], "little") != len(body)
            ):
                slow_cids.append(int(c))
                slow_dests.append(dest)
                continue
            try:
                decode(body, dest)
            except Exception:
                slow_cids.append(int(c))
                slow_dests.append(dest)
                continue
            nbytes += len(data)
        self.count_decoded(len(cids) - len(slow_cids), nbytes)
        if slow_cids:
            self.decode_all(self.fetch(slow_cids), slow_dests, decoder)

    def locate(self, cids: np.ndarray) -> Located | None:
        """Where the stored bytes of chunks ``cids`` lie in memory, for a compiled loop
        (:class:`~atari_zarr.storage.chunk_loop.ChunkLoop`) to check and decode them.

        Only a local sharded array's chunks lie in memory (its shards' maps); None for
        any other. A chunk whose shard or entry is absent, or whose index entry does not
        fit inside its object, gets address 0: the caller reads it the careful way
        (:meth:`settle`). Unknown shard indexes are read first (and checked, as
        :meth:`indexes` does). The work is a few array operations
        (:meth:`ChunkTables.locate <atari_zarr.storage.chunk_tables.ChunkTables.locate>`):
        no step per chunk or per shard.
        """
        g = self.grid
        if g is None or not self.locatable:
            return None
        cids = np.asarray(cids, dtype=np.int64)
        if len(cids) <= _FEW_CHUNKS:  # a mixture's store with a chunk or two: no array steps
            return self._locate_few(cids.tolist())
        tables, rows = self.rows()
        shard_rows = rows.shard_base + cids // g.chunks_per_shard
        self.learn(tables.unknown(shard_rows) - rows.shard_base)
        return tables.locate(rows.chunk_base + cids, shard_rows)

    def _locate_few(self, cids: list[int]) -> Located:
        g = self.grid
        assert g is not None and isinstance(self.bytes, LocalBytes)
        cps = g.chunks_per_shard
        shards = [c // cps for c in cids]
        table, known = self._chunk_table()
        unknown = [s for s in shards if not known[s]]
        if unknown:
            self.learn(unknown)
            table, known = self._chunk_table()
        maps, addrs = self.bytes.mapped_at([g.object_key(s) for s in shards])
        src, srclen = [], []
        for c, s, mm, addr in zip(cids, shards, maps, addrs, strict=True):
            off, size = table[c].tolist()  # Python ints: off + size never wraps around
            if addr == 0 or not known[s] or off == MISSING or off + size > len(mm):
                src.append(0)
                srclen.append(0)
            else:
                src.append(addr + off)
                srclen.append(size)
        return Located(np.array(src, dtype=np.uint64), np.array(srclen, dtype=np.int64), maps)

    def learn(self, shards: Iterable[int] | np.ndarray) -> None:
        """Put the indexes of ``shards`` into the chunk tables (reading them as needed),
        each shard's entries before its flag."""
        shards = np.unique(np.asarray(shards, dtype=np.int64)).tolist()
        if not shards:
            return
        assert self.grid is not None
        cps = self.grid.chunks_per_shard
        indexes = self.indexes(shards)
        table, known = self._chunk_table()
        for s, index in indexes.items():
            table[s * cps : (s + 1) * cps] = MISSING if index is None else index
            known[s] = True

    def rows(self) -> tuple[ChunkTables, Rows]:
        """The chunk tables of this array (its own, or its mixture's), and where its rows
        are in them (joined on first use)."""
        joined = self._joined
        if joined is None:
            g = self.grid
            assert g is not None and isinstance(self.bytes, LocalBytes)
            with self._index_lock:
                joined = self._joined
                if joined is None:
                    tables = self._tables if self._tables is not None else ChunkTables()
                    rows = tables.join(
                        self.bytes,
                        g.object_key,
                        chunks_per_shard=g.chunks_per_shard,
                        n_shards=g.n_shards,
                    )
                    joined = self._joined = (tables, rows)
        return joined

    def _chunk_table(self) -> tuple[np.ndarray, np.ndarray]:
        """This array's rows of its chunk tables: entries by chunk, learned by shard."""
        g = self.grid
        assert g is not None
        tables, rows = self.rows()
        return tables.views(
            rows.chunk_base,
            rows.shard_base,
            chunks_per_shard=g.chunks_per_shard,
            n_shards=g.n_shards,
        )

    def settle(
        self,
        cids: Sequence[int] | np.ndarray,
        dests: Sequence[np.ndarray],
        located: Located,
        status: np.ndarray,
    ) -> None:
        """Count the chunks a compiled loop decoded (``status`` 0), and read the others
        the careful way (:meth:`fetch`, :meth:`decode`), which refetches, judges and names
        what is wrong with them."""
        done = status == 0
        slow = np.flatnonzero(~done).tolist()
        self.count_decoded(int(done.sum()), int(located.srclen[done].sum()))
        if slow:
            self.decode_all(self.fetch([int(cids[i]) for i in slow]), [dests[i] for i in slow])

    def decode_all(
        self,
        chunks: Sequence[EncodedChunk],
        dests: Sequence[np.ndarray],
        decoder: Callable[[Any, np.ndarray], Any] | None = None,
    ) -> None:
        """:meth:`decode` each of ``chunks`` into its ``dests``, counted once for all
        (``decoder`` as :meth:`decode`'s)."""
        nbytes = 0
        for chunk, dest in zip(chunks, dests, strict=True):
            nbytes += self.decode(chunk, dest, decoder=decoder)
        self.count_decoded(len(chunks), nbytes)

    def decode(
        self,
        chunk: EncodedChunk,
        dest: np.ndarray,
        skip: int = 0,
        decoder: Callable[[Any, np.ndarray], Any] | None = None,
    ) -> int:
        """Verify chunk ``chunk`` and decode its rows ``skip ..`` into ``dest``.

        An absent chunk is the array's fill value (zarr's rule for a chunk never written).
        Returns the encoded bytes decoded (0 for an absent chunk); the caller counts
        them with :meth:`count_decoded` (once per group: a lock per chunk would cost
        more than its decoding's bookkeeping). ``decoder`` decodes a Blosc buffer
        (default :func:`blosc_decoder`'s).

        Raises
        ------
        StoreCorruptError
            The bytes are cut short, fail their crc32c, or do not decode to a chunk;
            or, in a store marked complete (:meth:`guard`), the chunk is missing.
        """
        g = self.grid
        assert g is not None
        if chunk.data is None:
            if self.missing_is_damage:
                raise self.corrupt(
                    chunk,
                    "is missing (no such object, or no entry for the chunk in its shard's "
                    "index), although the store is marked complete and every chunk was written",
                )
            dest[...] = g.fill_value
            return 0
        src = chunk.data
        whole = skip == 0 and len(dest) == g.chunk_rows and dest.flags.c_contiguous
        target = dest if whole else np.empty(g.chunk_shape, dtype=g.dtype)
        problem = self._decode_checked(chunk, src, target, decoder)
        note = ""
        if problem is not None and self.bytes.remote:
            # over a network, bytes cut short or changed in transit are not damage yet,
            # nor a local cache's copy of them: the chunk is fetched once more, by
            # itself (the cache's copy thrown away), and only then judged
            log.debug("%s: chunk %d %s; fetching it again", self.where, chunk.cid, problem)
            note = self._again(chunk.key) or ""
            again = self._refetch(chunk)
            if again is not None:
                src = again
                problem = self._decode_checked(chunk, src, target, decoder)
        if problem is not None:
            err = self.corrupt(chunk, problem)
            raise _noted(err, note) if isinstance(err, StoreCorruptError) else err
        if not whole:
            dest[...] = target[skip : skip + len(dest)]
        return len(src)

    def _decode_checked(
        self,
        chunk: EncodedChunk,
        src: Any,
        target: np.ndarray,
        decoder: Callable[[Any, np.ndarray], Any] | None,
    ) -> str | None:
        """Decode ``src`` into ``target``; what is wrong with it, or None."""
        g = self.grid
        assert g is not None
        if chunk.size is not None and len(src) != chunk.size:
            return "is cut short"
        return decode_chunk(
            src, target, checksum=g.checksum, chunk_nbytes=g.chunk_nbytes, decoder=decoder
        )

    def _refetch(self, chunk: EncodedChunk) -> Any:
        """The bytes of ``chunk`` fetched again, alone (None: the object is gone)."""
        if chunk.offset is not None and chunk.size is not None:
            rng = ByteRange(chunk.key, chunk.offset, chunk.offset + chunk.size)
        else:
            rng = ByteRange.whole(chunk.key)
        [data] = self.get([rng], merge=False)
        return data

    def corrupt(self, chunk: EncodedChunk, what: str) -> Exception:
        """The damaged-chunk error for ``chunk``."""
        g = self.grid
        assert g is not None
        size = chunk.size if chunk.size is not None else len(chunk.data or b"")
        span = (chunk.offset, size) if chunk.offset is not None else None
        rows = (chunk.cid * g.chunk_rows, min((chunk.cid + 1) * g.chunk_rows, g.shape[0]) - 1)
        return self._damaged(
            corrupt_chunk(
                self.where, self.name, chunk.cid, rows, chunk.key, span, what, self.remedy
            )
        )

    def decode_span(
        self,
        lo: int,
        hi: int,
        out: np.ndarray,
        span: Sequence[EncodedChunk],
        rows: np.ndarray,
        extra: Sequence[EncodedChunk],
        decoder: Callable[[Any, np.ndarray], Any] | None = None,
        loop: ChunkLoop | None = None,
    ) -> np.ndarray:
        """Decode rows ``[lo, hi)`` into ``out`` and return the rows ``rows`` from ``extra``.

        ``span`` and ``extra`` as :meth:`fetch_span` returned them for these rows and
        for the chunks of ``rows``; ``decoder`` as for :meth:`decode`. With ``loop``
        (:func:`~atari_zarr.storage.chunk_loop.chunk_loop`), a local store's whole chunks
        of the span are decoded by it in one call, and the rows wanted of the others
        (the span's partial chunks, ``extra``) copied out by it in one more: the GIL is
        released once a call, not once a chunk, so the thread beside this one runs on.
        Only absent chunks and those the loop did not decode go one by one.
        """
        g = self.grid
        assert g is not None
        cr = g.chunk_rows
        nbytes = 0
        frames = np.empty((len(rows), *g.row_shape), dtype=g.dtype)
        extra = extra if len(rows) else []
        if loop is not None and out.flags.c_contiguous:
            span = self._decode_whole(lo, hi, out, span, loop)
            span, extra = self._decode_rows(lo, hi, out, span, rows, extra, frames, loop)
        for chunk in span:
            c = chunk.cid
            a, b = max(c * cr, lo), min((c + 1) * cr, hi)
            nbytes += self.decode(chunk, out[a - lo : b - lo], a - c * cr, decoder)
        if len(extra):
            block = np.empty(g.chunk_shape, dtype=g.dtype)
            for chunk in extra:
                nbytes += self.decode(chunk, block, 0, decoder)
                sel = np.flatnonzero(rows // cr == chunk.cid)
                frames[sel] = block[rows[sel] - chunk.cid * cr]
        self.count_decoded(len(span) + len(extra), nbytes)
        return frames

    def _decode_rows(
        self,
        lo: int,
        hi: int,
        out: np.ndarray,
        span: Sequence[EncodedChunk],
        rows: np.ndarray,
        extra: Sequence[EncodedChunk],
        frames: np.ndarray,
        loop: ChunkLoop,
    ) -> tuple[list[EncodedChunk], list[EncodedChunk]]:
        """The rows of ``span``'s chunks that lie partly in ``[lo, hi)`` (into ``out``)
        and rows ``rows`` of the chunks ``extra`` (into ``frames``), copied out by
        ``loop`` as it decodes each chunk, in one call (:meth:`ChunkLoop.run_rows
        <atari_zarr.storage.chunk_loop.ChunkLoop.run_rows>`); the chunks it did not
        decode (and those absent), returned to decode one by one."""
        g = self.grid
        assert g is not None
        cr = g.chunk_rows
        parts = [c for c in span if c.data is not None]
        more = [c for c in extra if c.data is not None]
        chunks = parts + more
        if not chunks or not loop.copies_rows or not frames.flags.c_contiguous:
            return list(span), list(extra)
        located = self.locate(np.array([c.cid for c in chunks], dtype=np.int64))
        if located is None:
            return list(span), list(extra)
        row_bytes = g.chunk_nbytes // cr
        chunk, within, at = [], [], []
        for k, c in enumerate(parts):
            r = np.arange(max(c.cid * cr, lo), min((c.cid + 1) * cr, hi), dtype=np.int64)
            chunk.append(np.full(len(r), k))
            within.append(r - c.cid * cr)
            at.append(out.ctypes.data + (r - lo) * row_bytes)
        for k, c in enumerate(more, start=len(parts)):
            sel = np.flatnonzero(rows // cr == c.cid)
            chunk.append(np.full(len(sel), k))
            within.append(rows[sel] - c.cid * cr)
            at.append(frames.ctypes.data + sel * row_bytes)
        done = np.zeros(len(chunks), dtype=bool)
        copies = RowCopies.to(
            np.concatenate(chunk), np.concatenate(within), np.concatenate(at), row_bytes, done=done
        )
        loop.run_rows(located.src, located.srclen, g.chunk_nbytes, copies, checksum=g.checksum)
        self.count_decoded(int(done.sum()), int(located.srclen[done].sum()))
        left = [c for c, d in zip(chunks, done, strict=True) if not d]
        n = len(parts) - int(done[: len(parts)].sum())  # the first n of left are span's
        return (
            [*(c for c in span if c.data is None), *left[:n]],
            [*(c for c in extra if c.data is None), *left[n:]],
        )

    def _decode_whole(
        self, lo: int, hi: int, out: np.ndarray, span: Sequence[EncodedChunk], loop: ChunkLoop
    ) -> list[EncodedChunk]:
        """Decode the whole chunks of ``span`` into ``out`` with ``loop`` (those it did not
        decode the careful way, :meth:`settle`); the partial chunks, left to decode one
        by one."""
        g = self.grid
        assert g is not None
        cr = g.chunk_rows
        whole = [
            c for c in span if c.cid * cr >= lo and (c.cid + 1) * cr <= hi and c.data is not None
        ]
        located = self.locate(np.array([c.cid for c in whole], dtype=np.int64)) if whole else None
        if located is None:
            return list(span)
        starts = np.array([c.cid * cr - lo for c in whole], dtype=np.int64)
        dests = Destinations(out, starts, cr)
        status = loop.run(
            located.src, located.srclen, dests.addresses(), g.chunk_nbytes, checksum=g.checksum
        )
        self.settle([c.cid for c in whole], dests, located, status)
        decoded = {c.cid for c in whole}
        return [c for c in span if c.cid not in decoded]

    # -- zarr-python, for layouts the engine does not know --------------------------------
    def read_generic(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` through zarr-python's indexing."""
        if rows.size == 0:
            return np.zeros((0, *self.array.shape[1:]), dtype=self.array.dtype)
        uniq, inverse = np.unique(rows, return_inverse=True)
        return np.asarray(self.array.get_orthogonal_selection((uniq,)))[inverse]
