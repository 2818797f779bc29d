"""Atari environments set up the way the DQN Replay data was recorded.

Needs the ``collect`` extra (``pip install 'atari-zarr[collect]'``): ale-py (whose
wheel ships the ROMs), gymnasium, and opencv for gymnasium's ``AtariPreprocessing``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DQN_SETTINGS", "make_dqn_env", "minimal_action_set", "quiet_ale"]

#: Preprocessing of the DQN Replay dataset (dopamine's Atari defaults).
DQN_SETTINGS: dict[str, Any] = {
    "repeat_action_probability": 0.25,  # sticky actions
    "frame_skip": 4,
    "screen_size": 84,
    "grayscale_obs": True,
    "noop_max": 30,
    "terminal_on_life_loss": False,
}


def _imports() -> tuple[Any, Any]:
    try:
        import ale_py
        import gymnasium
    except ImportError as exc:  # pragma: no cover - exercised without the extra
        raise ImportError(
            "recording Atari play needs ale-py, gymnasium and opencv-python-headless; "
            "install them with: pip install 'atari-zarr[collect]'"
        ) from exc
    # gymnasium >= 1.0 does not discover the ALE/ namespace by itself.
    gymnasium.register_envs(ale_py)
    return gymnasium, ale_py


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
        ALE game name, e.g. ``"Pong"`` (the env id is ``ALE/{game}-v5``).
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
    >>> obs.shape, obs.dtype.name
    ((84, 84), 'uint8')
    >>> env.close()
    """
    gymnasium, _ = _imports()
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
    gymnasium, _ = _imports()
    env = gymnasium.make(f"ALE/{game}-v5")
    try:
        return [int(getattr(a, "value", a)) for a in env.unwrapped.ale.getMinimalActionSet()]
    finally:
        env.close()


def quiet_ale() -> None:
    """Silence the banner ALE prints on stderr when an emulator starts (for ``--quiet``)."""
    try:
        import ale_py
    except ImportError:
        return  # make_dqn_env raises the install hint
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
