"""d3rlpy's Atari loaders, against stores: run in the d3rlpy venv (see pytest.ini here).

What d3rlpy's ``get_atari_transitions`` and ``get_atari`` would build from the same
run, checked against the fixture run's ground truth: the episodes the fraction rule
keeps (the rule of ``convert --fraction``), their frames, actions, clipped rewards and
ends, d3rlpy's own frame stacking, an ALE environment, and DiscreteCQL training on it.
"""

from __future__ import annotations

import math

import d3rlpy
import numpy as np
import pytest
from atari_zarr_testkit import write_fixture_run

from atari_zarr import convert
from atari_zarr.compat.d3rlpy import get_atari, get_atari_transitions
from atari_zarr.errors import InvalidArgumentError, StoreNotFoundError
from atari_zarr.read.store import StoreReader
from atari_zarr.subsets import Subset

CAPACITY = 256


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    source = tmp_path_factory.mktemp("dqn")
    fixture = write_fixture_run(
        str(source),
        "SpaceInvaders",
        "1",
        capacity=CAPACITY,
        steps=1500,
        seed=3,
        max_episode_length=90,
    )
    dest = tmp_path_factory.mktemp("stores")
    [store] = convert(str(source), str(dest), progress=False, scheduler="synchronous")
    return {"source": str(source), "root": str(dest), "store": store.url, "truth": fixture.truth()}


def discrete_cql_losses(buffer, *, n_steps: int, per_epoch: int) -> list[float]:
    """DiscreteCQL trained on ``buffer`` as a d3rlpy user would: each epoch's loss."""
    cql = d3rlpy.algos.DiscreteCQLConfig(
        batch_size=32,
        observation_scaler=d3rlpy.preprocessing.PixelObservationScaler(),
        compile_graph=False,
    ).create(device="cpu:0")
    results = cql.fit(
        buffer,
        n_steps=n_steps,
        n_steps_per_epoch=per_epoch,
        show_progress=False,
        save_interval=10**6,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    return [metrics["loss"] for _, metrics in results]


def rows_of(buffer, truth):
    """The store rows of every episode of ``buffer``, found by their frames."""
    index = {truth.observation[r].tobytes(): r for r in range(len(truth))}
    return [np.array([index[o[0].tobytes()] for o in ep.observations]) for ep in buffer.episodes]


@pytest.mark.parametrize("order", ["random", "played"])
def test_fraction_keeps_what_convert_fraction_keeps(run, tmp_path, order):
    # d3rlpy's own call; where the stores are (root=) and never downloading are the only
    # additions
    buffer, env = get_atari_transitions(
        "space_invaders",
        fraction=0.25,
        index=0,
        order=order,
        root=run["root"],
        download=False,
        make_environment=False,
    )
    assert env is None
    assert isinstance(buffer, d3rlpy.dataset.ReplayBuffer)
    # the same subset, converted
    [subset] = convert(
        run["source"],
        str(tmp_path / "subset"),
        progress=False,
        scheduler="synchronous",
        subset=Subset.fraction_of(0.25, order=order),
    )
    sub = StoreReader(subset.url)
    table = sub.episodes
    pieces = [
        (int(a), int(b) + 1, bool(t))
        for a, b, t in zip(table.starts, table.ends, table.terminated, strict=True)
    ]
    # d3rlpy's ReplayBuffer keeps no episode without a transition: a cut piece of one step
    kept = [(a, b, t) for a, b, t in pieces if t or b - a > 1]
    if order == "random":  # the fixture has such a piece there: the rule is exercised
        assert len(kept) < len(pieces)
    assert len(buffer.episodes) == len(kept)
    for ep, (a, b, t) in zip(buffer.episodes, kept, strict=True):
        rows = np.arange(a, b)
        np.testing.assert_array_equal(ep.observations[:, 0], sub.frames.read(rows))
        np.testing.assert_array_equal(ep.actions[:, 0], sub.action[rows])
        assert ep.terminated == t
    # int(fraction * capacity) transitions from every checkpoint
    assert sum(b - a for a, b, _ in pieces) == len(sub) <= 7 * int(0.25 * CAPACITY)
    # d3rlpy's count: a cut episode's last step has no next step to learn from
    assert buffer.transition_count == sum(b - a - (not t) for a, b, t in kept)


def test_episodes_hold_the_stored_transitions(run):
    buffer, _ = get_atari_transitions(
        "space_invaders", fraction=0.5, root=run["root"], download=False, make_environment=False
    )
    truth = run["truth"]
    ends = truth.terminated | truth.truncated
    for ep, rows in zip(buffer.episodes, rows_of(buffer, truth), strict=True):
        assert ep.observations.shape == (len(rows), 1, 84, 84)
        assert ep.observations.dtype == np.uint8
        np.testing.assert_array_equal(np.diff(rows), 1)  # consecutive rows of one episode
        assert len(set(truth.episode[rows].tolist())) == 1
        np.testing.assert_array_equal(ep.actions[:, 0], truth.action[rows])
        np.testing.assert_array_equal(ep.rewards[:, 0], truth.reward[rows])
        assert ep.rewards.dtype == np.float32
        # terminated only where the episode really ends in a terminal state
        assert ep.terminated == bool(truth.terminated[rows[-1]])
        if ep.terminated:
            assert ends[rows[-1]]


def test_frame_stacks_are_d3rlpys(run):
    """The sampled stacks equal d3rlpy's own pre-stacking of the same episodes."""
    lazy, _ = get_atari_transitions(
        "space_invaders", fraction=0.5, num_stack=4, root=run["root"], make_environment=False
    )
    eager, _ = get_atari_transitions(
        "space_invaders",
        root=run["root"],
        fraction=0.5,
        num_stack=4,
        pre_stack=True,
        make_environment=False,
    )
    picker = lazy.transition_picker
    assert isinstance(picker, d3rlpy.dataset.FrameStackTransitionPicker)
    for ep_lazy, ep_eager in zip(lazy.episodes, eager.episodes, strict=True):
        assert ep_eager.observations.shape == (ep_lazy.size(), 4, 84, 84)
        for t in {0, 1, 3, ep_lazy.transition_count - 1}:
            if 0 <= t < ep_lazy.transition_count:
                got = picker(ep_lazy, t).observation
                np.testing.assert_array_equal(got, ep_eager.observations[t])


def test_get_atari_is_every_episode_with_an_ale_env(run):
    buffer, env = get_atari(run["store"], num_stack=4)
    assert sum(ep.size() for ep in buffer.episodes) == len(run["truth"])
    np.testing.assert_array_equal(
        np.concatenate(rows_of(buffer, run["truth"])), np.arange(len(run["truth"]))
    )
    obs, _ = env.reset(seed=0)
    assert np.asarray(obs).shape == (4, 84, 84)
    assert env.action_space.n == 6  # SpaceInvaders' minimal action set
    env.close()
    _, env1 = get_atari(run["store"])
    obs, _ = env1.reset(seed=0)
    assert np.asarray(obs).shape == (1, 84, 84)
    env1.close()


def test_discrete_cql_trains(run):
    buffer, _ = get_atari_transitions(
        "space_invaders", fraction=1.0, num_stack=4, root=run["root"], make_environment=False
    )
    losses = discrete_cql_losses(buffer, n_steps=300, per_epoch=100)
    assert len(losses) == 3
    assert all(math.isfinite(x) for x in losses)


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, float("nan")])
def test_fraction_outside_0_1_is_one_line(run, fraction):
    with pytest.raises(InvalidArgumentError, match=r"fraction must be in \(0, 1\]") as err:
        get_atari_transitions("space_invaders", fraction=fraction, root=run["root"])
    assert "\n" not in str(err.value)


