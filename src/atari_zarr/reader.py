"""Read a store back as TorchRL TED transitions: :class:`AtariZarrDataset`."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import zarr
from tensordict import TensorDict

from .layout import (
    ACTION,
    EPISODE,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
    read_metadata,
)
from .fastread import ChunkReader, open_step_columns
from .remote import open_zarr_store

__all__ = ["AtariZarrDataset"]

log = logging.getLogger("atari_zarr")


class AtariZarrDataset(torch.utils.data.Dataset):
    """Random access to one store, item by item or in batches, in TorchRL's TED layout.

    Row ``i`` is the transition ``(o_i, a_i, r_i, o_{i+1})``. Items are
    :class:`tensordict.TensorDict` objects with::

        observation           [B, 84, 84] uint8
        action                [B] int64
        episode, index        [B] int64
        done, terminated, truncated   [B, 1] bool (False: stored states are not final)
        next/observation      [B, 84, 84] uint8 (zeros after a terminated or truncated row)
        next/reward           [B, 1] float32
        next/terminated, next/truncated, next/done   [B, 1] bool

    Parameters
    ----------
    path_or_url : str
        A store written by ``atari-zarr convert`` (``.../Pong/1.zarr``), local path or
        fsspec URL.
    storage_options : dict, optional
        fsspec options, e.g. ``{"token": "anon"}``.

    Raises
    ------
    StoreIncompleteError
        If the store's writer has not finished.
    StoreFormatError
        If the location is not an atari_zarr store this version can read.

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr import convert
    >>> from atari_zarr.testing import write_fixture_run
    >>> root, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> _ = write_fixture_run(root, "Pong", "1", capacity=64, steps=300)
    >>> [store] = convert(root, dest, progress=False)
    >>> ds = AtariZarrDataset(store.url)
    >>> batch = ds[[0, 1, 2]]
    >>> batch["observation"].shape, batch["next", "reward"].shape
    (torch.Size([3, 84, 84]), torch.Size([3, 1]))
    >>> ds.sample(8, generator=torch.Generator().manual_seed(0)).batch_size
    torch.Size([8])
    """

    #: Bound on decoded frame chunks kept between batches, per dataset (and per worker).
    frame_cache_bytes: int = 128 << 20

    def __init__(self, path_or_url: str, *, storage_options: dict[str, Any] | None = None) -> None:
        self.url = str(path_or_url)
        self.storage_options = dict(storage_options or {})
        self._open()

    # -- opening, and re-opening in worker processes ---------------------------------
    def _open(self) -> None:
        store = open_zarr_store(self.url, self.storage_options, read_only=True)
        try:
            group = zarr.open_group(store, mode="r")
        except FileNotFoundError as exc:
            raise FileNotFoundError(
                f"{self.url} is not a Zarr store: expected a directory or URL written by "
                f"`atari-zarr convert` (e.g. DEST/Pong/1.zarr). Check the path."
            ) from exc
        self.metadata: dict[str, Any] = read_metadata(group, self.url)
        self._group = group
        self._obs = group[OBSERVATION]
        self._frames = ChunkReader(self._obs, where=self.url, cache_bytes=self.frame_cache_bytes)
        # Per-step columns load lazily (``column[rows] -> ndarray``): opening a
        # 50M-transition store must not read ~1 GB of per-step data.
        steps = open_step_columns(group, self.metadata, self.url)
        self._action = steps[ACTION]
        self._episode = steps[EPISODE]
        self._reward = steps[REWARD]
        self._terminated = steps[TERMINATED]
        self._truncated = steps[TRUNCATED]
        self._done = steps["done"]

    def __getstate__(self) -> dict[str, Any]:
        # zarr stores hold file-system handles and event loops that must not cross a fork.
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url = state["url"]
        self.storage_options = state["storage_options"]
        self._open()

    # -- indexing -------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._obs.shape[0])

    def __repr__(self) -> str:
        game, run = self.metadata.get("game"), self.metadata.get("run")
        return f"AtariZarrDataset({self.url!r}, game={game!r}, run={run!r}, transitions={len(self)})"

    def _indices(self, idx: Any) -> tuple[np.ndarray, bool]:
        n = len(self)
        scalar = False
        if isinstance(idx, slice):
            rows = np.arange(*idx.indices(n), dtype=np.int64)
        else:
            if isinstance(idx, torch.Tensor):
                idx = idx.detach().cpu().numpy()
            arr = np.asarray(idx)
            if arr.dtype == bool:
                if arr.shape != (n,):
                    raise IndexError(
                        f"boolean index of shape {arr.shape} does not match the dataset's "
                        f"{n} transitions"
                    )
                arr = np.flatnonzero(arr)
            if arr.dtype.kind not in "iu":
                raise TypeError(
                    f"indices must be integers, a slice, or a boolean mask; got dtype {arr.dtype}"
                )
            scalar = arr.ndim == 0
            rows = np.atleast_1d(arr).astype(np.int64).ravel()
        bad = (rows < -n) | (rows >= n)
        if bad.any():
            raise IndexError(
                f"index {int(rows[bad][0])} is out of range for {self.url} with {n} transitions"
            )
        return np.where(rows < 0, rows + n, rows), scalar

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
        # fastread groups rows by chunk, decodes each chunk once (GIL released) and
        # caches it; layouts it does not know go through zarr's generic indexing.
        return self._frames.read(rows)

    def __getitem__(self, idx: Any) -> TensorDict:
        rows, scalar = self._indices(idx)
        done = self._done[rows]
        has_next = ~done
        # next frame rows: only where the episode goes on; ask for both sets at once
        nxt_rows = rows[has_next] + 1
        frames = self.read_frames(np.concatenate([rows, nxt_rows]))
        obs = frames[: len(rows)]
        next_obs = np.zeros_like(obs)
        next_obs[has_next] = frames[len(rows) :]
        b = len(rows)
        false = torch.zeros((b, 1), dtype=torch.bool)
        term = torch.from_numpy(self._terminated[rows].reshape(b, 1))
        trunc = torch.from_numpy(self._truncated[rows].reshape(b, 1))
        td = TensorDict(
            {
                "observation": torch.from_numpy(obs),
                "action": torch.from_numpy(self._action[rows].astype(np.int64)),
                "episode": torch.from_numpy(self._episode[rows].astype(np.int64)),
                "index": torch.from_numpy(rows),
                "done": false,
                "terminated": false.clone(),
                "truncated": false.clone(),
                "next": TensorDict(
                    {
                        "observation": torch.from_numpy(next_obs),
                        "reward": torch.from_numpy(self._reward[rows].reshape(b, 1).copy()),
                        "terminated": term,
                        "truncated": trunc,
                        "done": term | trunc,
                    },
                    batch_size=[b],
                ),
            },
            batch_size=[b],
        )
        return td[0] if scalar else td

    def sample(self, batch_size: int, *, generator: torch.Generator | None = None) -> TensorDict:
        """A batch of ``batch_size`` transitions drawn uniformly with replacement.

        Parameters
        ----------
        batch_size : int
            Number of transitions.
        generator : torch.Generator, optional
            For reproducible batches.
        """
        if len(self) == 0:
            raise IndexError(f"{self.url} holds no transitions; there is nothing to sample")
        rows = torch.randint(0, len(self), (int(batch_size),), generator=generator)
        return self[rows]

    # -- convenience ------------------------------------------------------------------
    @property
    def episodes(self) -> torch.Tensor:
        """Episode id of every row (for TorchRL's ``SliceSampler``)."""
        return torch.from_numpy(self._episode.to_numpy().astype(np.int64, copy=False))

    @property
    def game(self) -> str | None:
        return self.metadata.get("game")

    @property
    def run(self) -> str | None:
        return self.metadata.get("run")
