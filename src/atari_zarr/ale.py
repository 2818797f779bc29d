"""Atari environments set up the way the DQN Replay data was recorded.

Needs the ``collect`` extra (``pip install 'atari-zarr[collect]'``): ale-py (whose
wheel ships the ROMs), gymnasium, and opencv for gymnasium's ``AtariPreprocessing``.

Every env id or game name the package accepts (``atari-zarr collect --env``,
:func:`~atari_zarr.record.collector.collect`, :func:`make_dqn_env`, the game a
recording is filed under) goes through :func:`game_of_env_id`.
"""

from __future__ import annotations

import difflib
import functools
from types import ModuleType
from typing import Any

from atari_zarr.errors import InvalidArgumentError, import_optional

__all__ = [
    "ALE_ACTIONS",
    "DQN_SETTINGS",
    "game_action_names",
    "game_of_env_id",
    "make_dqn_env",
    "minimal_action_set",
    "quiet_ale",
]

#: Preprocessing of the DQN Replay dataset (dopamine's Atari defaults).
DQN_SETTINGS: dict[str, Any] = {
    "repeat_action_probability": 0.25,  # sticky actions
    "frame_skip": 4,
    "screen_size": 84,
    "grayscale_obs": True,
    "noop_max": 30,
    "terminal_on_life_loss": False,
}

#: Where the games of ale-py are listed.
GAMES_URL = "https://ale.farama.org/environments/"

_PURPOSE = "playing Atari games"

#: ALE's 18 actions, by ALE action id.
ALE_ACTIONS = (
    "NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT",
    "DOWNLEFT", "UPFIRE", "RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE",
    "UPLEFTFIRE", "DOWNRIGHTFIRE", "DOWNLEFTFIRE",
)  # fmt: skip


def _gymnasium() -> ModuleType:
    """gymnasium with ale-py's envs registered, or the install hint of the ``collect`` extra."""
    ale_py = import_optional("ale_py", extra="collect", purpose=_PURPOSE)
    gymnasium = import_optional("gymnasium", extra="collect", purpose=_PURPOSE)
    # gymnasium >= 1.0 does not discover the ALE/ namespace by itself.
    gymnasium.register_envs(ale_py)
    return gymnasium


@functools.cache
def _games_by_id() -> dict[str, tuple[str, str]]:
    """Every ALE env id registered with gymnasium, and every game name: to its game name.

    Keys are lower case, so ``pong`` and ``ALE/pong-v5`` name Pong too; values are
    ``(spelling of the key, game)``. Game names are those of the ``ALE/{Game}-v5``
    ids; the older ids (``PongNoFrameskip-v4``) map to the same game through the ROM
    they load.
    """
    specs = [
        s
        for s in _gymnasium().registry.values()
        if str(s.entry_point).startswith("ale_py.") and "game" in s.kwargs
    ]
    # the game of a ROM is the name of its ALE/{Game}-v5 id; the -ram ids (whose order
    # among the specs differs across ale-py versions) are not game names
    game_of_rom = {
        s.kwargs["game"]: s.name
        for s in specs
        if s.namespace == "ALE" and s.kwargs.get("obs_type", "rgb") != "ram"
    }
    out = {game.lower(): (game, game) for game in game_of_rom.values()}
    for s in specs:
        if s.kwargs["game"] in game_of_rom:
            out[s.id.lower()] = (s.id, game_of_rom[s.kwargs["game"]])
    return out


