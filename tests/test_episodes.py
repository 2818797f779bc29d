"""Episode accounting: the ledger against hand counts and block splits, and the table parser."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atari_zarr.episodes import EpisodeLedger, EpisodeTable, episode_table
from atari_zarr.errors import InvalidArgumentError

# A row: its reward and how it ends its episode ("" for not at all).
FLAGS = {"": (False, False), "term": (True, False), "trunc": (False, True), "both": (True, True)}


def _columns(rows: list[tuple[float, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rewards = np.array([r for r, _ in rows], dtype=np.float32)
    term = np.array([FLAGS[f][0] for _, f in rows], dtype=bool)
    trunc = np.array([FLAGS[f][1] for _, f in rows], dtype=bool)
    return rewards, term, trunc


def _feed_in_blocks(rows: list[tuple[float, str]], splits: list[int]) -> EpisodeLedger:
    rewards, term, trunc = _columns(rows)
    ledger = EpisodeLedger()
    bounds = [0, *sorted(set(splits)), len(rows)]
    for a, b in itertools.pairwise(bounds):
        closed = ledger.feed(rewards[a:b], term[a:b], trunc[a:b])
        # the offsets name the rows of the block that closed an episode
        np.testing.assert_array_equal(closed, np.flatnonzero(term[a:b] | trunc[a:b]))
    return ledger


def test_hand_count():
    rows = [
        (1.0, ""),
        (0.0, "term"),  # episode 0: 2 rows, return 1, terminated
        (2.0, ""),
        (0.5, ""),
        (-1.0, "trunc"),  # episode 1: 3 rows, return 1.5, cut
        (3.0, "both"),  # episode 2: 1 row, terminated wins
        (1.0, ""),
        (1.0, ""),  # still running: 2 rows, return 2
    ]
    ledger = _feed_in_blocks(rows, [3])
    assert ledger.as_attributes() == {
        "length": [2, 3, 1],
        "return": [1.0, 1.5, 3.0],
        "terminated": [True, False, True],
    }
    assert (ledger.current_length, ledger.current_return) == (2, 2.0)
    assert len(ledger) == 3 and ledger.transitions == 6
    assert ledger.cut() is True
    assert ledger.cut() is False  # nothing running any more
    assert ledger.counts() == {"episodes": 4, "terminated_episodes": 2, "truncated_episodes": 2}
    table = ledger.table()
    assert table.length.tolist() == [2, 3, 1, 2] and table.starts.tolist() == [0, 2, 5, 6]
    assert table.returns is not None and table.returns.tolist() == [1.0, 1.5, 3.0, 2.0]
    # keep: forget what follows the first episodes (a limit), then account again
    ledger.feed([5.0])
    ledger.keep(1)
    assert ledger.as_attributes()["length"] == [2] and ledger.current_length == 0
    ledger.feed([0.25, 0.25])
    ledger.cut()
    assert ledger.as_attributes()["return"] == [1.0, 0.5]


def test_types_are_plain_json():
    ledger = EpisodeLedger()
    ledger.feed(np.array([1, 2], np.float32), np.array([False, True]))
    attrs = ledger.as_attributes()
    assert [type(v[0]) for v in attrs.values()] == [int, float, bool]
    assert all(type(v) is int for v in ledger.counts().values())


def test_flags_must_match_rewards():
    with pytest.raises(InvalidArgumentError, match="3 rewards but flags of shape"):
        EpisodeLedger().feed([0.0, 1.0, 2.0], [True, False])


rows_clipped = st.lists(
    st.tuples(st.sampled_from([-1.0, 0.0, 1.0, 0.5]), st.sampled_from(sorted(FLAGS))),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(rows=rows_clipped, splits=st.lists(st.integers(0, 60)))
def test_any_split_gives_the_table_of_one_feed(rows, splits):
    splits = [s for s in splits if s <= len(rows)]
    whole = _feed_in_blocks(rows, [])
    parts = _feed_in_blocks(rows, splits)
    # rewards that add up exactly: the same bits, whatever the split
    assert parts.as_attributes() == whole.as_attributes()
    assert (parts.current_length, parts.current_return) == (
        whole.current_length,
        whole.current_return,
    )
    # and the plain count, row by row
    lengths, returns, terminated = [], [], []
    n, total = 0, 0.0
    for reward, flag in rows:
        n, total = n + 1, total + reward
        if flag:
            lengths.append(n)
            returns.append(total)
            terminated.append(FLAGS[flag][0])
            n, total = 0, 0.0
    assert whole.as_attributes() == {"length": lengths, "return": returns, "terminated": terminated}
    assert (whole.current_length, whole.current_return) == (n, total)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.floats(-100, 100, width=32, allow_subnormal=False), st.sampled_from(sorted(FLAGS))
        ),
        max_size=80,
    ),
    splits=st.lists(st.integers(0, 80)),
)
def test_any_split_of_float_rewards_agrees_up_to_rounding(rows, splits):
    splits = [s for s in splits if s <= len(rows)]
    whole = _feed_in_blocks(rows, [])
    parts = _feed_in_blocks(rows, splits)
    assert parts.length == whole.length and parts.terminated == whole.terminated
    got = [*parts.returns, parts.current_return]
    for a, b in zip(got, [*whole.returns, whole.current_return], strict=True):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    # the same split again: the same bits (stores are reproducible)
    assert _feed_in_blocks(rows, splits).as_attributes() == parts.as_attributes()


def _meta(**table):
    return {"episodes": table}


def test_episode_table_parses_and_derives_rows():
    table = episode_table(
        _meta(length=[3, 1, 2], terminated=[True, False, True], **{"return": [1, 0, -1]}), 6
    )
    assert isinstance(table, EpisodeTable)
    assert len(table) == 3 and table.transitions == 6
    assert table.length.dtype == np.int64 and table.terminated.dtype == np.bool_
    assert table.starts.tolist() == [0, 3, 4]
    assert table.ends.tolist() == [2, 3, 5]
    assert table.returns is not None and table.returns.tolist() == [1.0, 0.0, -1.0]
    no_returns = episode_table(_meta(length=[2], terminated=[False]))
    assert no_returns is not None and no_returns.returns is None


def test_ledger_attributes_parse_back():
    ledger = EpisodeLedger()
    ledger.feed([1.0, 2.0, 3.0], [False, True, False])
    ledger.cut()
    table = episode_table({"episodes": ledger.as_attributes()}, 3)
    assert table is not None and table.length.tolist() == ledger.length
    assert table.returns is not None and table.returns.tolist() == ledger.returns


@pytest.mark.parametrize(
    "meta",
    [
        {},
        {"episodes": [3, 3]},
        _meta(length=[3, 3]),  # no terminated flags
        _meta(length=[3, 3], terminated=[True]),  # different lengths
        _meta(length=[3, 0], terminated=[True, True]),  # an empty episode
        _meta(length=[3, -1], terminated=[True, True]),
        _meta(length=[2.5, 3.5], terminated=[True, True]),  # not integers
        _meta(length=["3", "3"], terminated=[True, True]),
        _meta(length=[3, 3], terminated=[1, 0]),  # not booleans
        _meta(length=[[3, 3]], terminated=[[True, True]]),
        _meta(length=[3, 3], terminated=[True, True], **{"return": [1.0]}),
        _meta(length=[3, 3], terminated=[True, True], **{"return": ["a", "b"]}),
        _meta(length=[3, 4], terminated=[True, True]),  # 7 rows, not 6
    ],
)
def test_unusable_tables_are_none(meta):
    assert episode_table(meta, 6) is None


def test_episode_columns_of_an_rl_unplugged_store():
    from atari_zarr.episodes import episode_columns, source_parts

    meta = {
        "conversion": {
            "shards": [
                {"shard": 0, "first_transition": 0, "transitions": 5},
                {"shard": 2, "first_transition": 5, "transitions": 4},
            ]
        },
        "episodes": {
            "length": [5, 4],
            "terminated": [True, False],
            "return": [1.0, 0.0],
            "checkpoint_idx": [0, 2],
            "episode_return": [50.0, None],
        },
    }
    table = episode_table(meta, 9)
    cols = episode_columns(meta, table)
    assert cols["checkpoint"].tolist() == [0, 2]
    assert cols["source_return"][0] == 50.0 and np.isnan(cols["source_return"][1])
    assert "source_clipped_return" not in cols
    assert [p.checkpoint for p in source_parts(meta)] == [0, 2]
    assert source_parts({"conversion": {"checkpoints": [{"suffix": "x"}]}}) == []
    assert "checkpoint" not in episode_columns({}, table)  # a recording
