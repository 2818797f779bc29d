"""Byte ranges and which of them are fetched together (pure: no I/O)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from atari_zarr.storage.ranges import (
    DEFAULT_COALESCE_GAP,
    MAX_COALESCED,
    ByteRange,
    coalesce_ranges,
    gap_for,
)


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 500), st.integers(1, 60)),
        max_size=30,
    ),
    st.integers(-1, 100),
)
def test_coalesced_ranges_cover_every_request(spans, gap):
    requests = [(key, start, start + length) for key, start, length in spans]
    merged, parts = coalesce_ranges(requests, gap, max_bytes=200)
    data = {"a": np.arange(1000) % 251, "b": np.arange(1000) % 241}
    fetched = [data[k][a:b] for k, a, b in merged]
    for (key, start, stop), (m, off, length) in zip(requests, parts, strict=True):
        assert merged[m][0] == key
        np.testing.assert_array_equal(fetched[m][off : off + length], data[key][start:stop])
    # two merged ranges of one object are further apart than the gap, or one is full
    for (k1, s1, e1), (k2, s2, e2) in itertools.pairwise(merged):
        assert k1 != k2 or gap < 0 or s2 - e1 > gap or max(e1, e2) - s1 > 200
    assert len(merged) <= len(requests)
    if gap >= 0 and requests:
        assert len({k for k, _, _ in merged}) == len({k for k, _, _ in requests})


def test_ranges_are_plain_tuples_with_kinds():
    assert ByteRange("k", 2, 9) == ("k", 2, 9) and ByteRange("k", 2, 9).bounded
    assert not ByteRange.whole("k").bounded and not ByteRange.suffix("k", 10).bounded
    assert ByteRange.suffix("k", 10).start == -10


def test_the_gap_is_the_bytes_a_connection_carries_in_a_requests_cost():
    assert gap_for() == DEFAULT_COALESCE_GAP == int(0.02 / 64 * 50e6)
    assert gap_for(latency=0.0) == int(0.0003 * 50e6)  # never below the overhead
    assert gap_for(latency=0.1, concurrency=1, bandwidth=1e9) == MAX_COALESCED
    assert gap_for(latency=0.0, overhead=0.0) == 0
