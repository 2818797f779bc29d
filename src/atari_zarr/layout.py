"""The store layout: the one place that defines array names, dtypes, chunks and codecs.

One Zarr v3 group per game/run, at ``DEST/{Game}/{run}.zarr``:

.. code-block:: text

    Pong/1.zarr/
      zarr.json              group attributes under "atari_zarr" (+ consolidated metadata)
      observation            (N, 84, 84) uint8, 16-frame chunks in 4096-frame shards
      action                 (N,) int32   action index into the game's minimal action set
      episode                (N,) int64   episode id, 0, 1, 2, ... in row order
      source_row             (N,) int64   row of the source stream (dopamine's add_count)
      next/reward            (N,) float32 reward that followed the action
      next/terminated        (N,) bool    the episode ended in a terminal state after row i
      next/truncated         (N,) bool    the episode was cut after row i (gap or end of data)

    optional arrays (:data:`OPTIONAL_ARRAYS`), present only where written:
      final_observation      (E, 84, 84) uint8  frame after the last row of episode e
                                          (collected; rl-unplugged: zeros where unknown)
      next/unclipped_reward  (N,) float32 the source's reward before clipping (rl-unplugged)
      action_full            (N,) int32   the action as one of ALE's 18 actions
      return_to_go           (N,) float32 sum of the rewards from row i to its episode's end

Row ``i`` of every array is transition ``i``; there are no holes. ``docs/format.md``
says what each array means (the frame after a row that ends an episode included) and
what the attributes hold.

Converter, collector and reader all import the names below; nothing else spells
an array name.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.codecs import BloscCodec, Crc32cCodec

from atari_zarr.errors import (
    InvalidNameError,
    StoreCorruptError,
    StoreFormatError,
    StoreIncompleteError,
)
from atari_zarr.redaction import redact_tree

__all__ = [
    "ACTION",
    "ACTION_FULL",
    "ARRAYS",
    "ATTRS_KEY",
    "EPISODE",
    "FINAL_OBSERVATION",
    "FLUSHED_KEY",
    "FORMAT_VERSION",
    "FRAME_SHAPE",
    "MAX_OBJECTS_PER_FOLDER",
    "OBJECTS_DIGEST",
    "OBSERVATION",
    "OPTIONAL_ARRAYS",
    "RETURN_TO_GO",
    "REWARD",
    "SOURCE_ROW",
    "TERMINATED",
    "TRUNCATED",
    "UNCLIPPED_REWARD",
    "WORK_SUFFIX",
    "ArraySpec",
    "codecs_for",
    "create_array",
    "create_store",
    "for_writing",
    "get_array",
    "is_complete",
    "mark_complete",
    "read_metadata",
    "spec",
    "store_path",
    "validate_name",
]

#: Version of this layout. Readers refuse stores with a newer major version.
FORMAT_VERSION = 1
#: The key under which all our group attributes live.
ATTRS_KEY = "atari_zarr"
#: What a conversion's work area adds to its store's name: ``1.zarr.converting``.
WORK_SUFFIX = ".converting"
#: Attribute of a recording in progress: ``{"transitions": n, "episodes": e}``, the
#: prefix of whole episodes that has been flushed and will not change.
FLUSHED_KEY = "flushed"
#: Attribute of a complete store: the SHA-256 of the crc32c recorded of every object of
#: every array (:func:`atari_zarr.fingerprints.record`), so that the content id, a digest
#: of the attributes, changes with them (a frame shard's covers its index: frames that
#: encode to other sizes).
OBJECTS_DIGEST = "objects_digest"
#: Height and width of a preprocessed Atari frame (DQN: 84x84 grayscale).
FRAME_SHAPE = (84, 84)

#: Array of the frames, ``(N, 84, 84)`` uint8: row ``i`` is the observation of transition ``i``.
OBSERVATION = "observation"
#: Array of the actions, indices into the game's minimal action set.
ACTION = "action"
#: Array of the episode id of every row.
EPISODE = "episode"
#: Array of each transition's position in its source's add stream (DQN Replay: ``add_count``).
SOURCE_ROW = "source_row"
#: Array of the reward that follows each action (DQN Replay stored it clipped to -1, 0, 1).
REWARD = "next/reward"
#: Array of the flag: the episode ended in a terminal state after this row.
TERMINATED = "next/terminated"
#: Array of the flag: the episode was cut after this row (a limit, a gap, the data's end).
TRUNCATED = "next/truncated"
#: Optional array of the frame after each episode's last row, where the writer kept it.
FINAL_OBSERVATION = "final_observation"
#: Optional array of the actions as ALE's 18 (``convert --full-action-space``).
ACTION_FULL = "action_full"
#: Optional array of the return-to-go of every row (``convert --return-to-go``).
RETURN_TO_GO = "return_to_go"
#: Optional array of the rewards before clipping (RL Unplugged keeps them).
UNCLIPPED_REWARD = "next/unclipped_reward"

# Frames are uint8: byte shuffle is a no-op and bitshuffle makes zstd 2-3x worse
# (docs/codec-choice.md). Per-step arrays are multi-byte: byte shuffle helps.
_FRAME_COMPRESSOR = BloscCodec(cname="zstd", clevel=5, shuffle="noshuffle", typesize=1)


def _step_compressor(itemsize: int) -> BloscCodec:
    shuffle: Literal["shuffle", "noshuffle"] = "shuffle" if itemsize > 1 else "noshuffle"
    return BloscCodec(cname="zstd", clevel=5, shuffle=shuffle, typesize=itemsize)


def codecs_for(itemsize: int, *, frame: bool) -> list[Any]:
    """The compressors of an array of items of ``itemsize`` bytes: frames or per-step values.

    Blosc zstd 5 (no shuffle for frames, byte shuffle for multi-byte values), then a
    crc32c of every chunk, so that ``verify`` finds any flipped byte. The arrays of
    this layout use it, and so does anything else this package writes (a preprocessed
    dataset).

    Examples
    --------
    >>> [type(c).__name__ for c in codecs_for(4, frame=False)]
    ['BloscCodec', 'Crc32cCodec']
    """
    first = _FRAME_COMPRESSOR if frame else _step_compressor(itemsize)
    return [first, Crc32cCodec()]


@dataclass(frozen=True)
class ArraySpec:
    """How one array of the store is laid out.

    Attributes
    ----------
    name : str
        Path of the array inside the group (``"next/reward"``).
    dtype : numpy.dtype
        On-disk dtype.
    row_shape : tuple of int
        Shape of one row (``()`` for per-step scalars).
    dims : tuple of str
        Zarr v3 ``dimension_names``.
    chunk_rows : int
        Rows per chunk (the unit of decompression).
    shard_rows : int or None
        Rows per shard (the unit of storage), or None when not sharded.
    """

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    dims: tuple[str, ...]
    chunk_rows: int
    shard_rows: int | None = None

    @property
    def write_rows(self) -> int:
        """Rows of the smallest independently writable unit (shard, else chunk), in an
        array of up to :data:`MAX_OBJECTS_PER_FOLDER` of them (see :meth:`unit_rows`).

        Two writers must never write the same unit concurrently
        (zarr-python#3682), so conversion plans work in these units.
        """
        return self.shard_rows or self.chunk_rows

    def unit_rows(self, n_rows: int) -> int:
        """Rows of one object (shard, else chunk) of this array at ``n_rows`` rows:
        :attr:`write_rows`, doubled until the array has at most
        :data:`MAX_OBJECTS_PER_FOLDER` objects, so that every folder of a store fits the
        Hugging Face Hub's limit (under 10,000 entries). A 50M-row run's frames are in
        8192-frame shards; every run up to 33.5M rows keeps 4096.

        Examples
        --------
        >>> spec(OBSERVATION).unit_rows(10**6), spec(OBSERVATION).unit_rows(50 * 10**6)
        (4096, 8192)
        >>> spec(ACTION).unit_rows(50 * 10**6)
        65536
        """
        rows = self.write_rows
        while int(n_rows) > rows * MAX_OBJECTS_PER_FOLDER:
            rows *= 2
        return rows

    def compressors(self) -> list[Any]:
        # crc32c of every chunk lets `verify` detect any flipped byte.
        return codecs_for(self.dtype.itemsize, frame=self.row_shape == FRAME_SHAPE)


_STEP_CHUNK = 1 << 16
#: Objects (shards, or chunks of an array without shards) one array of a store holds at
#: most: they share one folder (``observation/c/``), and the Hugging Face Hub takes fewer
#: than 10,000 entries per folder. :meth:`ArraySpec.unit_rows` keeps every array under it.
MAX_OBJECTS_PER_FOLDER = 8192

#: Every array a store may hold: its name, dtype, chunks and codecs (the one definition).
ARRAYS: dict[str, ArraySpec] = {
    spec.name: spec
    for spec in (
        ArraySpec(
            OBSERVATION,
            np.dtype("uint8"),
            FRAME_SHAPE,
            ("transition", "y", "x"),
            chunk_rows=16,
            shard_rows=4096,
        ),
        ArraySpec(ACTION, np.dtype("int32"), (), ("transition",), _STEP_CHUNK),
        ArraySpec(EPISODE, np.dtype("int64"), (), ("transition",), _STEP_CHUNK),
        ArraySpec(SOURCE_ROW, np.dtype("int64"), (), ("transition",), _STEP_CHUNK),
        ArraySpec(REWARD, np.dtype("float32"), (), ("transition",), _STEP_CHUNK),
        ArraySpec(TERMINATED, np.dtype("bool"), (), ("transition",), _STEP_CHUNK),
        ArraySpec(TRUNCATED, np.dtype("bool"), (), ("transition",), _STEP_CHUNK),
    )
}

#: Arrays that only some stores have, created only when asked for. Readers use
#: them when present and never require them.
OPTIONAL_ARRAYS: dict[str, ArraySpec] = {
    spec.name: spec
    for spec in (
        # One row per episode (the collector keeps the frame that ends each one).
        # Small chunks, no shards: a few frames are read at a time, and the
        # collector appends a few per flush.
        ArraySpec(
            FINAL_OBSERVATION, np.dtype("uint8"), FRAME_SHAPE, ("episode", "y", "x"), chunk_rows=16
        ),
        # The reward as the source gave it before DQN's clipping to [-1, 1] (RL Unplugged).
        ArraySpec(UNCLIPPED_REWARD, np.dtype("float32"), (), ("transition",), _STEP_CHUNK),
        ArraySpec(ACTION_FULL, np.dtype("int32"), (), ("transition",), _STEP_CHUNK),
        ArraySpec(RETURN_TO_GO, np.dtype("float32"), (), ("transition",), _STEP_CHUNK),
    )
}


def spec(name: str) -> ArraySpec:
    """The layout of array ``name``, one of :data:`ARRAYS` or :data:`OPTIONAL_ARRAYS`.

    Examples
    --------
    >>> spec(OBSERVATION).shard_rows, spec(FINAL_OBSERVATION).dims[0]
    (4096, 'episode')
    """
    return ARRAYS.get(name) or OPTIONAL_ARRAYS[name]


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def validate_name(name: str, what: str) -> str:
    """Check that ``name`` is a safe single path component and return it.

    Parameters
    ----------
    name : str
        A game (``"Pong"``) or run (``"1"``) name.
    what : str
        ``"game"`` or ``"run"``, used in the error message.

    Raises
    ------
    InvalidNameError
        If the name is empty, contains a separator or ``..``, or would
        otherwise escape the destination directory.

    Examples
    --------
    >>> validate_name("Pong", "game")
    'Pong'
    >>> validate_name("../x", "game")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidNameError: game name '../x' is not a plain name...
    """
    name = str(name)
    if not _NAME_RE.match(name) or ".." in name:
        raise InvalidNameError(
            f"{what} name {name!r} is not a plain name: expected letters, digits, '_', '-' "
            f"or '.', without '/' or '..', so that it cannot escape the destination. "
            f"Pass the {what} as it appears in the source directory (e.g. 'Pong', '1')."
        )
    return name


def store_path(dest: str, game: str, run: str) -> str:
    """Return where the store of ``game``/``run`` lives under ``dest``.

    Examples
    --------
    >>> store_path("gs://bucket/atari", "Pong", "1")
    'gs://bucket/atari/Pong/1.zarr'
    """
    game = validate_name(game, "game")
    run = validate_name(run, "run")
    return f"{str(dest).rstrip('/')}/{game}/{run}.zarr"


def create_store(store: Store, n_rows: int, attrs: dict[str, Any]) -> zarr.Group:
    """Create an empty, *incomplete* store with every array of the layout.

    Parameters
    ----------
    store : zarr.abc.store.Store
        Where to write; anything already there is overwritten.
    n_rows : int
        Number of transitions.
    attrs : dict
        Attributes to record under ``"atari_zarr"`` (``complete`` is forced False).

    Returns
    -------
    zarr.Group
    """
    # what users mirror and publish: no credential of the command or source is written
    meta = redact_tree({**attrs, "format_version": FORMAT_VERSION, "complete": False})
    group = zarr.open_group(store, mode="w", attributes={ATTRS_KEY: meta})
    for name in ARRAYS:
        create_array(group, name, n_rows)
    return group


def create_array(group: zarr.Group, name: str, n_rows: int) -> zarr.Array:
    """Create one array of :data:`ARRAYS` or :data:`OPTIONAL_ARRAYS` in ``group``.

    Parameters
    ----------
    group : zarr.Group
        An open, writable store.
    name : str
        One of the array name constants.
    n_rows : int
        Length of the first dimension; 0 for an array that grows by ``resize``.

    Examples
    --------
    >>> g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    >>> create_array(g, RETURN_TO_GO, 0).shape
    (0,)
    """
    array_spec = spec(name)
    unit = array_spec.unit_rows(n_rows)
    kwargs: dict[str, Any] = {}
    if array_spec.shard_rows is not None:
        kwargs["shards"] = {
            "shape": (unit, *array_spec.row_shape),
            # A start index is fetched with a plain range at offset 0: no size
            # probe and no suffix range, which some object-store emulators mishandle.
            "index_location": "start",
        }
    array = group.create_array(
        name,
        shape=(n_rows, *array_spec.row_shape),
        dtype=array_spec.dtype,
        chunks=(array_spec.chunk_rows if array_spec.shard_rows else unit, *array_spec.row_shape),
        compressors=array_spec.compressors(),
        fill_value=0,
        dimension_names=array_spec.dims,
        **kwargs,
    )
    return for_writing(array)


#: Rows an array of a store may hold at most: far above any run (50 checkpoints of 10^6).
MAX_ROWS = 1 << 32
#: Bytes of one decoded chunk at most (this layout's are at most 113 KB; the bound leaves
#: room for any sane rechunking, which readers take through zarr).
MAX_CHUNK_BYTES = 64 << 20
#: Bytes of one decoded shard at most (this layout's are 29 MB).
MAX_SHARD_BYTES = 512 << 20


def get_array(group: zarr.Group, name: str, where: str) -> zarr.Array:
    """The array ``name`` of an open store, as a :class:`zarr.Array`, its sizes checked.

    Every reader, ``verify`` and ``info`` get arrays here, so sizes that a damaged or
    hostile ``zarr.json`` declares (rows, chunks, shards) are refused before anything
    is allocated for them.

    Raises
    ------
    StoreFormatError
        ``name`` is a group, not an array; or it declares more rows than
        :data:`MAX_ROWS`, chunks larger than :data:`MAX_CHUNK_BYTES` or shards larger
        than :data:`MAX_SHARD_BYTES`.

    Examples
    --------
    >>> g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    >>> _ = create_array(g, RETURN_TO_GO, 3)
    >>> get_array(g, RETURN_TO_GO, "memory").shape
    (3,)
    """
    node = group[name]
    if not isinstance(node, zarr.Array):
        raise StoreFormatError(
            f"{where}/{name} is a group; expected the array {name!r} of the atari_zarr layout. "
            f"The store was not written by atari_zarr; convert the source again into a new DEST."
        )
    itemsize = np.dtype(node.dtype).itemsize  # type: ignore[arg-type]
    shards = node.shards
    for what, declared, size, limit in (
        ("rows", node.shape, node.shape[0] if node.shape else 0, MAX_ROWS),
        ("chunks", node.chunks, _nbytes(node.chunks, itemsize), MAX_CHUNK_BYTES),
        ("shards", shards, _nbytes(shards, itemsize) if shards else 0, MAX_SHARD_BYTES),
    ):
        if size > limit:
            raise StoreFormatError(
                f"{where}/{name} declares {what} {tuple(declared or ())} ({size:,}"
                f"{'' if what == 'rows' else ' bytes'}), more than the {limit:,} a store of "
                f"this layout may hold; its zarr.json is damaged or not from atari_zarr. "
                f"Convert the source again into a new DEST."
            )
    return node


def _nbytes(shape: Any, itemsize: int) -> int:
    return int(np.prod([int(s) for s in shape], dtype=object)) * itemsize


def for_writing(array: zarr.Array) -> zarr.Array:
    """``array`` set to store every chunk, all-zero ones included.

    Every writer goes through this, so that a chunk object missing from a store is
    damage that ``verify`` reports, never a chunk that was merely left at its fill value.
    """
    return array.with_config({"write_empty_chunks": True})  # type: ignore[union-attr]


def is_complete(meta: Any) -> bool:
    """Whether attributes ``meta`` carry the completion marker: ``"complete"`` is ``true``.

    Only the JSON value ``true`` counts; anything else (absent, ``false``, the string
    ``"false"``, 1) is an unfinished store.

    Examples
    --------
    >>> is_complete({"complete": True}), is_complete({"complete": "false"}), is_complete(None)
    (True, False, False)
    """
    return isinstance(meta, dict) and meta.get("complete") is True


def mark_complete(group: zarr.Group, extra_attrs: dict[str, Any]) -> None:
    """Record final attributes, consolidate metadata, then set the completion marker.

    The marker is written last, by itself, so a store that a crash interrupted
    anywhere before it never looks complete. Before it, the crc32c of every object
    is recorded (:mod:`atari_zarr.fingerprints`), so that an object copied in from
    another store or conversion is caught by the readers and by ``verify``, and their
    digest under :data:`OBJECTS_DIGEST`.
    """
    from atari_zarr.fingerprints import record

    objects = record(group)
    meta = dict(cast("dict[str, Any]", group.attrs[ATTRS_KEY]))
    meta.update(redact_tree(extra_attrs))
    # the content id digests these attributes: with this, the frames' objects too
    meta[OBJECTS_DIGEST] = objects
    meta["complete"] = False
    group.attrs[ATTRS_KEY] = meta
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        zarr.consolidate_metadata(group.store, path=group.path)
    group = zarr.open_group(group.store, path=group.path, mode="r+")
    meta["complete"] = True
    group.attrs[ATTRS_KEY] = meta


def _unfinished_message(where: str, meta: dict[str, Any], missing: list[str]) -> str:
    command = meta.get("command") or "the command that created it"
    flushed = meta.get(FLUSHED_KEY)
    if isinstance(flushed, dict) and not missing:
        return (
            f"{where} is an unfinished recording: its recorder stopped before close(). "
            f"Its first {flushed.get('transitions', 0)} transitions "
            f"({flushed.get('episodes', 0)} whole episodes) were flushed and can be read "
            f"with AtariZarrDataset(url, partial=True); record again ({command}) for a "
            f"complete store."
        )
    stage = (
        f"while creating its arrays ({', '.join(missing)} do not exist yet)"
        if missing
        else "before writing the completion marker, so its data may be partial"
    )
    return (
        f"{where} is incomplete: an unfinished store, not a damaged one; its writer stopped "
        f"{stage}. Finish it by running {command} again (a conversion resumes where it "
        f"stopped), or start over with --overwrite."
    )


def has_member(group: zarr.Group, name: str) -> bool:
    """``name in group``, answered from the group's consolidated metadata where it has
    some, as zarr answers it, without a round trip to zarr's event loop.

    Examples
    --------
    >>> g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    >>> _ = g.create_array("a", shape=(1,), dtype="u1")
    >>> has_member(g, "a"), has_member(g, "b")
    (True, False)
    """
    consolidated = group.metadata.consolidated_metadata
    if consolidated is not None:
        return name in consolidated.flattened_metadata
    return name in group


def read_metadata(group: zarr.Group, where: str, *, require_complete: bool = True) -> dict:
    """Return the ``atari_zarr`` attributes of ``group``, checking version and completion.

    Parameters
    ----------
    group : zarr.Group
        An opened store.
    where : str
        Path or URL of the store, for error messages.
    require_complete : bool
        Raise :class:`StoreIncompleteError` when the completion marker is missing.

    Raises
    ------
    StoreFormatError
        Not an atari_zarr store, or written by a newer, incompatible version.
    StoreIncompleteError
        The writer did not finish (with ``require_complete``, or when arrays are still
        missing): the message names the command that finishes the store.
    StoreCorruptError
        The store is marked complete but arrays of the layout are gone.

    Examples
    --------
    >>> attrs = {"format_version": 1, "complete": False, "command": "atari-zarr convert S D"}
    >>> g = zarr.open_group(zarr.storage.MemoryStore(), mode="w", attributes={ATTRS_KEY: attrs})
    >>> read_metadata(g, "D/Pong/1.zarr")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.StoreIncompleteError: D/Pong/1.zarr is incomplete: ...convert S D again...
    """
    meta = group.attrs.get(ATTRS_KEY)
    if not isinstance(meta, dict) or "format_version" not in meta:
        raise StoreFormatError(
            f"{where} is a Zarr group but not an atari_zarr store: expected attributes under "
            f"{ATTRS_KEY!r} with a format_version, found keys {sorted(group.attrs)}. "
            f"Create stores with `atari-zarr convert` or `atari-zarr collect`."
        )
    version = meta["format_version"]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StoreFormatError(
            f"{where} uses store format version {version!r}; this atari_zarr reads versions "
            f"up to {FORMAT_VERSION}. Upgrade atari_zarr (pip install -U atari-zarr)."
        )
    missing = [name for name in ARRAYS if not has_member(group, name)]
    complete = is_complete(meta)
    # Unfinished before damaged: a writer stopped while creating the arrays leaves some
    # missing, and running its command again finishes the store (conversions resume).
    if not complete and (require_complete or missing):
        raise StoreIncompleteError(_unfinished_message(where, meta, missing))
    if missing:
        raise StoreCorruptError(
            f"{where} is marked complete but lacks the arrays {missing}: expected all of "
            f"{sorted(ARRAYS)}. The store is damaged (data was lost after it was written); "
            f"convert it again with --overwrite."
        )
    return meta
