"""The subset rules: d3rlpy's fraction and the Decision Transformer's sampling."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from atari_zarr.episodes import EpisodeTable, SourcePart
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.subsets import Subset, episode_pieces, select_pieces


def table_of(lengths, terminated) -> EpisodeTable:
    return EpisodeTable(np.array(lengths), np.array(terminated, dtype=bool), None)


def d3rlpy_rule(parts, table, fraction, seed, checkpoint_rows):
    """d3rlpy's get_atari_transitions loop, written out: per checkpoint, shuffle, take, trim."""
    per_epoch = int(checkpoint_rows * fraction)
    kept = []
    for part in parts:
        # the checkpoint's episodes (cut at its boundaries), as the data it loads holds them
        episodes = []
        for e, (a, n) in enumerate(zip(table.starts.tolist(), table.length.tolist(), strict=True)):
            lo, hi = max(a, part.first_row), min(a + n, part.first_row + part.rows)
            if lo < hi:
                episodes.append((lo, hi, hi == a + n and bool(table.terminated[e])))
        order = np.random.default_rng([seed, part.checkpoint]).permutation(len(episodes))
        num_data = 0
        for i in order.tolist():
            if num_data >= per_epoch:
                break
            lo, hi, term = episodes[i]
            if num_data + (hi - lo) > per_epoch:
                hi, term = lo + per_epoch - num_data, False
            kept.append((lo, hi, term))
            num_data += hi - lo
    return sorted(kept)


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 7])
def test_fraction_is_d3rlpys_rule(fraction, seed):
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 40, 60).tolist()
    terminated = (rng.random(60) < 0.8).tolist()
    table = table_of(lengths, terminated)
    n = int(table.length.sum())
    cuts = [0, n // 4, n // 2, n - 100, n]
    parts = [SourcePart(10 + i, a, b - a) for i, (a, b) in enumerate(itertools.pairwise(cuts))]
    got = select_pieces(Subset.fraction_of(fraction, seed=seed), parts, table, checkpoint_rows=200)
    want = d3rlpy_rule(parts, table, fraction, seed, 200)
    assert (
        list(zip(got.start.tolist(), got.stop.tolist(), got.terminated.tolist(), strict=False))
        == want
    )
    for part in parts:  # the exact count, or the whole checkpoint when it is smaller
        inside = (got.start >= part.first_row) & (got.start < part.first_row + part.rows)
        assert got.length[inside].sum() == min(int(200 * fraction), part.rows)


def test_pieces_are_cut_at_checkpoint_boundaries():
    table = table_of([5, 10, 3], [True, True, False])
    p = episode_pieces([SourcePart(0, 0, 8), SourcePart(1, 8, 10)], table)
    assert p.start.tolist() == [0, 5, 8, 15] and p.stop.tolist() == [5, 8, 15, 18]
    assert p.terminated.tolist() == [True, False, True, False]
    assert p.whole.tolist() == [True, True, False, True]
    assert p.part.tolist() == [0, 0, 1, 1]


def test_decision_transformer_takes_whole_trajectories_of_the_last_buffers():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 30, 200).tolist()
    table = table_of(lengths, (rng.random(200) < 0.9).tolist())
    n = int(table.length.sum())
    cuts = np.linspace(0, n, 11).astype(int).tolist()
    parts = [SourcePart(i, a, b - a) for i, (a, b) in enumerate(itertools.pairwise(cuts))]
    subset = Subset.decision_transformer(4, 300, 3, seed=5)
    got = select_pieces(subset, parts, table)
    assert got.rows >= 300 and got.whole.all() and got.terminated.all()
    assert set(got.part.tolist()) <= {6, 7, 8, 9}
    # each draw takes 3 consecutive whole episodes of its checkpoint: in every checkpoint
    # the chosen ones are its first whole ones, in order
    for b in set(got.part.tolist()):
        pieces = episode_pieces(parts, table)
        whole = pieces.start[(pieces.part == b) & pieces.whole & pieces.terminated]
        mine = got.start[got.part == b]
        assert mine.tolist() == whole[: len(mine)].tolist() and len(mine) % 3 in (0, len(whole) % 3)
    again = select_pieces(subset, parts, table)
    assert again.start.tolist() == got.start.tolist()
    other = select_pieces(Subset.decision_transformer(4, 300, 3, seed=6), parts, table)
    assert other.start.tolist() != got.start.tolist()


def test_decision_transformer_stops_when_the_buffers_run_out(caplog):
    table = table_of([10] * 6, [True] * 6)
    parts = [SourcePart(0, 0, 30), SourcePart(1, 30, 30)]
    got = select_pieces(Subset.decision_transformer(2, 10_000, 1), parts, table, where="r")
    assert got.rows == 60 and "fewer than the 10000 asked for" in caplog.text


def test_bad_subsets():
    table = table_of([10] * 6, [True] * 6)
    parts = [SourcePart(0, 0, 30), SourcePart(1, 30, 30)]
    with pytest.raises(
        InvalidArgumentError, match=r"num_buffers 3 is larger than the 2 checkpoints"
    ):
        select_pieces(Subset.decision_transformer(3, 10, 1), parts, table, where="s.zarr")
    for bad in (0, -0.1, 1.01, float("nan"), "x", True):
        with pytest.raises(InvalidArgumentError, match=r"fraction must be in \(0, 1\]"):
            Subset.fraction_of(bad)
    with pytest.raises(InvalidArgumentError, match="trajectories_per_buffer must be a positive"):
        Subset.decision_transformer(2, 10, 0)


def test_attributes_round_trip():
    for subset in (Subset.fraction_of(0.01, seed=3), Subset.decision_transformer(5, 99, 2)):
        assert Subset.from_attributes(subset.attributes()) == subset
    assert Subset.from_attributes(None) is None
