"""Rows of a Zarr group's row-aligned arrays: :class:`GroupRows`, the reader's engine for any group.

A converted store is read through :class:`~atari_zarr.AtariZarrDataset`, which knows
its layout. Other groups whose arrays share their row axis (what
:func:`~atari_zarr.compat.preprocess.preprocess` writes, one array per key of the
transformed samples) are read here, with the same chunk engine and decoded-chunk
cache as a store's frames, but without any array name of the store format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import zarr

from atari_zarr.errors import StoreFormatError
from atari_zarr.layout import get_array
from atari_zarr.read.chunks import ChunkReader

__all__ = ["GroupRows"]


class GroupRows:
    """Rows of the arrays ``paths`` of a Zarr group, read together.

    Parameters
    ----------
    group : zarr.Group
        The group; each path names an array of it whose axis 0 is the row.
    paths : sequence of str
        The arrays' paths in the group (``"next/reward"`` for a nested one).
    where : str
        URL or path of the group, for error messages.
    cache_bytes : int
        Bound on the decoded chunks each array keeps between reads (0: none).

    Raises
    ------
    StoreFormatError
        A path names nothing in the group, or a group, or an array whose declared sizes
        are refused (:func:`~atari_zarr.layout.get_array`).

    Examples
    --------
    >>> import numpy as np, zarr
    >>> group = zarr.open_group(store_url, mode="r")  # any group; here a converted store
    >>> rows = GroupRows(group, ["action", "next/reward"], where=store_url)
    >>> got = rows.read(np.array([5, 0, 5]))
    >>> sorted(got), got["action"].tolist() == group["action"][[5, 0, 5]].tolist()
    (['action', 'next/reward'], True)
    """

    def __init__(
        self, group: zarr.Group, paths: Sequence[str], *, where: str, cache_bytes: int = 32 << 20
    ) -> None:
        self.where = where
        self._readers = {
            path: ChunkReader(_array(group, path, where), where=where, cache_bytes=cache_bytes)
            for path in paths
        }

    @property
    def paths(self) -> list[str]:
        """The arrays read, in the order given."""
        return list(self._readers)

    def read(self, rows: Any, paths: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Rows ``rows`` (any order, repeats allowed) of every array (or of ``paths``), by path.

        Parameters
        ----------
        rows : array-like of int
            Row numbers, each in every array's range.
        paths : sequence of str, optional
            The arrays to read, of :attr:`paths` (default: every one).

        Returns
        -------
        dict of str to numpy.ndarray
            ``(len(rows), *row_shape)`` of each array's dtype.
        """
        rows = np.asarray(rows, dtype=np.int64).ravel()
        return {path: self._readers[path].read(rows) for path in paths or self._readers}


def _array(group: zarr.Group, path: str, where: str) -> zarr.Array:
    try:
        return get_array(group, path, where)
    except KeyError:
        raise StoreFormatError(
            f"{where}/{path} is missing: expected an array at that path of the group. "
            f"Check the path; if the group's own attributes name it, write the group again."
        ) from None
