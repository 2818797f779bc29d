"""d3rlpy's Atari loaders, reading stores: ``get_atari`` and ``get_atari_transitions``.

d3rlpy's ``d3rlpy.datasets.get_atari`` and ``get_atari_transitions`` load DQN Replay
through d4rl-atari from the bucket that is gone. These take the same calls, find the
run in a root of stores, the cache or a mirror, or fetch it from RL Unplugged's public
copy (:mod:`atari_zarr.pull`), and return what d3rlpy's return: a d3rlpy
``ReplayBuffer`` of ``Episode`` objects and an ALE environment with DQN's
preprocessing. Migrating is an import:

>>> from atari_zarr.compat.d3rlpy import get_atari_transitions

The migration guide, ``docs/guides/migrate-d3rlpy.md``, says what each argument
does here, how ``fraction`` is taken (in the order played by default, so a download
reads only that prefix of each shard), and how the ``d3rlpy`` extra is installed and
tested (``pip install 'atari-zarr[d3rlpy]'``).
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from atari_zarr.compat.pieces import asked_pieces
from atari_zarr.errors import InvalidArgumentError, import_optional
from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.pull import GAMES, Download, Request, game_name, open_request
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.storage.deadline import Timeout
from atari_zarr.subsets import PLAYED, Pieces

__all__ = ["get_atari", "get_atari_transitions", "make_env"]

#: Frames read from a store at a time while building episodes.
_BLOCK = 4096


def _episodes(
    store: AtariZarrDataset, pieces: Pieces, *, pre_stack: bool, num_stack: int | None
) -> list:
    d3rlpy = import_optional("d3rlpy", extra="d3rlpy", purpose="atari_zarr.compat.d3rlpy")
    out = []
    for a, b, terminated in zip(
        pieces.start.tolist(), pieces.stop.tolist(), pieces.terminated.tolist(), strict=True
    ):
        rows = np.arange(a, b, dtype=np.int64)
        frames = np.empty((len(rows), 1, *FRAME_SHAPE), dtype=np.uint8)
        for lo in range(0, len(rows), _BLOCK):
            frames[lo : lo + _BLOCK, 0] = store.read_frames(rows[lo : lo + _BLOCK])
        steps = store.read_steps(rows)
        episode = d3rlpy.dataset.Episode(
            observations=frames,
            actions=steps["action"].astype(np.int64).reshape(-1, 1),
            rewards=steps["reward"].astype(np.float32).reshape(-1, 1),
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


def _load(
    request: Request,
    store: str | os.PathLike[str] | AtariZarrDataset | None,
    where: dict[str, Any],
    storage_options: dict[str, Any] | None,
    *,
    subset: Any = None,
    checkpoints: tuple[int, ...] | None = None,
    game: str | None = None,
    env: dict[str, Any],
    pre_stack: bool,
    make_environment: bool,
) -> tuple[Any, Any]:
    """What both loaders return: the store opened (``pull.open_request``), the pieces
    asked taken from it as d3rlpy's episodes, and the game's environment."""
    reader, _ = open_request(
        request,
        store=store,
        home=where["root"],
        download=where["download"],
        mirrors=where["mirrors"],
        storage_options=storage_options,
        timeout=where["timeout"],
    )
    pieces = asked_pieces(reader, subset, checkpoints=checkpoints)
    episodes = _episodes(reader, pieces, pre_stack=pre_stack, num_stack=env["num_stack"])
    made = None
    if make_environment:
        made = make_env(game or str(reader.metadata.get("game")), **env)
    return _buffer(episodes, env["num_stack"], pre_stack), made


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

    from atari_zarr.ale import make_dqn_env

    env = make_dqn_env(
        game, repeat_action_probability=0.25 if sticky_action else 0.0, render_mode=render_mode
    )
    if num_stack:
        return gymnasium.wrappers.FrameStackObservation(env, num_stack)
    return gymnasium.wrappers.ReshapeObservation(env, (1, *env.observation_space.shape))


_ENV_NAME = re.compile(r"^(?P<game>[a-z0-9-]+?)-(?P<preset>mixed|medium|expert)-v(?P<index>\d)$")


def _preset_checkpoints(game: str, preset: str) -> tuple[int, ...]:
    """d4rl-atari's presets as RL Unplugged shards (``presets`` of the source kind)."""
    shards = GAMES[game].shards if game in GAMES else 50
    return {"mixed": (1,), "medium": (10,), "expert": (shards - 1,)}[preset]


