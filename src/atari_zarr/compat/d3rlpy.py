"""d3rlpy's Atari loaders, reading stores: ``get_atari`` and ``get_atari_transitions``.

d3rlpy's ``d3rlpy.datasets.get_atari`` and ``get_atari_transitions`` load DQN Replay
through d4rl-atari from the bucket that is gone. These take a store (or a root of
stores) instead and return what d3rlpy's return: a d3rlpy ``ReplayBuffer`` of
``Episode`` objects (observations ``(T, 1, 84, 84)`` uint8, actions ``(T, 1)``,
clipped rewards ``(T, 1)`` float32, ``terminated``), with d3rlpy's transition picker
and trajectory slicer (``FrameStackTransitionPicker(num_stack)`` unless ``pre_stack``),
and an environment made with ale-py with DQN's preprocessing (channel first, frames
stacked when ``num_stack`` is given)::

    # before
    dataset, env = d3rlpy.datasets.get_atari_transitions("breakout", fraction=0.01,
                                                          index=0, num_stack=4)
    # after
    from atari_zarr.compat.d3rlpy import get_atari_transitions
    dataset, env = get_atari_transitions("./stores", "breakout", fraction=0.01,
                                         index=0, num_stack=4)

``get_atari_transitions`` chooses episodes with d3rlpy's fraction rule
(:class:`~atari_zarr.subsets.Subset.fraction_of`, the rule of ``convert --fraction``):
from every checkpoint, its episodes in a random order until ``fraction`` times
1,000,000 transitions, the last one trimmed. ``index`` is d4rl-atari's run index
(``-v0`` .. ``-v4``): the store ``{root}/{Game}/{index + 1}.zarr``; ``game`` is
d3rlpy's lower_snake_case name (``"space_invaders"`` is ``SpaceInvaders``).

Needs the ``d3rlpy`` extra (``pip install 'atari-zarr[d3rlpy]'``), whose d3rlpy pins
``gymnasium==1.0.0`` and the legacy ``gym``; see the README for how it is tested.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import numpy as np

from atari_zarr.episodes import source_parts
from atari_zarr.errors import InvalidArgumentError, StoreFormatError, import_optional
from atari_zarr.read.store import StoreReader
from atari_zarr.storage.catalog import complete_stores, name_to_url
from atari_zarr.subsets import CHECKPOINT_ROWS, Pieces, Subset, episode_pieces, select_pieces

__all__ = ["ale_name", "get_atari", "get_atari_transitions", "make_env"]

#: Frames read from a store at a time while building episodes.
_BLOCK = 4096


def ale_name(snake: str) -> str:
    """d3rlpy's game name (``"space_invaders"``) as ALE and the stores spell it.

    Examples
    --------
    >>> ale_name("space_invaders"), ale_name("Pong")
    ('SpaceInvaders', 'Pong')
    """
    return "".join(part[:1].upper() + part[1:] for part in str(snake).split("_"))


def _episodes(
    store: StoreReader, pieces: Pieces, *, pre_stack: bool, num_stack: int | None
) -> list:
    d3rlpy = import_optional("d3rlpy", extra="d3rlpy", purpose="atari_zarr.compat.d3rlpy")
    out = []
    for a, b, terminated in zip(
        pieces.start.tolist(), pieces.stop.tolist(), pieces.terminated.tolist(), strict=True
    ):
        rows = np.arange(a, b, dtype=np.int64)
        frames = np.empty((len(rows), 1, *store.observation.shape[1:]), dtype=np.uint8)
        for lo in range(0, len(rows), _BLOCK):
            frames[lo : lo + _BLOCK, 0] = store.frames.read(rows[lo : lo + _BLOCK])
        episode = d3rlpy.dataset.Episode(
            observations=frames,
            actions=store.action[rows].astype(np.int64).reshape(-1, 1),
            rewards=store.reward[rows].astype(np.float32).reshape(-1, 1),
            terminated=bool(terminated),
        )
        if pre_stack:
            from d3rlpy.datasets import _stack_frames  # d3rlpy's own stacking

            if num_stack is None:
                raise InvalidArgumentError(
                    f"pre_stack=True needs num_stack (frames per stack) for {store.where}"
                )
            episode = _stack_frames(episode, num_stack)
        out.append(episode)
    return out


def _buffer(episodes: list, num_stack: int | None, pre_stack: bool) -> Any:
    d3rlpy = import_optional("d3rlpy", extra="d3rlpy", purpose="atari_zarr.compat.d3rlpy")
    data = d3rlpy.dataset
    if num_stack is None or pre_stack:
        picker, slicer = data.BasicTransitionPicker(), data.BasicTrajectorySlicer()
    else:
        picker = data.FrameStackTransitionPicker(num_stack)
        slicer = data.FrameStackTrajectorySlicer(num_stack)
    return data.ReplayBuffer(
        data.InfiniteBuffer(),
        episodes=episodes,
        transition_picker=picker,
        trajectory_slicer=slicer,
    )


def make_env(
    game: str,
    *,
    num_stack: int | None = None,
    sticky_action: bool = True,
    render_mode: str | None = None,
) -> Any:
    """An ALE environment as d3rlpy's loaders give it: DQN preprocessing, channel first.

    Observations are ``(1, 84, 84)`` uint8, or ``(num_stack, 84, 84)`` with the last
    ``num_stack`` frames; sticky actions 0.25 unless ``sticky_action`` is False.
    """
    import gymnasium

    from atari_zarr.record.envs import make_dqn_env

    env = make_dqn_env(
        game, repeat_action_probability=0.25 if sticky_action else 0.0, render_mode=render_mode
    )
    if num_stack:
        return gymnasium.wrappers.FrameStackObservation(env, num_stack)
    return gymnasium.wrappers.ReshapeObservation(env, (1, *env.observation_space.shape))


def get_atari(
    store: str | os.PathLike[str],
    num_stack: int | None = None,
    sticky_action: bool = True,
    pre_stack: bool = False,
    render_mode: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    make_environment: bool = True,
) -> tuple[Any, Any]:
    """d3rlpy's ``get_atari`` for a store: every episode of it, and an environment.

    ``store`` takes the place of d4rl-atari's ``env_name`` (``breakout-expert-v0`` is a
    store converted with ``--checkpoints expert``). Returns ``(ReplayBuffer, env)``;
    ``env`` is None with ``make_environment=False``.
    """
    reader = (
        store
        if isinstance(store, StoreReader)
        else StoreReader(os.fspath(store), storage_options=storage_options)
    )
    table = reader.episodes
    pieces = episode_pieces(source_parts(reader.metadata) or _whole(reader), table)
    episodes = _episodes(reader, pieces, pre_stack=pre_stack, num_stack=num_stack)
    env = None
    if make_environment:
        env = make_env(
            str(reader.metadata.get("game")),
            num_stack=num_stack,
            sticky_action=sticky_action,
            render_mode=render_mode,
        )
    return _buffer(episodes, num_stack, pre_stack), env


def _whole(reader: StoreReader) -> list:
    """A store without checkpoints (a recording) is one part."""
    from atari_zarr.episodes import SourcePart

    return [SourcePart(0, 0, len(reader))]


def get_atari_transitions(
    root: str | os.PathLike[str],
    game_name: str,
    fraction: float = 0.01,
    index: int = 0,
    num_stack: int | None = None,
    sticky_action: bool = True,
    pre_stack: bool = False,
    render_mode: str | None = None,
    *,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    make_environment: bool = True,
) -> tuple[Any, Any]:
    """d3rlpy's ``get_atari_transitions``: a fraction of every checkpoint of one run.

    Raises
    ------
    InvalidArgumentError
        ``fraction`` outside ``(0, 1]``.
    StoreFormatError
        No store of that game and run under ``root`` (the message lists close matches).
    """
    root = os.fspath(root)
    subset = Subset.fraction_of(fraction, seed=seed, where=f"{root} ({game_name})")
    game = ale_name(game_name)
    name = f"{game}/{int(index) + 1}"
    available = complete_stores(root, storage_options)
    if name not in available:
        close = difflib.get_close_matches(name, available, n=5, cutoff=0.4)
        raise StoreFormatError(
            f"{root} holds no store {name} (game {game_name!r}, index {index}: run "
            f"{int(index) + 1}); close matches: {close or 'none'}, of {len(available)} stores. "
            f"Convert it with `atari-zarr convert SOURCE {root} --games {game}`."
        )
    reader = StoreReader(name_to_url(root, name), storage_options=storage_options)
    parts = source_parts(reader.metadata) or _whole(reader)
    capacity = int((reader.metadata.get("conversion") or {}).get("capacity") or CHECKPOINT_ROWS)
    pieces = select_pieces(
        subset, parts, reader.episodes, checkpoint_rows=capacity, where=reader.where
    )
    episodes = _episodes(reader, pieces, pre_stack=pre_stack, num_stack=num_stack)
    env = None
    if make_environment:
        env = make_env(
            game, num_stack=num_stack, sticky_action=sticky_action, render_mode=render_mode
        )
    return _buffer(episodes, num_stack, pre_stack), env
