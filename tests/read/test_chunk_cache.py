"""The decoded-chunk cache: one slab for any number of readers, one budget, CLOCK."""

from __future__ import annotations

import numpy as np
import pytest

from atari_zarr.read.chunk_cache import (
    FIRST_ACTIVE_BYTES,
    ChunkCache,
    chunk_keys,
    split_keys,
)

SHAPE = (4, 3)
CHUNK = 4 * 3 * 8  # float64


def fill(keys: list[int], dests: list[np.ndarray]) -> None:
    """A decode whose chunk says which key it is."""
    for k, d in zip(keys, dests, strict=True):
        d[...] = k


def consistent(cache: ChunkCache) -> None:
    """The sorted keys, their slots and the slots' keys agree; every slot holds its key."""
    assert (np.diff(cache._keys) > 0).all()
    np.testing.assert_array_equal(cache._key_of[cache._key_slot], cache._keys)
    assert (cache._key_of >= 0).sum() == len(cache._keys)
    for key, slot in zip(cache._keys.tolist(), cache._key_slot.tolist(), strict=True):
        assert (cache.slab[slot] == key).all()


def test_readers_share_one_slab_bounded_by_the_sum_of_their_bytes() -> None:
    cache = ChunkCache(SHAPE, np.dtype("float64"))
    a = cache.register(10 * CHUNK)
    b = cache.register(6 * CHUNK)
    assert cache.n_slots == 16
    with cache.lock:
        cache.slots(chunk_keys(a, [0, 1, 2]), fill)
        cache.slots(chunk_keys(b, [0, 5]), fill)
        assert (cache.held(a), cache.held(b)) == (3, 2)
        # the same chunk number of two readers is two chunks
        assert cache.lookup(chunk_keys(a, [0]))[0] != cache.lookup(chunk_keys(b, [0]))[0]
        again = cache.slots(chunk_keys(b, [5, 0]), fill)
        assert cache.last_misses == 0 and sorted(again.tolist()) == sorted(
            cache.lookup(chunk_keys(b, [0, 5])).tolist()
        )
    consistent(cache)
    cache.unregister(b)  # its chunks and its bytes leave; a's chunks that fit stay
    assert cache.n_slots == 10 and cache.held(b) == 0 and cache.held(a) == 3
    consistent(cache)
    cache.unregister(a)
    assert cache.n_slots == 0 and cache.slab is None


def test_many_readers_churning_a_small_cache_always_get_their_own_chunks() -> None:
    cache = ChunkCache(SHAPE, np.dtype("float64"))
    tokens = [cache.register(3 * CHUNK) for _ in range(5)]  # 15 slots in all
    rng = np.random.default_rng(0)
    for _ in range(300):
        keys = np.unique(
            chunk_keys(0, rng.integers(0, 40, 7))
            | (np.asarray(rng.choice(tokens, 7), dtype=np.int64) << 40)
        )
        with cache.lock:
            slots = cache.slots(keys, fill)
        assert len(set(slots.tolist())) == len(keys)  # a batch's slots are its own
        for key, slot in zip(keys.tolist(), slots.tolist(), strict=True):
            assert (cache.slab[slot] == key).all()
        consistent(cache)
    toks, cids = split_keys(keys)
    np.testing.assert_array_equal((toks << 40) | cids, keys)


def test_a_decode_that_fails_leaves_nothing_cached() -> None:
    cache = ChunkCache(SHAPE, np.dtype("float64"))
    t = cache.register(8 * CHUNK)

    def broken(keys: list[int], dests: list[np.ndarray]) -> None:
        raise OSError("bad bytes")

    with cache.lock, pytest.raises(OSError):
        cache.slots(chunk_keys(t, [1, 2]), broken)
    with cache.lock:
        assert (cache.lookup(chunk_keys(t, [1, 2])) < 0).all()
        cache.slots(chunk_keys(t, [1, 2]), fill)
        assert cache.last_misses == 2
    consistent(cache)


def test_slots_are_taken_into_use_for_the_whole_cache_not_per_reader() -> None:
    """240 readers' shares make one bound; slots come into use as misses pay for them
    across all of them, starting from one 128 MB (a fresh page costs more than a decode)."""
    shape = (16, 84, 84)
    chunk = 16 * 84 * 84
    cache = ChunkCache(shape, np.dtype("uint8"))
    tokens = [cache.register(200 * chunk) for _ in range(240)]
    first = FIRST_ACTIVE_BYTES // chunk
    assert cache.n_slots == 240 * 200 and cache.active == first
    with cache.lock:
        for t in tokens:  # one miss from every reader
            cache.slots(chunk_keys(t, [3]), lambda keys, dests: None)
    assert cache.active <= first + 240 // 8 + 2
    assert sum(cache.held(t) for t in tokens) == 240


def test_readers_joining_one_by_one_reallocate_the_slab_a_few_times_and_keep_its_chunks() -> None:
    cache = ChunkCache(SHAPE, np.dtype("float64"))
    t0 = cache.register(4 * CHUNK)
    with cache.lock:
        cache.slots(chunk_keys(t0, [2, 9]), fill)
    slabs = {id(cache.slab)}
    for _ in range(239):
        cache.register(4 * CHUNK)
        slabs.add(id(cache.slab))
    assert cache.n_slots == 240 * 4 <= len(cache.slab) < 2 * 240 * 4
    assert len(slabs) <= 10  # doubling, not one reallocation per reader
    with cache.lock:
        cache.slots(chunk_keys(t0, [2, 9]), fill)
        assert cache.last_misses == 0
    consistent(cache)


def test_a_reader_collected_mid_call_is_left_at_the_next_call() -> None:
    """A garbage collector's finalizer runs inside whatever call allocates: it only
    leaves a note, and the reader's chunks and bytes leave at the next call."""
    cache = ChunkCache(SHAPE, np.dtype("float64"))
    a, b = cache.register(4 * CHUNK), cache.register(4 * CHUNK)
    with cache.lock:
        cache.slots(chunk_keys(a, [1, 2]), fill)
        cache.release(a)  # as if collected here: nothing changes yet
        assert cache.held(a) == 2 and cache.n_slots == 8
        cache.slots(chunk_keys(b, [1]), fill)
        assert cache.held(a) == 2  # nor within a batch
        assert cache.room() == 2  # the next batch's question: a leaves first
    assert cache.held(a) == 0 and cache.n_slots == 4
    with cache.lock, pytest.raises(ValueError, match="room for 2"):
        cache.slots(chunk_keys(b, [1, 2, 3]), fill)  # never more than the room
    consistent(cache)