def test_unknown_game_lists_close_matches(run):
    with pytest.raises(StoreNotFoundError) as err:
        get_atari_transitions(
            "space_invader", root=run["root"], download=False, make_environment=False
        )
    text = str(err.value)
    assert "\n" not in text
    assert "SpaceInvaders/1" in text and run["root"] in text
    # no pull is advised for a game RL Unplugged does not have: it could only fail
    assert "atari-zarr pull SpaceInvader/1" not in text
    assert "cannot be pulled either: SpaceInvader is not a game of RL Unplugged" in text
    with pytest.raises(StoreNotFoundError, match="SpaceInvaders/1"):
        get_atari_transitions(
            "space_invaders", index=3, root=run["root"], download=False, make_environment=False
        )


def test_the_original_call_fetches_from_the_public_copy(tmp_path, monkeypatch):
    """``get_atari_transitions("pong", fraction=...)`` exactly as d3rlpy's, with nothing
    converted: the run comes from RL Unplugged's public layout (fake-gcs-server, which
    the standard emulator variable points gcsfs at), and DiscreteCQL trains on it."""
    import gcsfs
    from atari_zarr_testkit.gcs import FakeGCSServer
    from atari_zarr_testkit.rl_unplugged import upload_public_layout, write_fixture_rlu

    # a whole run (a pull never stores part of one as the run): two shards of two
    # episodes, the rest one short cut episode each
    fixture = write_fixture_rlu(
        str(tmp_path / "src"), "Pong", 1, num_shards=50, present=range(50),
        episodes_per_shard={0: 2, 1: 2},
    )
    with FakeGCSServer() as server:
        server.create_bucket("rl_unplugged")
        upload_public_layout(gcsfs.GCSFileSystem(**server.storage_options()), fixture)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.endpoint_url)
        monkeypatch.setenv("ATARI_ZARR_HOME", str(tmp_path / "home"))
        dataset, env = get_atari_transitions("pong", fraction=0.0002)
        # again: from the cache, the network untouched
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
        again, _ = get_atari_transitions("pong", fraction=0.0002, make_environment=False)
    assert dataset.transition_count == again.transition_count > 0
    # 200 rows of each shard, or all of a shorter one
    per_shard = [sum(e.real_steps for e in fixture.episodes_of(i)) for i in fixture.paths]
    assert sum(ep.size() for ep in dataset.episodes) == sum(min(200, n) for n in per_shard)
    obs, _ = env.reset(seed=0)
    assert np.asarray(obs).shape == (1, 84, 84)
    env.close()
    losses = discrete_cql_losses(dataset, n_steps=100, per_epoch=50)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