def get_atari(
    env_name: str | os.PathLike[str] | AtariZarrDataset,
    num_stack: int | None = None,
    sticky_action: bool = True,
    pre_stack: bool = False,
    render_mode: str | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
    download: Download = True,
    mirrors: str | list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    make_environment: bool = True,
    timeout: Timeout = "default",
) -> tuple[Any, Any]:
    """d3rlpy's ``get_atari``: every episode of a d4rl-atari dataset, and an environment.

    ``env_name`` is d4rl-atari's id, ``"{game}-{mixed|medium|expert}-v{index}"``: run
    ``index + 1``, checkpoint 1 (mixed), 10 (medium) or the run's last (expert),
    found or fetched as :func:`get_atari_transitions` does. A store's path (or a
    :class:`~atari_zarr.AtariZarrDataset`) reads that store whole instead.
    Returns ``(ReplayBuffer, env)``; ``env`` is None with ``make_environment=False``.
    """
    match = _ENV_NAME.match(str(env_name)) if isinstance(env_name, str) else None
    checkpoints = None
    store: str | os.PathLike[str] | AtariZarrDataset | None = None
    if match is None:  # a store named (or open) instead of d4rl-atari's id
        store, request = env_name, Request.parse("store")
    else:
        game = game_name(match["game"])
        checkpoints = _preset_checkpoints(game, match["preset"])
        request = Request.parse(game, run=int(match["index"]) + 1, checkpoints=checkpoints)
    return _load(
        request,
        store,
        dict(root=root, download=download, mirrors=mirrors, timeout=timeout),
        storage_options,
        checkpoints=checkpoints,
        env=dict(num_stack=num_stack, sticky_action=sticky_action, render_mode=render_mode),
        pre_stack=pre_stack,
        make_environment=make_environment,
    )


def get_atari_transitions(
    game_name: str,
    fraction: float = 0.01,
    index: int = 0,
    num_stack: int | None = None,
    sticky_action: bool = True,
    pre_stack: bool = False,
    render_mode: str | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
    store: str | os.PathLike[str] | AtariZarrDataset | None = None,
    download: Download = True,
    mirrors: str | list[str] | None = None,
    order: str = PLAYED,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    make_environment: bool = True,
    timeout: Timeout = "default",
) -> tuple[Any, Any]:
    """d3rlpy's ``get_atari_transitions``: a fraction of every checkpoint of one run.

    The original's call works as it is: ``get_atari_transitions("pong", fraction=0.01,
    index=0)`` finds run ``index + 1`` of the game in ``root`` (default the cache,
    ``$ATARI_ZARR_HOME``) or a mirror, or fetches it from RL Unplugged's public copy
    (``download``: True fetches what is missing, ``"force"`` fetches again, False never
    touches the network); only the part the fraction takes is fetched.

    Parameters
    ----------
    game_name, fraction, index, num_stack, sticky_action, pre_stack, render_mode :
        d3rlpy's.
    root : str or path, optional
        A directory (or URL) of stores ``{Game}/{run}.zarr``, where a download goes.
    store : str, path or AtariZarrDataset, optional
        Read this store instead (a whole run, or the same subset): nothing is looked
        up or fetched.
    order : {"played", "random"}
        ``"played"`` (default): each checkpoint's episodes in the order they were
        played, until the fraction's count; a download then fetches only that prefix
        of each shard. ``"random"``: d3rlpy's shuffle of each checkpoint (from
        ``seed``, not Python's unseeded ``random``), which needs every shard whole.
    seed : int
        Seeds ``order="random"``.
    timeout : float, None or "default"
        Seconds each remote call may take (``"default"``: ``$ATARI_ZARR_TIMEOUT``,
        else 60 s).

    Raises
    ------
    InvalidArgumentError
        ``fraction`` outside ``(0, 1]``.
    StoreNotFoundError
        ``download=False`` and the run is neither in ``root`` nor in a local mirror
        (the message names the command that fetches it).
    """
    request = Request.parse(
        game_name, run=int(index) + 1, fraction=fraction, order=order, seed=seed
    )
    return _load(
        request,
        store,
        dict(root=root, download=download, mirrors=mirrors, timeout=timeout),
        storage_options,
        subset=request.subset,
        game=request.game,
        env=dict(num_stack=num_stack, sticky_action=sticky_action, render_mode=render_mode),
        pre_stack=pre_stack,
        make_environment=make_environment,
    )
