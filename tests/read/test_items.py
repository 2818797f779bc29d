"""Item numbering: transitions, and windows of K rows of one episode (property test)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atari_zarr.episodes import EpisodeTable
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.items import Items


@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=20),
    st.integers(1, 9),
    st.booleans(),
)
def test_windows_are_every_start_inside_one_episode(lengths, k, pad):
    table = EpisodeTable(np.array(lengths), np.ones(len(lengths), bool), None)
    if not pad and k > max(lengths):  # no window fits: the one check of a window length
        with pytest.raises(InvalidArgumentError, match=f"longest has {max(lengths)} steps"):
            Items.windows(table, k, pad=pad, where="s.zarr")
        return
    items = Items.windows(table, k, pad=pad)
    episode = np.repeat(np.arange(len(lengths)), lengths)
    want, real = [], []
    for s in range(len(episode)):
        run = episode[s : s + k]
        if len(run) == k and (run == episode[s]).all():
            want.append(s)
            real.append(k)
        elif pad and (s == 0 or episode[s - 1] != episode[s]) and lengths[episode[s]] < k:
            want.append(s)
            real.append(lengths[episode[s]])
    assert len(items) == len(want)
    ids = np.arange(len(items))
    assert items.starts(ids).tolist() == want
    if pad:
        assert items.real(ids).tolist() == real
    else:
        assert items.real(ids) is None
    rows = np.arange(len(episode) + 1)
    before = [sum(1 for s in want if s < r) for r in rows]
    assert items.count_before(rows).tolist() == before


def test_transitions_are_rows():
    items = Items.transitions(5)
    assert len(items) == 5 and items.identity and items.token == "transitions"
    assert items.starts(np.array([3])).tolist() == [3] and items.real(np.array([3])) is None