def game_of_env_id(env_id: str) -> str:
    """The ALE game that an env id or game name names: the one parser of ``--env``.

    Parameters
    ----------
    env_id : str
        A game (``"Pong"``) or an Atari env id that ale-py registers with gymnasium
        (``"ALE/Pong-v5"``, ``"PongNoFrameskip-v4"``, ``"Pong-v4"``, ...); case does
        not matter. Only the game is taken from the id: :func:`make_dqn_env` always
        applies DQN Replay's settings, whatever the id's own settings.

    Returns
    -------
    str
        The game as ale-py names it (``"Pong"``, ``"SpaceInvaders"``).

    Raises
    ------
    InvalidArgumentError
        ``env_id`` is neither (the message lists close matches).
    MissingDependencyError
        ale-py or gymnasium is not installed.

    Examples
    --------
    >>> [game_of_env_id(i) for i in ("Pong", "ALE/Pong-v5", "PongNoFrameskip-v4", "pong-v4")]
    ['Pong', 'Pong', 'Pong', 'Pong']
    >>> game_of_env_id("ALE/NotAGame-v5")
    Traceback (most recent call last):
    ...
    atari_zarr.errors.InvalidArgumentError: 'ALE/NotAGame-v5' is not an Atari game or env id ...
    """
    table = _games_by_id()
    key = str(env_id).strip().lower()
    if key in table:
        return table[key][1]
    close = difflib.get_close_matches(key, table, n=2, cutoff=0.8)
    hint = f" (did you mean {' or '.join(repr(table[c][0]) for c in close)}?)" if close else ""
    raise InvalidArgumentError(
        f"{env_id!r} is not an Atari game or env id of ale-py{hint}; expected a game such as "
        f"'Pong' or an id such as 'ALE/Pong-v5', 'PongNoFrameskip-v4' or 'Pong-v4'. "
        f"The games are listed at {GAMES_URL}"
    )


def make_dqn_env(
    game: str,
    *,
    full_action_space: bool = False,
    max_episode_steps: int | None = 27_000,
    **overrides: Any,
) -> Any:
    """A gymnasium env for ``game`` with DQN Replay's preprocessing.

    Sticky actions (p = 0.25), frame skip 4, 84x84 grayscale frames, up to 30
    no-op starts, and dopamine's 27,000-step (108,000-frame) episode limit.

    Parameters
    ----------
    game : str
        ALE game name or env id, e.g. ``"Pong"`` or ``"PongNoFrameskip-v4"``
        (:func:`game_of_env_id`); the env made is ``ALE/{game}-v5`` with the
        settings below.
    full_action_space : bool
        Use ALE's 18 actions instead of the game's minimal set (DQN Replay
        used the minimal set).
    max_episode_steps : int or None
        Agent steps before the episode is truncated.
    **overrides
        Replace any entry of :data:`DQN_SETTINGS`.

    Examples
    --------
    >>> env = make_dqn_env("Pong")
    >>> obs, info = env.reset(seed=0)
    >>> env.spec.id, obs.shape, obs.dtype.name
    ('ALE/Pong-v5', (84, 84), 'uint8')
    >>> env.close()
    """
    gymnasium = _gymnasium()
    game = game_of_env_id(game)
    settings = {**DQN_SETTINGS, **overrides}
    env = gymnasium.make(
        f"ALE/{game}-v5",
        frameskip=1,  # AtariPreprocessing does the skipping (and max-pools the last two frames)
        repeat_action_probability=settings["repeat_action_probability"],
        full_action_space=full_action_space,
        max_episode_steps=None,
    )
    env = gymnasium.wrappers.AtariPreprocessing(
        env,
        noop_max=settings["noop_max"],
        frame_skip=settings["frame_skip"],
        screen_size=settings["screen_size"],
        terminal_on_life_loss=settings["terminal_on_life_loss"],
        grayscale_obs=settings["grayscale_obs"],
    )
    if max_episode_steps is not None:
        env = gymnasium.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)
    return env


def minimal_action_set(game: str) -> list[int]:
    """ALE action ids of ``game``'s minimal action set, in the env's order.

    Index ``a`` of a DQN Replay action is ALE action ``minimal_action_set(game)[a]``.

    Examples
    --------
    >>> minimal_action_set("Pong")
    [0, 1, 3, 4, 11, 12]
    """
    gymnasium = _gymnasium()
    env = gymnasium.make(f"ALE/{game_of_env_id(game)}-v5")
    try:
        return [int(getattr(a, "value", a)) for a in env.unwrapped.ale.getMinimalActionSet()]
    finally:
        env.close()


def game_action_names(game: str) -> list[str]:
    """Names of ``game``'s minimal action set, as DQN Replay's actions index it.

    Examples
    --------
    >>> game_action_names("Pong")
    ['NOOP', 'FIRE', 'RIGHT', 'LEFT', 'RIGHTFIRE', 'LEFTFIRE']
    """
    return [ALE_ACTIONS[a] for a in minimal_action_set(game)]


def quiet_ale() -> None:
    """Silence the banner ALE prints on stderr when an emulator starts (for ``--quiet``)."""
    try:
        import ale_py
    except ImportError:
        return  # make_dqn_env raises the install hint
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
