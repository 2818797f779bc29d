"""Env ids and DQN-preprocessed envs, with real ale-py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from atari_zarr.errors import InvalidArgumentError
from atari_zarr.ale import GAMES_URL, game_of_env_id, make_dqn_env, minimal_action_set


@pytest.mark.parametrize(
    "env_id",
    [
        "Pong",
        "pong",
        "ALE/Pong-v5",
        "PongNoFrameskip-v4",
        "Pong-v4",
        "Pong-v0",
        "PongNoFrameskip-v0",
    ],
)
def test_every_form_of_a_pong_id_names_pong(env_id):
    assert game_of_env_id(env_id) == "Pong"


def test_games_keep_ale_py_spelling():
    assert game_of_env_id("SpaceInvadersNoFrameskip-v4") == "SpaceInvaders"
    assert game_of_env_id("ALE/MontezumaRevenge-v5") == "MontezumaRevenge"
    assert game_of_env_id("mspacman") == "MsPacman"


@pytest.mark.parametrize(
    ("env_id", "guess"),
    [
        ("ALE/NotAGame-v5", None),
        ("Pongg", "'Pong'"),
        ("ALE/Pong-v4", "'ALE/Pong-v5'"),  # ALE/ ids are v5 only
        ("PongDeterministic-v4", None),  # not registered by ale-py >= 0.9
        ("CartPole-v1", None),  # a gymnasium env, not an Atari one
        ("", None),
    ],
)
def test_a_bad_id_names_itself_what_was_expected_and_where_the_games_are(env_id, guess):
    with pytest.raises(InvalidArgumentError) as caught:
        game_of_env_id(env_id)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert message.startswith(f"{env_id!r} is not an Atari game or env id")
    assert "expected a game such as 'Pong' or an id such as 'ALE/Pong-v5'" in message
    assert message.endswith(f"The games are listed at {GAMES_URL}")
    assert "\n" not in message
    assert (f"did you mean {guess}" in message) if guess else ("did you mean" not in message)


def test_make_dqn_env_takes_any_id_and_makes_the_dqn_env():
    env = make_dqn_env("PongNoFrameskip-v4", max_episode_steps=10)
    try:
        assert env.spec.id == "ALE/Pong-v5"
        ale = env.unwrapped.ale
        # DQN Replay's settings, not those of the NoFrameskip-v4 id (no sticky actions)
        assert ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (84, 84)
    finally:
        env.close()
    with pytest.raises(InvalidArgumentError, match="'NotAGame' is not an Atari game"):
        make_dqn_env("NotAGame")
    with pytest.raises(InvalidArgumentError, match="'NotAGame' is not an Atari game"):
        minimal_action_set("NotAGame")


_BLOCKED = (
    "import sys; sys.modules[{module!r}] = None\n"
    "from atari_zarr import MissingDependencyError\n"
    "try:\n"
    "    {code}\n"
    "except MissingDependencyError as exc:\n"
    "    print(exc)\n"
)


@pytest.mark.parametrize(
    ("module", "code"),
    [
        ("ale_py", "from atari_zarr.ale import make_dqn_env; make_dqn_env('Pong')"),
        ("gymnasium", "from atari_zarr.ale import game_of_env_id; game_of_env_id('Pong')"),
        ("gymnasium", "from atari_zarr import ZarrCollector"),
    ],
)
def test_without_the_collect_extra_the_error_says_what_to_install(module, code):
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED.format(module=module, code=code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(
        f"needs {module}; install it with: pip install 'atari-zarr[collect]'"
    )
