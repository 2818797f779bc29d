"""The episodes a drop-in reads from a store: the part of a run its loader asked for.

:func:`open_asked` finds the store (:func:`atari_zarr.pull.resolve`: the cache, mirrors,
a pull) or opens the one given; :func:`asked_pieces` takes the part from it.

A loader asks for a part of a run (some checkpoints, a subset rule). The store
:func:`atari_zarr.pull.resolve` finds either holds exactly that part (a store
converted with the same rule, e.g. pulled) or the whole run (a mirror, a store the
user converted), of which the part is taken here, lazily, with the rule of
:mod:`atari_zarr.subsets`. Either way the drop-in reads the same episodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from atari_zarr.episodes import SourcePart, source_parts
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.pull import Download, Request, resolve
from atari_zarr.read.store import StoreReader
from atari_zarr.storage.deadline import Timeout
from atari_zarr.subsets import CHECKPOINT_ROWS, Pieces, Subset, episode_pieces, select_pieces

__all__ = ["asked_pieces", "open_asked"]


def open_asked(
    request: Request,
    *,
    store: str | os.PathLike[str] | StoreReader | None = None,
    root: str | os.PathLike[str] | None = None,
    download: Download = True,
    mirrors: str | list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    timeout: Timeout = "default",
) -> StoreReader:
    """The store of ``request``: ``store`` when given, else the one
    :func:`~atari_zarr.pull.resolve` finds under ``root`` (the cache), in a mirror, or
    pulls (``download``); ``storage_options`` serve a URL ``store``, ``root`` and mirrors;
    ``timeout`` bounds each remote call (``"default"``: ``$ATARI_ZARR_TIMEOUT``, else 60 s).

    Examples
    --------
    >>> # dest_root: a directory holding the converted fixture store Pong/1
    >>> open_asked(Request.parse("Pong/1"), root=dest_root, download=False).where
    '.../Pong/1.zarr'
    """
    if isinstance(store, StoreReader):
        return store
    if store is not None:
        return StoreReader(os.fspath(store), storage_options=storage_options)
    found = resolve(
        request,
        home=root,
        home_options=storage_options,
        mirrors=mirrors,
        mirror_options=storage_options,
        download=download,
        progress=True,  # a download shows its bars, as the originals' did
        timeout=timeout,
    )
    return StoreReader(found.url, storage_options=found.storage_options)


def asked_pieces(
    reader: StoreReader,
    subset: Subset | None = None,
    *,
    checkpoints: Iterable[int] | None = None,
    need_parts: bool = False,
) -> Pieces:
    """The pieces of episodes of ``reader`` that ``subset`` and ``checkpoints`` choose.

    A store that records ``subset`` itself already holds exactly its pieces: all of
    them are taken. Otherwise the store must hold the run (no subset of its own), and
    the rule chooses from it.

    Raises
    ------
    InvalidArgumentError
        The store holds another subset than the one asked; or ``need_parts`` and the
        store records no checkpoints (a recording).

    Examples
    --------
    >>> reader = StoreReader(store_url)  # the converted Pong/1 fixture run: 6 checkpoints
    >>> asked_pieces(reader).rows == len(reader)  # every row, cut at checkpoints
    True
    >>> # 32 rows of each checkpoint; the last, partial one has fewer
    >>> asked_pieces(reader, Subset.fraction_of(0.5, checkpoint_rows=64)).rows
    186
    """
    parts = source_parts(reader.metadata)
    if not parts:
        if need_parts:
            raise InvalidArgumentError(
                f"{reader.where} records no checkpoints (a recording?): the rule draws among a "
                f"run's checkpoints; convert a DQN Replay or RL Unplugged run"
            )
        parts = [SourcePart(0, 0, len(reader))]
    if checkpoints is not None:
        wanted = {int(c) for c in checkpoints}
        parts = [p for p in parts if p.checkpoint in wanted]
    selection = reader.metadata.get("selection") or {}
    recorded = Subset.from_attributes(
        selection.get("subset") if isinstance(selection, dict) else None
    )
    if subset is None or recorded == subset:
        return episode_pieces(parts, reader.episodes)
    if recorded is not None:
        raise InvalidArgumentError(
            f"{reader.where} holds a subset ({recorded.describe()}), not the run; expected the "
            f"whole run or the subset asked ({subset.describe()}). Pass the whole run's store, "
            f"or leave the store to the loader (it finds or fetches the subset asked)."
        )
    capacity = int((reader.metadata.get("conversion") or {}).get("capacity") or CHECKPOINT_ROWS)
    return select_pieces(
        subset, parts, reader.episodes, checkpoint_rows=capacity, where=reader.where
    )
