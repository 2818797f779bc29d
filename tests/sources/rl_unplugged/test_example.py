"""Examples: TensorFlow's schema without TensorFlow, the last step's meaning, every defect named."""

from __future__ import annotations

import numpy as np
import pytest
from atari_zarr_testkit.rl_unplugged import SPOILS, spoil_example
from hypothesis import given, settings
from hypothesis import strategies as st

from atari_zarr.errors import SourceFormatError
from atari_zarr.sources.rl_unplugged.example import (
    Episode,
    encode_episode,
    example_class,
    parse_episode,
)

WHERE = "gs://rl_unplugged/atari_episodes_ordered/Pong/run_1-00007-of-00050"

# Written by TensorFlow 2.x: tf.train.Example(features={"actions": Int64List([1, 2]),
# "discounts": FloatList([1.0])}).SerializeToString(deterministic=True).
TF_EXAMPLE = bytes.fromhex(
    "0a2a0a110a07616374696f6e7312061a040a0201020a150a09646973636f756e7473120812060a040000803f"
)


def episode(steps: int = 4, *, terminal: bool = True, optional: bool = True) -> Episode:
    discounts = np.ones(steps, np.float32)
    if terminal:
        discounts[-1] = 0
    rewards = np.arange(steps, dtype=np.float32) * 25 - 10
    return Episode(
        checkpoint_idx=7,
        episode_idx=1234,
        episode_return=float(rewards[: steps - terminal].sum()) if optional else None,
        clipped_episode_return=1.0 if optional else None,
        observations=[b"png%d" % i for i in range(steps)],
        actions=np.arange(steps, dtype=np.int64) % 6,
        unclipped_rewards=rewards,
        clipped_rewards=np.clip(rewards, -1, 1) if optional else None,
        discounts=discounts,
    )


def assert_same(a: Episode, b: Episode) -> None:
    assert (a.checkpoint_idx, a.episode_idx) == (b.checkpoint_idx, b.episode_idx)
    assert (a.episode_return, a.clipped_episode_return) == (
        b.episode_return,
        b.clipped_episode_return,
    )
    assert a.observations == b.observations
    for name in ("actions", "unclipped_rewards", "clipped_rewards", "discounts"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(x, y)


def test_round_trip_with_every_feature():
    ep = episode()
    parsed = parse_episode(encode_episode(ep), WHERE, 0)
    assert_same(parsed, ep)
    assert parsed.actions.dtype == np.int64 and parsed.discounts.dtype == np.float32
    assert parsed.unclipped_rewards.dtype == np.float32
    assert (parsed.steps, parsed.terminal, parsed.real_steps) == (4, True, 3)


def test_optional_features_may_be_absent():
    ep = episode(terminal=False, optional=False)
    data = encode_episode(ep)
    assert sorted(example_class().FromString(data).features.feature) == [
        "actions",
        "checkpoint_idx",
        "discounts",
        "episode_idx",
        "observations",
        "unclipped_rewards",
    ]
    parsed = parse_episode(data, WHERE, 0)
    assert parsed.episode_return is None and parsed.clipped_episode_return is None
    assert parsed.clipped_rewards is None
    assert (parsed.terminal, parsed.real_steps) == (False, 4)


def test_schema_matches_tensorflow():
    ex = example_class()()
    ex.features.feature["actions"].int64_list.value.extend([1, 2])
    ex.features.feature["discounts"].float_list.value.append(1.0)
    assert ex.SerializeToString(deterministic=True) == TF_EXAMPLE
    parsed = example_class().FromString(TF_EXAMPLE)
    assert list(parsed.features.feature["actions"].int64_list.value) == [1, 2]


def test_observations_can_be_skipped():
    parsed = parse_episode(encode_episode(episode(5)), WHERE, 3, observations=False)
    assert parsed.observations == [] and parsed.steps == 5 and parsed.real_steps == 4


@settings(max_examples=40)
@given(
    steps=st.integers(1, 40),
    terminal=st.booleans(),
    optional=st.booleans(),
    values=st.lists(st.floats(-1e6, 1e6, width=32), min_size=40, max_size=40),
)
def test_round_trip_property(steps, terminal, optional, values):
    ep = episode(steps, terminal=terminal, optional=optional)
    ep.unclipped_rewards = np.array(values[:steps], np.float32)
    ep.observations = [bytes([i]) * i for i in range(steps)]
    assert_same(parse_episode(encode_episode(ep), WHERE, 0), ep)


@pytest.mark.parametrize(
    ("how", "kwargs", "what"),
    [
        ("not_example", {}, "not a protobuf message"),
        ("missing_feature", {"feature": "discounts"}, "feature(s) discounts missing"),
        ("missing_feature", {"feature": "checkpoint_idx"}, "feature(s) checkpoint_idx missing"),
        ("missing_feature", {"feature": "observations"}, "feature(s) observations missing"),
        (
            "wrong_kind",
            {"feature": "actions"},
            "feature 'actions' is float_list, expected int64_list",
        ),
        (
            "wrong_kind",
            {"feature": "unclipped_rewards"},
            "'unclipped_rewards' is int64_list, expected float_list",
        ),
        (
            "wrong_kind",
            {"feature": "episode_return"},
            "'episode_return' is int64_list, expected float_list",
        ),
        (
            "lengths",
            {"feature": "actions"},
            "the per-step lists differ in length (observations 4, actions 3, "
            "unclipped_rewards 4, discounts 4, clipped_rewards 4)",
        ),
        ("lengths", {"feature": "clipped_rewards"}, "clipped_rewards 3"),
        ("empty", {}, "the episode has no steps"),
    ],
)
def test_bad_examples_are_named(how, kwargs, what):
    assert how in SPOILS
    data = spoil_example(encode_episode(episode()), how, **kwargs)
    with pytest.raises(SourceFormatError) as excinfo:
        parse_episode(data, WHERE, 17)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"{WHERE}: record 17: "), message
    assert what in message, message
    assert "fetching it again gives the same bytes" in message  # a bucket's object


def test_a_per_episode_feature_needs_one_value():
    ex = example_class().FromString(encode_episode(episode()))
    ex.features.feature["episode_idx"].int64_list.value.append(5)
    with pytest.raises(SourceFormatError, match="record 2: feature 'episode_idx' has 2 values"):
        parse_episode(ex.SerializeToString(), WHERE, 2)
    ex.features.feature["checkpoint_idx"].ClearField("int64_list")
    with pytest.raises(
        SourceFormatError, match="'checkpoint_idx' has no list, expected int64_list"
    ):
        parse_episode(ex.SerializeToString(), WHERE, 2)
