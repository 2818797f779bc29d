"""Bytes requests brought, kept in memory up to a bound."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from atari_zarr.storage.kept import KeptBytes

DATA = {
    "a": (np.arange(4000) % 251).astype(np.uint8),
    "b": (np.arange(4000) % 241).astype(np.uint8),
}


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3000), st.integers(1, 400)),
        max_size=40,
    ),
    st.integers(0, 3000),
)
def test_what_is_served_is_the_bytes_kept_and_the_bound_holds(adds, bound):
    kept = KeptBytes(bound)
    for key, start, length in adds:
        kept.add(key, start, DATA[key][start : start + length])
        assert kept.nbytes <= bound
        assert kept.nbytes == sum(e - s for spans in kept._spans.values() for s, e, _ in spans)
    for key, start, length in adds:
        for a, b in ((start, start + length), (start + length // 3, start + length // 2 + 1)):
            got = kept.get(key, a, b)
            if got is not None:
                np.testing.assert_array_equal(got, DATA[key][a:b])
                assert kept.holds(key, a, b)


def test_a_range_inside_a_kept_one_is_served_and_the_least_recent_goes_first():
    kept = KeptBytes(300)
    kept.add("a", 0, DATA["a"][:100])
    kept.add("a", 1000, DATA["a"][1000:1100])
    kept.add("a", 10, DATA["a"][10:50])  # held already: nothing added
    assert kept.nbytes == 200 and len(kept) == 2
    assert kept.get("a", 0, 100) is not None  # now the most recent
    kept.add("b", 0, DATA["b"][:150])  # 350 > 300: the range at 1000 goes
    assert kept.get("a", 1000, 1010) is None and kept.get("a", 20, 30) is not None
    assert not kept.holds("a", 100, 1000) and kept.holds("a", 99, 1000)
    kept.add("a", 0, DATA["a"][:120])  # a longer range replaces the one inside it
    assert len(kept) == 2 and kept.get("a", 100, 120) is not None
    kept.forget("a")
    assert kept.get("a", 0, 10) is None and kept.nbytes == 150
    assert KeptBytes(10).add("a", 0, DATA["a"][:11]) is None  # larger than the bound


def test_nothing_is_kept_with_a_zero_bound():
    kept = KeptBytes(0)
    kept.add("a", 0, DATA["a"][:10])
    assert kept.get("a", 0, 10) is None and kept.nbytes == 0


def test_readers_sharing_one_cache_use_its_room_and_give_it_back_when_they_go() -> None:
    import gc

    shared = KeptBytes(0)
    a, b = shared.join(1000), shared.join(1000)
    assert shared.max_bytes == 2000
    a.add("frames/c/0", 0, DATA["a"][:1500])  # more than its own thousand
    assert a.get("frames/c/0", 10, 20) is not None and b.get("frames/c/0", 10, 20) is None
    b.add("frames/c/0", 0, DATA["b"][:400])  # the same key of another store: its own
    assert bytes(b.get("frames/c/0", 0, 4)) == bytes(DATA["b"][:4])
    assert shared.nbytes == 1900 <= shared.max_bytes
    del a
    gc.collect()  # its finalizer leaves a note: the next add takes its ranges and room away
    b.add("frames/c/1", 0, DATA["b"][:10])
    assert shared.max_bytes == 1000 and shared.nbytes == 410  # its ranges went with it
    assert bytes(b.get("frames/c/0", 0, 4)) == bytes(DATA["b"][:4])
