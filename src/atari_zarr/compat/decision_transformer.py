"""A drop-in for the Decision Transformer's Atari data code (kzl/decision-transformer).

The original (``atari/create_dataset.py``, ``atari/run_dt_atari.py``) loads about
500,000 transitions through dopamine's ``FixedReplayBuffer`` (TensorFlow) into
Python lists of 4-frame stacks, about 14 GB of RAM, from the DQN Replay bucket
that is gone. Here the same call makes the same selection from a store (found, or
fetched from RL Unplugged's public copy: :func:`create_dataset`), and the same
items are read lazily from it; migrating is an import (before: ``from create_dataset
import create_dataset``):

>>> from atari_zarr.compat.decision_transformer import StateActionReturnDataset, create_dataset

and the original's calls stay (``args`` and the model are the original script's):

.. not-run:: python
    :reason: the original script's args; tests/compat/test_decision_transformer.py runs these calls

    data = create_dataset(args.num_buffers, args.num_steps, args.game,
                          args.data_dir_prefix, args.trajectories_per_buffer)
    train_dataset = StateActionReturnDataset(data, args.context_length * 3)

(the original unpacks six lists, ``obss, actions, returns, done_idxs, rtgs,
timesteps``, and passes them to its ``StateActionReturnDataset``; here they are the
attributes of one :class:`DecisionTransformerData`).

``train_dataset.vocab_size``, ``block_size`` and ``len(data.timesteps)``/
``data.max_timestep`` feed ``GPTConfig`` as before, and items are the original's
4-tuple with its dtypes and shapes: states float32 ``[K, 4*84*84]`` (divided by
255), actions int64 ``[K, 1]``, returns-to-go float32 ``[K, 1]``, timesteps int64
``[1, 1]`` (the first step's), with ``K = block_size // 3``. ``uint8=True`` gives
states as uint8 ``[K, 4, 84, 84]`` instead, for a conversion on the device.

Where this differs from the original, on purpose (the selection's storage order, the
timesteps, fragments, the length, returns-to-go at trajectory boundaries, windows): the
migration guide, ``docs/guides/migrate-decision-transformer.md``.

Examples
--------
>>> # store_url: a converted Pong/1 fixture store (6 checkpoints of 64 transitions)
>>> data = create_dataset(6, 100, trajectories_per_buffer=2, store=store_url)
>>> ds = StateActionReturnDataset(data, 3 * 5)
>>> states, actions, rtgs, timesteps = ds[0]
>>> states.shape, states.dtype, actions.shape, rtgs.shape, timesteps.shape
(torch.Size([5, 28224]), torch.float32, torch.Size([5, 1]), torch.Size([5, 1]), torch.Size([1, 1]))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from atari_zarr.arguments import whole_number
from atari_zarr.compat.pieces import asked_pieces
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.pull import Download, Request, open_request
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.read.indexing import normalize_index
from atari_zarr.storage.deadline import Timeout
from atari_zarr.subsets import Pieces, Subset

__all__ = ["DecisionTransformerData", "StateActionReturnDataset", "create_dataset"]

#: Frames per state in the original (dopamine's stack_size).
STACK = 4


@dataclass
class DecisionTransformerData:
    """The trajectories :func:`create_dataset` chose, with the original's per-step arrays.

    Attributes
    ----------
    store : AtariZarrDataset
        The store they are read from, with frames stacked as the original's states.
    pieces : Pieces
        The trajectories (rows of the store), in row order.
    rows : numpy.ndarray
        ``(N,)`` the store row of every step, trajectory after trajectory.
    actions, rtgs, timesteps : numpy.ndarray
        ``(N,)`` per step, as the original's ``create_dataset`` returns them (timesteps
        corrected, see the module docstring).
    done_idxs : numpy.ndarray
        ``(T,)`` the end (exclusive) of every trajectory in step order.
    returns : numpy.ndarray
        ``(T,)`` every trajectory's return.
    fragments : numpy.ndarray
        ``(T,)`` bool: the trajectory's episode began before the store's rows (in a
        checkpoint left out, or before a missed log), so it is the tail of an episode,
        as the original's first trajectory of a buffer usually is. Its timesteps count
        from 0 here, as the original counts them; the store's windows count its true
        steps instead.
    """

    store: AtariZarrDataset
    pieces: Pieces
    rows: np.ndarray
    actions: np.ndarray
    rtgs: np.ndarray
    timesteps: np.ndarray
    done_idxs: np.ndarray
    returns: np.ndarray
    fragments: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def max_timestep(self) -> int:
        """``max(timesteps)``, what the original gives ``GPTConfig(max_timestep=...)``."""
        return int(self.timesteps.max()) if len(self) else 0


def create_dataset(
    num_buffers: int = 50,
    num_steps: int = 500_000,
    game: str | None = None,
    data_dir_prefix: str | os.PathLike[str] | None = "./dqn_replay/",
    trajectories_per_buffer: int = 10,
    *,
    store: str | os.PathLike[str] | AtariZarrDataset | None = None,
    seed: int = 123,
    download: Download = True,
    home: str | os.PathLike[str] | None = None,
    mirrors: str | list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    timeout: Timeout = "default",
) -> DecisionTransformerData:
    """The original ``create_dataset``'s selection, without loading frames.

    The original's call works as it is: ``create_dataset(num_buffers, num_steps, game,
    data_dir_prefix, trajectories_per_buffer)`` reads run 1 of ``game``, as the
    original does. It is found, in this order, as the store
    ``{data_dir_prefix}/{game}/1.zarr``; as DQN Replay files
    ``{data_dir_prefix}/{game}/1/replay_logs`` (what the original reads), converted
    once beside them into that store; in the cache or a mirror; or fetched from RL
    Unplugged's public copy (only the last ``num_buffers`` shards, of which the
    selection draws; ``download`` as :func:`atari_zarr.pull.resolve` takes it).

    Parameters
    ----------
    num_buffers, num_steps, game, data_dir_prefix, trajectories_per_buffer :
        As the original's (defaults: ``run_dt_atari.py``'s).
    store : str, path or AtariZarrDataset, optional
        Read this store instead (a run converted from DQN Replay or RL Unplugged, or a
        store of the same selection), local or any fsspec URL.
    seed : int
        Seeds the draws of buffers (the original's ``--seed`` default is 123).
    download : bool or "force"
        ``True``: fetch the run when it is missing; ``"force"``: fetch it again;
        ``False``: never touch the network.
    home, mirrors :
        The cache and mirrors (:func:`atari_zarr.pull.resolve`).
    storage_options : dict, optional
        fsspec options for a URL ``store``, ``data_dir_prefix`` or mirror.
    timeout : float, None or "default"
        Seconds each remote call may take (``"default"``: ``$ATARI_ZARR_TIMEOUT``,
        else 60 s).

    Raises
    ------
    InvalidArgumentError
        No ``game`` nor ``store``; ``num_buffers`` larger than the checkpoints in the
        store, or a store without checkpoints (a recording).
    StoreNotFoundError
        ``download=False`` and the run is nowhere without the network.
    """
    subset = Subset.decision_transformer(
        num_buffers, num_steps, trajectories_per_buffer, seed=seed, where=str(store or game)
    )
    if store is None and game is None:
        raise InvalidArgumentError(
            "create_dataset needs the game (as the original: create_dataset(num_buffers, "
            "num_steps, game, data_dir_prefix, trajectories_per_buffer)) or store=; got neither"
        )
    request = Request.parse(str(game or "store"), run=1, subset=subset)
    store, _ = open_request(
        request,
        store=store,
        home=home,
        download=download,
        mirrors=mirrors,
        # the original reads {data_dir_prefix}{game}/1/replay_logs: converted beside them
        local_source=None if data_dir_prefix is None else os.fspath(data_dir_prefix),
        storage_options=storage_options,
        timeout=timeout,
        frame_stack=STACK,
    )
    pieces = asked_pieces(store, subset, need_parts=True)
    lengths = pieces.length
    rows = (
        np.concatenate([np.arange(a, b) for a, b in zip(pieces.start, pieces.stop, strict=True)])
        if len(pieces)
        else np.zeros(0, dtype=np.int64)
    ).astype(np.int64)
    done_idxs = np.cumsum(lengths).astype(np.int64)
    rtg = store.return_to_go(rows) if len(rows) else np.zeros(0, np.float32)
    steps = store.read_steps(rows)
    first_episodes = store.read_steps(np.asarray(pieces.start, dtype=np.int64))["episode"]
    first = np.repeat(np.r_[0, done_idxs[:-1]], lengths) if len(pieces) else rows
    returns = rtg[np.r_[0, done_idxs[:-1]]] if len(pieces) else np.zeros(0, np.float32)
    return DecisionTransformerData(
        store=store,
        pieces=pieces,
        rows=rows,
        actions=steps["action"].astype(np.int64) if len(rows) else rows,
        rtgs=rtg.astype(np.float32),
        timesteps=(np.arange(len(rows)) - first).astype(np.int64) if len(rows) else rows,
        done_idxs=done_idxs,
        returns=returns.astype(np.float32),
        fragments=(
            store.episode_table["fragment"].to_numpy(dtype=bool)[first_episodes]
            if len(pieces)
            else np.zeros(0, dtype=bool)
        ),
    )


class StateActionReturnDataset(torch.utils.data.Dataset):
    """The original's ``StateActionReturnDataset`` over :func:`create_dataset`'s trajectories.

    Parameters
    ----------
    data : DecisionTransformerData
        What :func:`create_dataset` returned.
    block_size : int
        ``3 * context_length``, as the original is given it.
    uint8 : bool
        States as uint8 ``[K, 4, 84, 84]`` (the frames as stored: convert to float on
        the device) instead of float32 ``[K, 4*84*84] / 255``.

    Attributes
    ----------
    vocab_size : int
        ``max(actions) + 1``.
    """

    def __init__(self, data: DecisionTransformerData, block_size: int, *, uint8: bool = False):
        where = data.store.where
        self.block_size = whole_number(block_size, "block_size", where, low=3, unit="3 x context")
        self.data = data
        self.context = self.block_size // 3
        self.uint8 = bool(uint8)
        if len(data) < self.context:
            raise InvalidArgumentError(
                f"{where}: the {len(data)} steps chosen are fewer than one context "
                f"of {self.context}; choose more steps or a shorter context"
            )
        self.vocab_size = int(data.actions.max()) + 1 if len(data) else 0

    def __len__(self) -> int:
        return len(self.data) - self.context

    def window(self, idx: np.ndarray) -> np.ndarray:
        """``(B, K)`` step numbers of items ``idx``: the original's rule."""
        k = self.context
        idx = np.asarray(idx, dtype=np.int64)
        ends = self.data.done_idxs
        nxt = ends[np.minimum(np.searchsorted(ends, idx, side="right"), len(ends) - 1)]
        stop = np.minimum(nxt, idx + k)
        start = np.maximum(stop - k, 0)  # the very start of the data: the next one instead
        return start[:, None] + np.arange(k, dtype=np.int64)[None, :]

    def _check(self, idx: Any) -> np.ndarray:
        # the one normalisation: a float is a TypeError, not silently its integer part
        return normalize_index(idx, len(self), self.data.store.where, unit="items")[0]

    def _items(self, idx: np.ndarray) -> tuple[torch.Tensor, ...]:
        steps = self.window(idx)
        b, k = steps.shape
        td = self.data.store[self.data.rows[steps.ravel()]]
        obs = td["observation"]  # [b * k, 4, 84, 84], views of the frames read
        if self.uint8:
            states = obs.contiguous().reshape(b, k, STACK, *obs.shape[-2:])
        else:
            # one pass from the uint8 views to contiguous float32, divided in place
            states = obs.to(torch.float32).div_(255.0).reshape(b, k, -1)
        actions = torch.from_numpy(self.data.actions[steps]).unsqueeze(-1)
        rtgs = torch.from_numpy(self.data.rtgs[steps]).unsqueeze(-1)
        timesteps = torch.from_numpy(self.data.timesteps[steps[:, :1]]).unsqueeze(-1)
        return states, actions, rtgs, timesteps

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, ...]:
        states, actions, rtgs, timesteps = self._items(self._check(idx))
        return states[0], actions[0], rtgs[0], timesteps[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, ...]]:
        """A batch read at once (one frame fetch); the default collate stacks it."""
        states, actions, rtgs, timesteps = self._items(self._check(indices))
        return list(zip(states, actions, rtgs, timesteps, strict=True))
