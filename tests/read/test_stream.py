"""The epoch stream: exactly once across ranks and workers, determinism, exact frames, resume."""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from atari_zarr_testkit import write_episodes_store
from tensordict import TensorDict

from atari_zarr import AtariZarrDataset
from atari_zarr.errors import DatasetClosedError, InvalidArgumentError
from atari_zarr.layout import (
    ACTION,
    EPISODE,
    FINAL_OBSERVATION,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    create_array,
    create_store,
    mark_complete,
)
from atari_zarr.read.dataset import collate_batch
from atari_zarr.read.epoch import EpochPlan, unit_bounds
from atari_zarr.read.mixing import MultiGameDataset
from atari_zarr.read.stream import AtariZarrStream, EpochStream, stream_memory_bound
from atari_zarr.resources import process_memory


@pytest.fixture(autouse=True, params=["kept", "window"])
def units_held(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with both ways a stream holds units, whatever its options
    and stores: every unit kept decoded from one epoch to the next (``keep_units``),
    and a window of slots decoded anew each epoch."""
    kept = request.param == "kept"
    monkeypatch.setattr(EpochStream, "keeps_units", lambda self, workers=1: kept)
    return str(request.param)


def frame_of(rows: np.ndarray) -> np.ndarray:
    """Frames that name their row: a constant row-dependent value, the row in the first bytes."""
    rows = np.asarray(rows, dtype=np.int64)
    frames = np.empty((len(rows), 84, 84), dtype=np.uint8)
    frames[:] = (rows % 251).astype(np.uint8)[:, None, None]
    frames[:, 0, :8] = rows.astype("<i8").view(np.uint8).reshape(-1, 8)
    return frames


def write_store(
    path: str,
    n: int,
    *,
    seed: int = 0,
    max_len: int = 300,
    final: bool = True,
    frames: int | None = None,
    name: int = 0,
    game: str = "Pong",
) -> str:
    """A complete store of ``n`` transitions written with zarr directly (fast), episodes random.

    Row ``i``'s frame is ``frame_of(name + i)`` (``name`` tells stores apart). With
    ``final``, ``final_observation`` holds ``frame_of(10**6 + name + episode)``. With
    ``frames``, only the first ``frames`` frames are written (the caller fills the rest).
    """
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < n:
        lengths.append(int(rng.integers(1, max_len)))
    lengths[-1] -= sum(lengths) - n
    lengths = [x for x in lengths if x > 0]
    term = rng.random(len(lengths)) < 0.5
    # both kinds of end: an array of one value only would be a chunk zarr never writes
    if len(term) > 1 and (term.all() or not term.any()):
        term[0] = not term[0]
    episode = np.repeat(np.arange(len(lengths)), lengths)
    ends = np.cumsum(lengths) - 1
    t = np.zeros(n, dtype=bool)
    u = np.zeros(n, dtype=bool)
    t[ends[term]] = True
    u[ends[~term]] = True
    group = create_store(zarr.storage.LocalStore(path), n, {"game": game, "run": "1"})
    for start in range(0, n if frames is None else frames, 8192):
        stop = min(n if frames is None else frames, start + 8192)
        group[OBSERVATION][start:stop] = frame_of(name + np.arange(start, stop))
    group[ACTION][:] = rng.integers(0, 6, n).astype(np.int32)
    group[REWARD][:] = rng.integers(-1, 2, n).astype(np.float32)
    group[EPISODE][:] = episode
    group[SOURCE_ROW][:] = np.arange(n)
    group[TERMINATED][:] = t
    group[TRUNCATED][:] = u
    if final:
        arr = create_array(group, FINAL_OBSERVATION, len(lengths))
        arr[:] = frame_of(10**6 + name + np.arange(len(lengths)))
    mark_complete(group, {})
    return path


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """6,000 transitions (2 shards), episodes up to 300 steps, final observations kept."""
    return write_store(str(tmp_path_factory.mktemp("stream") / "s.zarr"), 6000)


def assert_same(ds, batches) -> None:
    """Every batch equals random access to its rows, key by key."""
    for batch in batches:
        want = ds[batch["index"].numpy()]
        for key in want.keys(include_nested=True, leaves_only=True):
            np.testing.assert_array_equal(batch[key].numpy(), want[key].numpy(), err_msg=str(key))


def first_batches(stream: Any, n: int) -> list[TensorDict]:
    """The first ``n`` batches of an epoch, the stream left there (as a job stopped)."""
    return list(itertools.islice(stream, n))


def rows_of(batches: list[TensorDict]) -> np.ndarray:
    return np.concatenate([b["index"].numpy() for b in batches]) if batches else np.zeros(0, int)


def expected(truth, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Stacks from the ground truth, the slow obvious way (zero padding, zero after an end)."""
    done = truth.terminated | truth.truncated
    zero = np.zeros_like(truth.observation[0])
    obs, nxt = [], []
    for r in rows.tolist():
        same = lambda j, r=r: 0 <= j < len(truth) and truth.episode[j] == truth.episode[r]  # noqa: E731
        obs.append([truth.observation[j] if same(j) else zero for j in range(r - k + 1, r + 1)])
        stack = [truth.observation[j] if same(j) else zero for j in range(r - k + 2, r + 1)]
        stack.append(zero if done[r] else truth.observation[r + 1])
        nxt.append(stack)
    obs_a, nxt_a = np.array(obs), np.array(nxt)
    return (obs_a[:, 0], nxt_a[:, 0]) if k == 1 else (obs_a, nxt_a)


# --------------------------------------------------------------------------- #
# the plan
# --------------------------------------------------------------------------- #


def test_unit_bounds_stay_inside_shards() -> None:
    b = unit_bounds(10_000, shard_rows=4096, unit_rows=1024)
    assert b[0].tolist() == [0, 1024] and b[-1].tolist() == [9216, 10_000]
    assert ((b[:, 0] // 4096) == ((b[:, 1] - 1) // 4096)).all()
    assert unit_bounds(0, shard_rows=4096, unit_rows=4096).shape == (0, 2)


@pytest.mark.parametrize("window", [1, 3, 50])
@pytest.mark.parametrize("consumers", [1, 4])
def test_plan_covers_every_row_once(window: int, consumers: int) -> None:
    bounds = unit_bounds(5000, shard_rows=1024, unit_rows=256)
    rows = []
    for c in range(consumers):
        plan = EpochPlan(
            bounds, seed=3, epoch=1, shuffle=True, window=window, consumer=c, consumers=consumers
        )
        sizes = plan.segment_sizes()
        for i, s in enumerate(plan.segments):
            pos, r = plan.segment(s)
            assert len(pos) == sizes[i]
            assert set(pos.tolist()) <= set(plan.needed(s))  # only units held at segment s
            rows.append(bounds[plan.units[pos], 0] + r)
    assert sorted(np.concatenate(rows).tolist()) == list(range(5000))


def _emitted(plan: EpochPlan, bounds: np.ndarray, upto: int) -> list[int]:
    """The items a consumer emits first, ``upto`` of them, in its order (the slow way)."""
    out: list[int] = []
    for s in plan.segments:
        pos, r = plan.segment(s)
        out.extend((bounds[plan.units[pos], 0] + r).tolist())
    return out[:upto]


@pytest.mark.parametrize(("window", "consumers", "pad"), [(1, 3, 0), (3, 4, 2), (50, 2, 1)])
def test_consumed_names_what_was_emitted_and_a_plan_of_the_rest_deals_the_rest(
    window: int, consumers: int, pad: int
) -> None:
    """What a consumer emitted is named in terms of units and items, whatever the
    consumers; plans made with it left deal every other item once, among any number."""
    from atari_zarr.read.epoch import Consumed

    bounds = unit_bounds(5000, shard_rows=1024, unit_rows=256)
    rng = np.random.default_rng(window)
    done = Consumed(bounds)
    emitted: set[int] = set()
    for c in range(consumers):
        plan = EpochPlan(
            bounds,
            seed=3,
            epoch=1,
            shuffle=True,
            window=window,
            consumer=c,
            consumers=consumers,
            pad=pad if c == 0 else 0,
        )
        position = int(rng.integers(0, plan.rows + 1))
        emitted |= set(_emitted(plan, bounds, position))
        for unit, items in plan.consumed(position).items():
            done.add(unit, items)
    named = {
        int(bounds[u, 0]) + int(i)
        for u in range(len(bounds))
        for i in (
            range(int(np.diff(bounds[u])[0]))
            if done.done[u]
            else np.flatnonzero(done.partial.get(u, np.zeros(0, bool)))
        )
    }
    assert named == emitted and done.count == len(emitted)
    again = Consumed.decode(done.encode(), done.sizes)
    assert again.count == done.count
    for later in (1, 3, 7):
        rest = []
        for c in range(later):
            plan = EpochPlan(
                bounds,
                seed=3,
                epoch=1,
                shuffle=True,
                window=window,
                consumer=c,
                consumers=later,
                left=again,
            )
            rest += _emitted(plan, bounds, plan.rows)
            assert plan.consumer_of(rest[-1]) == c if rest else True
        assert sorted(rest) == sorted(set(range(5000)) - emitted)


def test_plan_locate_inverts_positions() -> None:
    bounds = unit_bounds(3000, shard_rows=512, unit_rows=512)
    plan = EpochPlan(bounds, seed=0, epoch=0, shuffle=True, window=3, consumer=0, consumers=1)
    ends = np.cumsum(plan.segment_sizes())
    assert plan.locate(0) == (2, 0)
    assert plan.locate(int(ends[0])) == (3, 0)
    assert plan.locate(int(ends[0]) + 5) == (3, 5)
    assert plan.locate(3000) == (len(plan.units), 0)


# --------------------------------------------------------------------------- #
# exact batches
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("k", [1, 4])
def test_stream_equals_random_access_on_pong(pong_store, pong_truth, k: int) -> None:
    """Units of 64 rows inside Pong/1's one shard: boundaries everywhere, frames exact."""
    ds = AtariZarrDataset(pong_store.url, frame_stack=k)
    batches = list(ds.stream(40, seed=5, unit_rows=64, shuffle_buffer=128))
    rows = rows_of(batches)
    assert sorted(rows.tolist()) == list(range(len(ds)))
    batch = torch.cat(batches)  # small: Pong/1 has about 700 transitions
    exp_obs, exp_next = expected(pong_truth, rows, k)
    np.testing.assert_array_equal(batch["observation"].numpy(), exp_obs)
    np.testing.assert_array_equal(batch["next", "observation"].numpy(), exp_next)
    np.testing.assert_array_equal(batch["action"].numpy(), pong_truth.action[rows])
    np.testing.assert_array_equal(batch["next", "reward"].numpy()[:, 0], pong_truth.reward[rows])
    np.testing.assert_array_equal(batch["episode"].numpy(), pong_truth.episode[rows])
    assert_same(ds, batches)
    # the unit boundaries were crossed by stacks and next observations
    assert set(range(63, len(ds) - 1, 64)) <= set(rows.tolist())


@pytest.mark.parametrize("k", [1, 3])
def test_stream_keeps_final_observations(small_store: str, k: int) -> None:
    ds = AtariZarrDataset(small_store, frame_stack=k)
    batches = list(ds.stream(512, seed=1, unit_rows=1024, shuffle_buffer=3000))
    assert sorted(rows_of(batches).tolist()) == list(range(len(ds)))
    assert_same(ds, batches[:2])
    for batch in batches:
        done = batch["next", "done"][:, 0]
        last = batch["next", "observation"][done]
        if k > 1:
            last = last[:, -1]
        eps = batch["episode"][done].numpy()
        np.testing.assert_array_equal(last.numpy(), frame_of(10**6 + eps))


@pytest.mark.parametrize("compiled", [True, False], ids=["chunk-loop", "one-call-a-chunk"])
def test_units_decode_beside_the_loop_without_the_gil(
    small_store: str, monkeypatch, compiled: bool
) -> None:
    """Where there is a second core, the units decode off the GIL while the loop gathers
    batches: a unit's whole chunks in one call of the compiled chunk loop, the others
    (and every chunk without the loop) with the background decoder (c-blosc2 through
    ctypes), or with the default (python-blosc2) while the loop waits for a unit; every
    frame goes through one of them, and the batches equal random access."""
    from atari_zarr.read import chunks
    from atari_zarr.storage import engine
    from atari_zarr.storage.chunk_loop import ChunkLoop

    monkeypatch.setattr(engine, "cpu_count", lambda: 2)
    looped = {"bytes": 0}
    if compiled:
        real_run = ChunkLoop.run

        def run(self, src, srclen, dest, destsize, **kw):
            status = real_run(self, src, srclen, dest, destsize, **kw)
            looped["bytes"] += int((status == 0).sum()) * destsize
            return status

        monkeypatch.setattr(ChunkLoop, "run", run)
    else:
        monkeypatch.setattr(chunks, "chunk_loop", lambda: None)
    assert engine.background_decoder() is engine.blosc_decoder("libblosc2")
    decoded = {"beside": 0, "alone": 0}

    def counting(name, real):
        def decode(src, dest) -> None:
            decoded[name] += dest.nbytes
            real(src, dest)

        return decode

    beside, alone = engine.background_decoder(), engine.blosc_decoder()
    monkeypatch.setattr(chunks, "background_decoder", lambda: counting("beside", beside))
    monkeypatch.setattr(chunks, "blosc_decoder", lambda: counting("alone", alone))
    ds = AtariZarrDataset(small_store, frame_stack=4)
    batches = list(ds.stream(512, seed=3, unit_rows=1024))
    assert sorted(rows_of(batches).tolist()) == list(range(len(ds)))
    assert_same(ds, batches)
    assert decoded["beside"] + decoded["alone"] + looped["bytes"] >= len(ds) * 84 * 84, decoded
    assert (looped["bytes"] >= len(ds) * 84 * 84 // 2) == compiled, looped


@pytest.mark.parametrize("k", [1, 3])
def test_frames_gathered_on_the_thread_are_those_numpy_gathers(
    small_store: str, monkeypatch, k: int
) -> None:
    """A batch's frames are gathered on a thread of their own while the next batch is
    planned: every batch, key by key, is the one the gather on the calling thread (the
    way before, numpy's) gives, and every frame went through the thread."""
    from atari_zarr.storage import row_gather

    ds = AtariZarrDataset(small_store, frame_stack=k)
    threaded = {"frames": 0}
    real_submit = row_gather.Gatherer.submit

    def submit(self, src, index, out):  # type: ignore[no-untyped-def]
        threaded["frames"] += len(out) if self.threaded else 0
        return real_submit(self, src, index, out)

    monkeypatch.setattr(row_gather.Gatherer, "submit", submit)
    on_thread = list(ds.stream(256, seed=2, unit_rows=1024, shuffle_buffer=3000))
    assert threaded["frames"] >= len(ds) * 2
    monkeypatch.setattr(row_gather, "_calls", lambda: None)
    by_numpy = list(ds.stream(256, seed=2, unit_rows=1024, shuffle_buffer=3000))
    assert len(on_thread) == len(by_numpy) == -(-len(ds) // 256)
    for a, b in zip(on_thread, by_numpy, strict=True):
        for key in b.keys(include_nested=True, leaves_only=True):
            assert torch.equal(a[key], b[key]), key
    assert_same(ds, on_thread[:3])


def test_single_transitions_from_the_segments_values_equal_the_planned_batches(
    odd_store: str, monkeypatch
) -> None:
    """Single transitions (no stack, no final frames kept) are built from values their
    segment computed: every batch equals, key by key and in key order, the batch planned
    one by one as before, frames after episodes' ends and after the store's last row
    zeroed; and equals random access."""
    from atari_zarr.read.units import UnitReader

    ds = AtariZarrDataset(odd_store)
    built = {"batches": 0}
    real_plan = UnitReader._plan_transitions

    def plan(self, items, oldest):  # type: ignore[no-untyped-def]
        built["batches"] += 1
        return real_plan(self, items, oldest)

    monkeypatch.setattr(UnitReader, "_plan_transitions", plan)
    lean = list(ds.stream(256, seed=4, unit_rows=1024, shuffle_buffer=3000))
    assert built["batches"] == len(lean) == -(-len(ds) // 256)
    real_init = UnitReader.__init__

    def one_by_one(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        real_init(self, *args, **kwargs)
        self.lean = False

    monkeypatch.setattr(UnitReader, "__init__", one_by_one)
    planned = list(ds.stream(256, seed=4, unit_rows=1024, shuffle_buffer=3000))
    assert built["batches"] == len(lean)  # the second epoch planned batch by batch
    for a, b in zip(lean, planned, strict=True):
        keys = list(b.keys(include_nested=True, leaves_only=True))
        assert list(a.keys(include_nested=True, leaves_only=True)) == keys
        for key in keys:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    both = torch.cat(lean)
    ends = both["next", "done"][:, 0] | (both["index"] == len(ds) - 1)
    assert ends.sum() > 10 and not both["next", "observation"][ends].any()
    assert_same(ds, lean[:3])


def test_the_gathering_thread_ends_with_the_epoch_and_when_it_is_left(small_store: str) -> None:
    from tests.storage.test_row_gather import TASKS, _rows_threads

    if not TASKS.is_dir():
        pytest.skip("threads' names from /proc")
    before = _rows_threads()
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(256, seed=2, unit_rows=1024)
    batches = iter(stream)
    kept = [next(batches) for _ in range(3)]
    assert _rows_threads() == before + 1
    batches.close()  # the job stopped mid-epoch
    assert _rows_threads() == before
    # the rest of the epoch: not the batch planned ahead but never handed out
    rest = rows_of(list(stream))
    assert sorted([*rows_of(kept).tolist(), *rest.tolist()]) == list(range(len(ds)))
    assert _rows_threads() == before
    assert_same(ds, kept)  # batches held stay as they were


def test_same_seed_same_order_and_shuffle_false_is_stored_order(small_store: str) -> None:
    ds = AtariZarrDataset(small_store)
    a = rows_of(list(ds.stream(256, seed=4, unit_rows=1024)))
    b = rows_of(list(ds.stream(256, seed=4, unit_rows=1024)))
    c = rows_of(list(ds.stream(256, seed=5, unit_rows=1024)))
    e = rows_of(list(ds.stream(256, seed=4, epoch=1, unit_rows=1024)))
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist() and a.tolist() != e.tolist()
    assert rows_of(list(ds.stream(256, shuffle=False))).tolist() == list(range(len(ds)))


def test_batches_mix_the_units_of_the_buffer(small_store: str) -> None:
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(256, seed=0, unit_rows=512, shuffle_buffer=2048)
    assert stream.window == 4
    units = [np.unique(b["index"].numpy() // 512).size for b in stream][2:-2]
    assert np.mean(units) >= 3.5  # about the window of 4 units in every batch


# --------------------------------------------------------------------------- #
# ranks and workers
# --------------------------------------------------------------------------- #


def test_two_ranks_times_two_workers_cover_the_epoch_once(small_store: str) -> None:
    ds = AtariZarrDataset(small_store, frame_stack=2)
    seen = []
    for rank in range(2):
        stream = ds.stream(300, seed=9, rank=rank, world_size=2, unit_rows=512)
        loader = torch.utils.data.DataLoader(
            stream,
            batch_size=None,
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=collate_batch,
        )
        for batch in loader:
            seen.append(batch["index"].numpy())
            assert batch["observation"].shape[1:] == (2, 84, 84)
    rows = np.concatenate(seen)
    assert len(rows) == len(ds) and np.unique(rows).size == len(ds)


def test_batches_larger_than_units(small_store: str, caplog, units_held: str) -> None:
    """A batch spanning many segments holds more units than the window: the slab grows
    (kept units have a slot each already)."""
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(1500, seed=1, unit_rows=256, shuffle_buffer=512, units_ahead=1)
    with caplog.at_level("DEBUG", logger="atari_zarr"):
        batches = list(stream)
    assert ("growing the slab" in caplog.text) is (units_held == "window")
    assert sorted(rows_of(batches).tolist()) == list(range(len(ds)))
    assert_same(ds, batches[:1])


def test_drop_last_gives_every_consumer_the_same_batches(small_store: str) -> None:
    ds = AtariZarrDataset(small_store)
    counts, rows = [], []
    for rank in range(3):
        batches = list(
            ds.stream(256, seed=2, rank=rank, world_size=3, drop_last=True, unit_rows=512)
        )
        counts.append(len(batches))
        assert all(len(b) == 256 for b in batches)
        rows.append(rows_of(batches))
    assert len(set(counts)) == 1 and counts[0] > 0
    all_rows = np.concatenate(rows)
    assert np.unique(all_rows).size == len(all_rows) > len(ds) - 3 * 256


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """14,116 transitions: 3 whole shards and one of 1,828 rows."""
    return write_store(str(tmp_path_factory.mktemp("odd") / "s.zarr"), 14_116, final=False)


def per_rank(stream_of, world_size: int) -> list[list[TensorDict]]:
    return [list(stream_of(rank, world_size)) for rank in range(world_size)]


@pytest.mark.parametrize("world_size", [3, 7])
def test_every_rank_gets_the_same_batches_by_default(odd_store: str, world_size: int) -> None:
    """Padded as DistributedSampler pads: every transition once, a repeat where one is short."""
    ds = AtariZarrDataset(odd_store)
    ranks = per_rank(lambda r, w: ds.stream(64, seed=1, rank=r, world_size=w), world_size)
    shapes = {tuple(len(b) for b in batches) for batches in ranks}
    assert len(shapes) == 1, shapes  # the same number of batches, of the same sizes
    rows = np.concatenate([rows_of(batches) for batches in ranks])
    assert set(rows.tolist()) == set(range(len(ds)))
    assert len(rows) - len(ds) == -len(ds) % world_size  # fewer than one repeat per rank
    for batches in ranks:  # a rank's padding repeats one of its own transitions
        mine = rows_of(batches)
        assert len(mine) - np.unique(mine).size <= 1
    assert_same(ds, ranks[-1][-1:])


@pytest.mark.parametrize("world_size", [3, 7])
def test_drop_last_leaves_out_less_than_a_batch_per_rank(odd_store: str, world_size: int) -> None:
    ds = AtariZarrDataset(odd_store)
    ranks = per_rank(
        lambda r, w: ds.stream(64, seed=1, rank=r, world_size=w, drop_last=True), world_size
    )
    counts = {len(batches) for batches in ranks}
    assert len(counts) == 1 and counts.pop() > 0
    rows = np.concatenate([rows_of(batches) for batches in ranks])
    assert np.unique(rows).size == len(rows)
    assert len(ds) - len(rows) < world_size * 64


def test_windows_of_a_small_store_fill_every_rank(tmp_path) -> None:
    """10,000 rows, windows of 30, 4 ranks, drop_last: batches on every rank, as many."""
    ds = AtariZarrDataset(write_store(str(tmp_path / "s.zarr"), 10_000, max_len=400))
    w = ds.windows(30)
    ranks = per_rank(lambda r, n: w.stream(32, seed=0, rank=r, world_size=n, drop_last=True), 4)
    counts = {len(batches) for batches in ranks}
    assert len(counts) == 1 and counts.pop() > 0
    starts = np.concatenate([b["index"][:, 0].numpy() for bs in ranks for b in bs])
    assert np.unique(starts).size == len(starts) > len(w) - 4 * 32


def test_an_epoch_too_small_for_the_world_is_one_line(tmp_path) -> None:
    ds = AtariZarrDataset(write_store(str(tmp_path / "s.zarr"), 5, final=False))
    with pytest.raises(InvalidArgumentError, match="5 transitions, fewer than its 7 consumers"):
        next(iter(ds.stream(4, rank=0, world_size=7)))
    with pytest.raises(InvalidArgumentError, match="drop_last=True leaves no batch of 4") as err:
        next(iter(ds.stream(4, rank=0, world_size=2, drop_last=True)))
    assert "\n" not in str(err.value)
    # in the main process, before any worker starts
    with pytest.raises(InvalidArgumentError, match="fewer than its 6 consumers"):
        next(iter(ds.stream(4, rank=0, world_size=3).loader(num_workers=2)))


def test_balance_holds_with_workers_and_after_a_resume(odd_store: str) -> None:
    ds = AtariZarrDataset(odd_store)
    counts = []
    for rank in range(2):
        stream = ds.stream(256, seed=4, rank=rank, world_size=2, unit_rows=1024)
        loader = stream.loader(num_workers=2, multiprocessing_context="fork")
        first = []
        for batch in loader:
            first.append(batch)
            if len(first) == 5:
                break
        state = stream.state_dict()
        again = ds.stream(256, seed=4, rank=rank, world_size=2, unit_rows=1024)
        again.load_state_dict(state)
        rest = list(again.loader(num_workers=2, multiprocessing_context="fork"))
        counts.append(len(first) + len(rest))
    assert counts[0] == counts[1]


def test_several_stores_give_every_rank_the_same_batches(odd_store: str, small_store: str) -> None:
    mg = MultiGameDataset([odd_store, small_store])
    ranks = per_rank(lambda r, w: mg.stream(100, seed=2, rank=r, world_size=w), 3)
    assert len({tuple(len(b) for b in batches) for batches in ranks}) == 1
    index = np.concatenate([b["index"].numpy() for bs in ranks for b in bs])
    assert set(index.tolist()) == set(range(len(mg)))
    assert len(index) - len(mg) < 3 * 2  # at most one repeat per store and rank
    dropped = per_rank(lambda r, w: mg.stream(100, seed=2, rank=r, world_size=w, drop_last=True), 3)
    assert len({len(batches) for batches in dropped}) == 1
    kept = np.concatenate([b["index"].numpy() for bs in dropped for b in bs])
    assert np.unique(kept).size == len(kept) > len(mg) - 3 * 100


def test_rank_from_torch_distributed(small_store: str, monkeypatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    ds = AtariZarrDataset(small_store)
    mine = rows_of(list(ds.stream(512, seed=0, unit_rows=512)))
    explicit = rows_of(list(ds.stream(512, seed=0, rank=1, world_size=2, unit_rows=512)))
    assert mine.tolist() == explicit.tolist() and 0 < len(mine) < len(ds)


# --------------------------------------------------------------------------- #
# resume
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("stop_after", [1, 19])
def test_resume_yields_exactly_what_was_not_seen(small_store: str, stop_after: int) -> None:
    ds = AtariZarrDataset(small_store, frame_stack=2)
    stream = ds.stream(200, seed=6, unit_rows=1024, shuffle_buffer=3072)
    first = first_batches(stream, stop_after)
    state = stream.state_dict()
    assert state["positions"] == {0: 200 * stop_after}
    again = ds.stream(200, seed=0, unit_rows=1024, shuffle_buffer=3072)
    again.load_state_dict(state)
    rest = list(again)
    rows = np.concatenate([rows_of(first), rows_of(rest)])
    assert sorted(rows.tolist()) == list(range(len(ds)))
    # and the rest is exactly the tail of the uninterrupted epoch
    whole = rows_of(list(ds.stream(200, seed=6, unit_rows=1024, shuffle_buffer=3072)))
    assert rows.tolist() == whole.tolist()
    assert_same(ds, rest[:3])


def test_a_batch_larger_than_memory_is_refused_by_the_stream_as_by_sample(
    small_store: str,
) -> None:
    ds = AtariZarrDataset(small_store, frame_stack=4)
    windows = ds.windows(1000, pad=True)  # a window's stacks: 56 MB of frames
    too_many = process_memory() // (1000 * 2 * 4 * 84 * 84) + 1
    for make in (lambda: ds.stream(10**9), lambda: windows.stream(too_many)):
        with pytest.raises(InvalidArgumentError, match="GiB of frames in one batch") as err:
            make()
        assert "\n" not in str(err.value) and "pass a smaller batch_size" in str(err.value)
    with pytest.raises(InvalidArgumentError, match="GiB of frames in one batch"):
        windows.sample(too_many)  # the same check as sample()'s


def test_set_epoch_of_the_loaded_state_keeps_its_progress(small_store: str) -> None:
    """The DistributedSampler loop: load a state, then set_epoch(epoch) as every epoch does."""
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(200, seed=6, unit_rows=1024)
    stream.set_epoch(3)
    first = first_batches(stream, 5)
    state = stream.state_dict()
    again = ds.stream(200, seed=6, unit_rows=1024)
    again.load_state_dict(state)
    again.set_epoch(3)  # the loaded state's own epoch: its progress stays
    rest = rows_of(list(again))
    assert len(rest) == len(ds) - 1000
    assert sorted(np.concatenate([rows_of(first), rest]).tolist()) == list(range(len(ds)))
    again.set_epoch(3)  # after reading: a new pass over epoch 3, as before
    assert len(rows_of(list(again))) == len(ds)
    other = ds.stream(200, seed=6, unit_rows=1024)
    other.load_state_dict(state)
    other.set_epoch(4)  # another epoch: a fresh permutation, progress reset
    assert len(rows_of(list(other))) == len(ds)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_finished_epoch_says_so_and_how_to_start_the_next(small_store: str, drop_last) -> None:
    """Iterating a finished stream gave 0 batches without a word, and its loader with 2
    workers said the epoch had "fewer than its 2 consumers". Both yield nothing (as
    the DataLoader loop with ``set_epoch`` expects of an epoch that is done) and say
    in one line that the epoch is over and how to start the next; so does a stream
    loaded from a state saved at the end of its epoch."""
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(256, seed=2, unit_rows=1024, drop_last=drop_last)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the epoch itself says nothing
        assert len(rows_of(list(stream))) == (len(ds) // 256 * 256 if drop_last else len(ds))
    state = stream.state_dict()
    loaded = [ds.stream(256, seed=2, unit_rows=1024, drop_last=drop_last) for _ in range(2)]
    for stream_of in loaded:
        stream_of.load_state_dict(state)
    for again in (
        lambda: list(stream),
        lambda: list(stream.loader(num_workers=2, multiprocessing_context="fork")),
        lambda: list(loaded[0]),
        lambda: list(loaded[1].loader(num_workers=2, multiprocessing_context="fork")),
    ):
        with pytest.warns(UserWarning) as caught:
            assert again() == []
        [warning] = [str(w.message) for w in caught]
        assert "\n" not in warning and "consumers" not in warning, warning
        assert f"epoch 0 of {small_store} is over" in warning, warning
        assert "stream.set_epoch(1) to start the next epoch" in warning, warning
    stream.set_epoch(1)
    assert len(rows_of(list(stream))) > 0


def test_resume_through_a_dataloader_with_workers(small_store: str) -> None:
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(256, seed=1, unit_rows=512)
    loader = stream.loader(num_workers=2, multiprocessing_context="fork")
    first = []
    for batch in loader:
        first.append(batch["index"].numpy())
        if len(first) == 9:
            break
    state = stream.state_dict()
    assert state["consumers"] == 2 and sum(state["positions"].values()) == 9 * 256
    resumed = ds.stream(256, seed=1, unit_rows=512)
    resumed.load_state_dict(state)
    rest = [b["index"].numpy() for b in resumed.loader(num_workers=2)]
    rows = np.concatenate(first + rest)
    assert len(rows) == len(ds) and np.unique(rows).size == len(ds)
    # one consumer, saved with two: the rest of the epoch, each item once
    alone = ds.stream(256, seed=1, unit_rows=512)
    alone.load_state_dict(state)
    rest = [b["index"].numpy() for b in alone]
    rows = np.concatenate(first + rest)
    assert len(rows) == len(ds) and np.unique(rows).size == len(ds)


def test_state_of_another_stream_is_refused(small_store: str) -> None:
    ds = AtariZarrDataset(small_store)
    state = ds.stream(64, unit_rows=512).state_dict()
    with pytest.raises(InvalidArgumentError, match="does not belong to this stream"):
        ds.stream(64, unit_rows=1024).load_state_dict(state)


def test_epochs_and_bad_arguments(small_store: str) -> None:
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(4096, seed=0)
    assert isinstance(stream, AtariZarrStream) and isinstance(
        stream, torch.utils.data.IterableDataset
    )
    assert len(list(stream)) == 2
    with pytest.warns(UserWarning, match=r"epoch 0 of .* is over.*set_epoch\(1\)"):
        assert list(stream) == []  # the epoch is done until set_epoch
    stream.set_epoch(1)
    assert len(list(stream)) == 2
    # pickles (spawn workers): the store is opened again, the progress kept
    stream.set_epoch(2)
    copy = pickle.loads(pickle.dumps(stream))
    assert rows_of(list(copy)).tolist() == rows_of(list(stream)).tolist()
    for kwargs, match in [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"batch_size": 8, "unit_rows": 100}, "unit_rows must be a multiple"),
        ({"batch_size": 8, "units_ahead": 0}, "units_ahead must be a positive integer"),
        ({"batch_size": 8, "rank": 2, "world_size": 2}, r"rank must be in \[0, world_size\)"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            ds.stream(**kwargs)
    assert (
        stream_memory_bound(shuffle_buffer=0, units_ahead=1, unit_rows=16)
        == 3 * 17 * 84 * 84 + 17 * 84 * 84
    )


def test_unsharded_layout_reads_through_zarr(tmp_path, small_store: str) -> None:
    """A store whose frames are not sharded: same batches through zarr's own reads."""
    src = zarr.open_group(small_store, mode="r")
    attrs = dict(src.attrs)
    n = 2000  # a prefix: the per-episode table no longer adds up, the arrays are used
    dst = zarr.open_group(str(tmp_path / "u.zarr"), mode="w", attributes=attrs)
    for name in src.array_keys():
        a = src[name]
        rows = a.shape[0] if name == FINAL_OBSERVATION else n
        b = dst.create_array(
            name, shape=(rows, *a.shape[1:]), dtype=a.dtype, chunks=(512, *a.shape[1:])
        )
        b[:] = a[:rows]
    for name in src.group_keys():
        for sub in src[name].array_keys():
            a = src[name][sub]
            b = dst.create_array(f"{name}/{sub}", shape=(n,), dtype=a.dtype, chunks=(512,))
            b[:] = a[:n]
    ds = AtariZarrDataset(str(tmp_path / "u.zarr"), frame_stack=2)
    stream = ds.stream(512, seed=3)
    assert not stream.units.fast
    batches = list(stream)
    assert sorted(rows_of(batches).tolist()) == list(range(len(ds)))
    assert_same(ds, batches)


# --------------------------------------------------------------------------- #
# several stores
# --------------------------------------------------------------------------- #


def test_multi_game_stream_orders_units_by_weight(small_store: str, odd_store: str) -> None:
    """Weights decide which store's units come first; every item still comes once."""
    n_small = len(AtariZarrDataset(small_store))
    where = {}
    for w in ([0.9, 0.1], [0.1, 0.9]):
        mix = MultiGameDataset([small_store, odd_store], weights=w)
        batches = list(mix.stream(100, seed=0, unit_rows=512, shuffle_buffer=1024))
        rows = rows_of(batches)
        assert sorted(rows.tolist()) == list(range(len(mix)))
        assert_same(mix, batches[:3])
        assert set(batches[0].keys()) >= {"game_id", "row", "index", "observation"}
        # where the small store's items are in the epoch, 0 (first) to 1 (last)
        where[w[0]] = np.flatnonzero(rows < n_small).mean() / len(rows)
    assert where[0.9] < 0.3 and where[0.1] > 0.6, where


def test_interleave_draws_each_next_unit_by_weight() -> None:
    """Among the first units, each store's share is its weight (both have units left)."""
    from atari_zarr.read.epoch import interleave

    stores = np.repeat([0, 1, 2], 2000)
    order = interleave(
        np.full(6000, 4096), stores, np.array([0.6, 0.3, 0.1]), np.random.default_rng(1)
    )
    assert sorted(order.tolist()) == list(range(6000))
    share = np.bincount(stores[order[:1500]], minlength=3) / 1500
    np.testing.assert_allclose(share, [0.6, 0.3, 0.1], atol=0.04)
    # each store's units keep their order
    for g in range(3):
        mine = order[stores[order] == g]
        assert (np.diff(mine) > 0).all()


# --------------------------------------------------------------------------- #
# TorchRL
# --------------------------------------------------------------------------- #


def test_dqn_loss_runs_on_stream_batches_as_they_are(small_store: str) -> None:
    """TorchRL's DQNLoss takes a stream batch as is: keys, shapes and dtypes match."""
    pytest.importorskip("torchrl")
    from torch import nn
    from torchrl.data import Categorical
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss

    class Scale(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.float() / 255

    net = nn.Sequential(
        Scale(), nn.Conv2d(4, 8, 8, stride=4), nn.ReLU(), nn.Flatten(-3), nn.Linear(3200, 6)
    )
    actor = QValueActor(net, in_keys=["observation"], spec=Categorical(6))
    loss_fn = DQNLoss(actor, action_space="categorical", delay_value=False)
    ds = AtariZarrDataset(small_store, frame_stack=4)
    for i, batch in enumerate(ds.stream(64, seed=0, unit_rows=1024)):
        loss = loss_fn(batch)["loss"]
        loss.backward()
        if i == 1:
            break
    assert torch.isfinite(loss) and net[1].weight.grad is not None


# --------------------------------------------------------------------------- #
# elastic: a state resumes on any number of ranks and workers
# --------------------------------------------------------------------------- #


def lockstep(streams, batches: int) -> list[np.ndarray]:
    """``batches`` batches of every rank's stream, as DDP ranks step together."""
    its = [iter(s) for s in streams]
    return [rows_of([next(it) for _ in range(batches)]) for it in its]


@pytest.mark.parametrize(("before", "after"), [(8, 6), (3, 5), (4, 1)])
def test_a_job_saved_on_some_ranks_resumes_on_others_with_exactly_the_rest(
    small_store: str, before: int, after: int
) -> None:
    ds = AtariZarrDataset(small_store)
    opts = {"seed": 5, "unit_rows": 512, "shuffle_buffer": 1536}
    streams = [ds.stream(50, rank=r, world_size=before, **opts) for r in range(before)]
    first = np.concatenate(lockstep(streams, 3))
    states = [s.state_dict() for s in streams]
    # every rank's state describes the whole job: rank 0's is enough
    assert all(st["consumed"] == states[0]["consumed"] for st in states)
    resumed = []
    for r in range(after):
        again = ds.stream(50, rank=r, world_size=after, **opts)
        again.load_state_dict(states[0])
        resumed.append(rows_of(list(again)))
    rest = np.concatenate(resumed)
    everything = np.concatenate([first, rest])
    assert set(everything.tolist()) == set(range(len(ds)))
    # each item once: the only repeats are the padding of each generation's short consumers
    assert len(everything) - len(ds) < before + after
    assert len({len(x) for x in resumed}) == 1  # and the new ranks stay balanced
    # the saved state names exactly the items emitted
    from atari_zarr.read.epoch import Consumed

    sizes = np.diff(streams[0].units.bounds, axis=1).reshape(-1)
    assert Consumed.decode(states[0]["consumed"], sizes).count == len(set(first.tolist()))


@pytest.mark.parametrize(("workers", "again"), [(2, 1), (1, 0), (0, 2)])
def test_a_state_resumes_with_another_number_of_dataloader_workers(
    small_store: str, workers: int, again: int
) -> None:
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(128, seed=2, unit_rows=512)
    first = []

    def loader(stream, n):
        return stream.loader(num_workers=n, **({"multiprocessing_context": "fork"} if n else {}))

    for batch in loader(stream, workers):
        first.append(batch)
        if len(first) == 7:
            break
    state = stream.state_dict()
    resumed = ds.stream(128, seed=2, unit_rows=512)
    resumed.load_state_dict(state)
    rest = list(loader(resumed, again))
    rows = np.concatenate([rows_of(first), rows_of(rest)])
    assert set(rows.tolist()) == set(range(len(ds)))
    assert len(rows) - len(ds) < max(workers, 1) + max(again, 1)
    # and a state saved after the resume carries on again
    assert resumed.state_dict()["consumed"] != state["consumed"]


def test_windows_and_several_stores_resume_elastically(small_store: str, odd_store: str) -> None:
    mg = MultiGameDataset([small_store, odd_store])
    for mixed in (mg, mg.windows(8)):
        streams = [mixed.stream(64, seed=1, rank=r, world_size=4, unit_rows=1024) for r in range(4)]
        first = lockstep(streams, 5)
        state = streams[0].state_dict()
        rest = []
        for r in range(3):
            again = mixed.stream(64, seed=1, rank=r, world_size=3, unit_rows=1024)
            again.load_state_dict(state)
            rest.append(torch.cat(list(again)))
        got = np.concatenate(first + [t["index"].numpy() for t in rest])
        starts = got if got.ndim == 1 else got[:, 0]
        want = mixed.locate(np.arange(len(mixed)))
        everything = mixed[np.arange(len(mixed))]["index"]
        wanted = everything.numpy() if everything.ndim == 1 else everything[:, 0].numpy()
        assert len(want[0]) == len(mixed)
        assert set(starts.tolist()) == set(wanted.tolist())
        assert len(starts) - len(mixed) < 2 * (4 + 3)  # padding: a store and a consumer at most


def test_a_state_loads_only_into_its_stores_in_their_order_with_its_weights(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two runs of equal length (as whole DQN Replay runs often are): the lengths alone
    cannot tell them apart, so a state names its stores and records their weights."""
    lengths = [40, 25, 60, 35] * 5
    pong = write_episodes_store(tmp_path_factory.mktemp("pong"), lengths, game="Pong")
    breakout = write_episodes_store(tmp_path_factory.mktemp("breakout"), lengths, game="Breakout")
    mix = MultiGameDataset([pong, breakout], weights=[0.7, 0.3])
    stream = mix.stream(50, seed=2, unit_rows=256)
    first = first_batches(stream, 4)
    state = stream.state_dict()
    names = [i["name"] for i in state["members"]]
    assert names == ["Pong/1", "Breakout/1"] and len(state["weights"]) == 2
    assert all(i["content"] and i["rows"] == len(mix) // 2 for i in state["members"])
    swapped = MultiGameDataset([breakout, pong], weights=[0.3, 0.7])
    with pytest.raises(
        InvalidArgumentError, match=r"store 0's name 'Pong/1', here 'Breakout/1'"
    ) as err:
        swapped.stream(50, seed=2, unit_rows=256).load_state_dict(state)
    assert "\n" not in str(err.value) and "same order" in str(err.value)
    reweighted = MultiGameDataset([pong, breakout], weights=[0.5, 0.5])
    with pytest.raises(InvalidArgumentError, match=r"weights \[0.7, 0.3") as err:
        reweighted.stream(50, seed=2, unit_rows=256).load_state_dict(state)
    assert "\n" not in str(err.value)
    unweighted = MultiGameDataset([pong, breakout])
    with pytest.raises(InvalidArgumentError, match=r"here None"):
        unweighted.stream(50, seed=2, unit_rows=256).load_state_dict(state)
    # the same stores, order and weights: exactly the rest of the epoch
    again = MultiGameDataset([pong, breakout], weights=[0.7, 0.3]).stream(50, seed=2, unit_rows=256)
    again.load_state_dict(state)
    rest = list(again)
    seen = np.concatenate([rows_of(first), rows_of(rest)])
    assert sorted(seen.tolist()) == list(range(len(mix)))


def test_a_state_loads_only_into_the_same_content_and_shards(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Two stores of one name and length: a state of one does not load into the other
    (another content), nor into a stream cut along other shards."""
    a = write_episodes_store(tmp_path_factory.mktemp("a"), [40, 25, 60, 35] * 5)
    b = write_episodes_store(tmp_path_factory.mktemp("b"), [25, 40, 35, 60] * 5)
    stream = AtariZarrDataset(a).stream(50, seed=1, unit_rows=256)
    next(iter(stream))
    state = stream.state_dict()
    assert AtariZarrDataset(a)[0]["index"] == AtariZarrDataset(b)[0]["index"]
    with pytest.raises(InvalidArgumentError, match="store 0's content") as err:
        AtariZarrDataset(b).stream(50, seed=1, unit_rows=256).load_state_dict(state)
    assert "\n" not in str(err.value)
    state["members"][0]["shard_rows"] = 512
    with pytest.raises(InvalidArgumentError, match="store 0's shard_rows 512"):
        AtariZarrDataset(a).stream(50, seed=1, unit_rows=256).load_state_dict(state)


def test_a_state_whose_emitted_items_are_damaged_is_one_line(small_store: str) -> None:
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(64, seed=0, unit_rows=512)
    next(iter(stream))
    state = stream.state_dict()
    for spoiled in ({"units": 3}, {**state["consumed"], "done": "%%%"}, None):
        again = ds.stream(64, seed=0, unit_rows=512)
        with pytest.raises(
            InvalidArgumentError, match="does not say which items were emitted"
        ) as err:
            again.load_state_dict({**state, "consumed": spoiled})
        assert "\n" not in str(err.value) and "Pass the state as saved" in str(err.value)


def test_stream_arguments_and_states_never_fail_silently(small_store: str) -> None:
    """Each of these was accepted (or failed with a raw error) and read the wrong part."""
    ds = AtariZarrDataset(small_store)
    stream = ds.stream(64, seed=0, unit_rows=512)
    next(iter(stream))
    state = stream.state_dict()
    import json

    saved = json.loads(json.dumps(state))  # as a checkpoint file keeps it: string keys
    ds.stream(64, seed=0, unit_rows=512).load_state_dict(saved)
    bad_states = [
        ({**state, "positions": {0: 10**9}}, "more than the"),
        ({**state, "positions": {0: 1.5}}, "positions"),
        ({**state, "epoch": 1.7}, "epoch must be a non-negative integer"),
        ({**state, "epoch": "abc"}, "epoch must be a non-negative integer"),
        ({**state, "positions": None}, "positions must be a dict"),
        (None, "must be the dict its state_dict"),
        ([state], "must be the dict its state_dict"),
    ]
    for spoiled, match in bad_states:
        again = ds.stream(64, seed=0, unit_rows=512)
        with pytest.raises(InvalidArgumentError, match=match) as err:
            again.load_state_dict(spoiled)
        assert "\n" not in str(err.value)
    for kwargs, match in [
        ({"world_size": 2}, "expected both"),
        ({"rank": 1}, "expected both"),
        ({"rank": 0.5, "world_size": 2}, "rank must be a non-negative integer"),
        ({"rank": 0, "world_size": 2.0}, "world_size must be a positive integer"),
        ({"rank": 2, "world_size": 2}, "rank must be in"),
        ({"epoch": 1.7}, "epoch must be a non-negative integer"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match) as err:
            ds.stream(64, seed=0, unit_rows=512, **kwargs)
        assert "\n" not in str(err.value)


def test_a_streams_first_batch_loads_no_decoder_module_it_does_not_need(pong_store) -> None:  # type: ignore[no-untyped-def]
    """A local stream of a converted store decodes its units, their edges and its
    per-step columns through the chunk loop and c-blosc2's own call, both loaded with
    the loop: its first batch never waits for python-blosc2's module to import (about
    80 ms), and its values are the store's."""
    import subprocess
    import sys

    code = f"""
import sys
from atari_zarr import AtariZarrDataset
ds = AtariZarrDataset({pong_store.url!r})
batch = next(iter(ds.stream(64, seed=0)))
rows = batch["index"].numpy()
store = ds.members[0].store
assert (batch["action"].numpy() == store.action[rows]).all()
assert (batch["observation"].numpy() == store.observation[rows]).all()
print("blosc2" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# --------------------------------------------------------------------------- #
# a user's fork in the middle of a stream
# --------------------------------------------------------------------------- #


def _flat(batch: TensorDict) -> dict[str, np.ndarray]:
    """Every entry of a batch as an array, by its key."""
    return {
        "/".join(k) if isinstance(k, tuple) else k: batch[k].numpy().copy()
        for k in batch.keys(include_nested=True, leaves_only=True)
    }


def _in_child(work: Any, out: str) -> int:
    """Fork: the child runs ``work()`` and writes what it returns (JSON) into ``out``; the
    parent's answer is the child's pid."""
    import json
    import os

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            with open(out, "w") as f:
                json.dump(work(), f)
            code = 0
        finally:
            os._exit(code)
    return pid


def _child_done(pid: int, timeout: float = 300) -> int:
    """The child's exit code; a child that hangs (a guard, never a time limit) is killed."""
    import os
    import signal
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -999  # hung


def _wrong_items(batch: TensorDict, want: dict[str, np.ndarray]) -> dict[str, int]:
    """Per entry of ``batch``: its items that differ from ``want``'s, byte for byte."""
    got = _flat(batch)
    assert got.keys() == want.keys()
    return {
        key: int((got[key] != value).reshape(len(value), -1).any(axis=1).sum())
        if got[key].shape == value.shape
        else -1
        for key, value in want.items()
    }


@pytest.mark.slow
def test_a_child_forked_in_the_middle_of_a_stream_reads_its_next_batch_exactly(
    small_store: str, tmp_path
) -> None:
    """A user's ``os.fork()`` between two batches: the next batch's frames were queued
    on the parent's gathering thread, which the child does not have. The child's next
    batch is the one the same epoch gives without a fork, byte for byte, and so are the
    parent's (six forks, each while a batch of 2,048 stacks of 4 frames is gathered)."""
    import json

    ds = AtariZarrDataset(small_store, frame_stack=4)
    reference = [_flat(b) for b in ds.stream(2048, seed=3)]
    assert len(reference) == 3
    for trial in range(3):
        it = iter(ds.stream(2048, seed=3))
        for n in range(2):
            mine = next(it)
            out = str(tmp_path / f"{trial}-{n}.json")
            pid = _in_child(lambda it=it, n=n: _wrong_items(next(it), reference[n + 1]), out)
            assert _child_done(pid) == 0
            with open(out) as f:
                wrong = json.load(f)
            assert not any(wrong.values()), (trial, n, wrong)
            assert not any(_wrong_items(mine, reference[n]).values())
        assert not any(_wrong_items(next(it), reference[2]).values())


@pytest.mark.slow
def test_a_child_forked_while_units_load_loads_them_again(
    small_store: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork while the parent's threads load units (one of them holding the decoding
    semaphore): in the child those threads do not exist, so the units they were loading
    would be waited for for ever. The child loads them again and reads the rest of the
    epoch as it is without a fork; the parent too, once its loads go on."""
    import json
    import os
    import threading

    from atari_zarr.read.units import UnitReader

    ds = AtariZarrDataset(small_store, frame_stack=4)
    options = {"seed": 5, "unit_rows": 512, "shuffle_buffer": 512}
    reference = [_flat(b) for b in ds.stream(256, **options)]
    parent, go, holding, release = (
        os.getpid(),
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    real = UnitReader._load

    def load(self: UnitReader, j: int, slot: int) -> None:
        if os.getpid() == parent and j >= 2:  # the parent's loads after the first batch wait
            go.wait()
            with self.decoders:  # one of them holds the decoding semaphore meanwhile
                holding.set()
                release.wait()
        real(self, j, slot)

    monkeypatch.setattr(UnitReader, "_load", load)
    it = iter(ds.stream(256, **options))
    assert not any(_wrong_items(next(it), reference[0]).values())
    go.set()
    assert holding.wait(timeout=300)  # a hang guard
    out = str(tmp_path / "rest.json")
    pid = _in_child(
        lambda: [_wrong_items(b, want) for b, want in zip(it, reference[1:], strict=True)], out
    )
    code = _child_done(pid)
    release.set()
    assert code == 0
    with open(out) as f:
        wrong = json.load(f)
    assert len(wrong) == len(reference) - 1 and not any(any(w.values()) for w in wrong)
    rest = [_wrong_items(b, want) for b, want in zip(it, reference[1:], strict=True)]
    assert not any(any(w.values()) for w in rest)


# --------------------------------------------------------------------------- #
# close: threads joined, files let go, iterators stopped in one line
# --------------------------------------------------------------------------- #


def _our_threads() -> set[tuple[str, int]]:
    """This process's threads of the package: Python's (``atari_zarr-stream_0`` ...) and
    the compiled gathering thread (``atari_zarr-rows``), by name and id."""
    from tests.storage.test_row_gather import TASKS

    found = {(t.name, t.native_id or 0) for t in threading.enumerate()}
    for task in TASKS.iterdir():
        try:
            found.add(((task / "comm").read_text().strip(), int(task.name)))
        except OSError:  # a thread that ended while listed
            pass
    return {(name, tid) for name, tid in found if name.startswith("atari_zarr")}


def _fds_under(root: Path) -> int:
    """This process's descriptors of files under ``root`` (the maps of its shards)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(root))
        except OSError:  # closed meanwhile
            pass
    return count


@pytest.fixture(scope="module")
def few_stores(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Stores only the tests of close() read (each closes what it opened): 6,000
    transitions, and 12 of 40 to 62 (a mixture)."""
    tmp_path = tmp_path_factory.mktemp("closing")
    return [
        write_store(str(tmp_path / "one.zarr"), 6000),
        *(
            write_store(str(tmp_path / f"m{g}.zarr"), 40 + 2 * g, seed=g, max_len=9)
            for g in range(12)
        ),
    ]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads and files from /proc")
@pytest.mark.parametrize(
    "closing", ["dataset", "with dataset", "stream", "with stream", "iterator"]
)
@pytest.mark.parametrize("mixture", [False, True], ids=["one store", "mixture"])
def test_close_stops_every_thread_lets_files_go_and_iterators_say_so(
    few_stores: list[str], closing: str, mixture: bool
) -> None:
    """``close()`` (of the dataset, the stream or the iterator, or the end of a ``with``
    block) in the middle of an epoch: every thread the stream started is stopped and
    joined, no file of its stores stays open, and the iterator's next ``next()`` is one
    line; iterating the stream again reads the rest of the epoch."""
    root = Path(few_stores[0]).parent
    gc.collect()
    before = _our_threads()
    ds = MultiGameDataset(few_stores[1:]) if mixture else AtariZarrDataset(few_stores[0])
    stream = ds.stream(64, seed=3, unit_rows=64, shuffle_buffer=256)
    it = iter(stream)
    if closing.startswith("with"):
        with ds if closing == "with dataset" else stream:
            seen = [next(it) for _ in range(3)]
            started = _our_threads() - before
            held = _fds_under(root)
    else:
        seen = [next(it) for _ in range(3)]
        started = _our_threads() - before
        held = _fds_under(root)
        {"dataset": ds, "stream": stream, "iterator": it}[closing].close()
    # the unit readers and the gathering thread (where the compiled loop is built)
    assert sum(name.startswith("atari_zarr-stream") for name, _ in started) >= 1
    assert held > 0
    assert not (_our_threads() - before), "threads left running after close()"
    if closing.endswith("dataset"):
        assert _fds_under(root) == 0  # every map of its stores let go
    with pytest.raises(DatasetClosedError) as err:
        next(it)
    message = str(err.value)
    assert "\n" not in message and "closed" in message and "Iterate the stream again" in message
    with pytest.raises(DatasetClosedError):  # and again: never a batch, never the end
        next(it)
    # what the message says to do: the rest of the epoch, each item once
    rest = list(stream)
    assert sorted(rows_of(seen + rest).tolist()) == list(range(len(ds)))
    assert_same(ds, seen[:1] + rest[-1:])
    stream.close()
    ds.close()
    assert not (_our_threads() - before)


def _paused_in(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str, closer: Any
) -> dict[str, bool]:
    """Make the first call of ``cls.name`` on this thread wait until ``closer()`` (run on
    another thread) returns, or a while (a hang guard: a close that waits for the call
    never returns meanwhile); what it saw: ``{"returned": close returned meanwhile}``."""
    real, me, seen = getattr(cls, name), threading.current_thread(), {}

    def paused(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is me and not seen:
            done = threading.Event()
            seen["returned"] = False
            thread = threading.Thread(target=lambda: (closer(), done.set()))
            thread.start()
            seen["returned"] = done.wait(timeout=5)
            seen["thread"] = thread  # type: ignore[assignment]
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, paused)
    return seen


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads from /proc")
def test_a_close_from_another_thread_waits_for_the_batch_being_read(
    few_stores: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close()`` on another thread while this one reads a batch (its frames being
    gathered from the slab by the compiled thread): the close waits for the batch to be
    read, never frees the gathering thread, nor gives the slab away, under it. The batch
    is exact, the next ``next()`` is one line, and no thread of the stream is left."""
    from atari_zarr.read.units import UnitReader

    gc.collect()
    before = _our_threads()
    ds = AtariZarrDataset(few_stores[0], frame_stack=4)
    it = iter(ds.stream(512, seed=3, unit_rows=512, shuffle_buffer=512))
    first = next(it)
    seen = _paused_in(monkeypatch, UnitReader, "_finish", it.close)
    second = next(it)  # its frames are gathered while the other thread closes
    seen["thread"].join()  # type: ignore[attr-defined]
    assert not seen["returned"], "close() returned while a batch was being read"
    with pytest.raises(DatasetClosedError):
        next(it)
    assert not (_our_threads() - before)
    assert_same(ds, [first, second])
    ds.close()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads from /proc")
def test_an_iterator_closed_while_its_first_batch_starts_leaves_no_thread(
    few_stores: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close()`` on another thread while the iterator's first ``next()`` makes its unit
    reader (the close finds none to stop): that ``next()`` is one line, not a batch nor
    the end of the epoch, and no thread of the stream is left while the iterator is."""
    from atari_zarr.read.units import UnitReader

    gc.collect()
    before = _our_threads()
    ds = AtariZarrDataset(few_stores[0], frame_stack=4)
    it = iter(ds.stream(512, seed=3, unit_rows=512, shuffle_buffer=512))
    seen = _paused_in(monkeypatch, UnitReader, "__init__", it.close)
    with pytest.raises(DatasetClosedError):
        next(it)
    seen["thread"].join()  # type: ignore[attr-defined]
    assert not (_our_threads() - before), "threads left running after close()"
    with pytest.raises(DatasetClosedError):
        next(it)
    ds.close()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads from /proc")
@pytest.mark.parametrize("closing", ["dataset", "stream"])
def test_close_stops_a_loader_with_worker_processes(few_stores: list[str], closing: str) -> None:
    """``stream.loader(num_workers=2)``, then ``close()`` of the stream or the dataset:
    the loader's worker processes are stopped, and its next ``next()`` is one line, as
    a stream's own iterator gives (never the workers reading on)."""
    import multiprocessing

    ds = AtariZarrDataset(few_stores[0])
    stream = ds.stream(256, seed=3, unit_rows=512, shuffle_buffer=512)
    it = iter(stream.loader(num_workers=2))
    next(it)
    assert len(multiprocessing.active_children()) == 2
    {"dataset": ds, "stream": stream}[closing].close()
    assert not multiprocessing.active_children()
    with pytest.raises(DatasetClosedError):
        next(it)
    ds.close()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads from /proc")
@pytest.mark.parametrize("mixture", [False, True], ids=["one store", "mixture"])
def test_close_of_a_dataset_stops_the_streams_of_its_windows(
    few_stores: list[str], mixture: bool
) -> None:
    """A dataset's ``windows()`` view reads the dataset's stores: the dataset's
    ``close()`` (the end of its ``with`` block) stops the view's streams as its own,
    threads joined and the next ``next()`` one line, never reading on. A view's own
    ``close()`` stops only its streams, not the dataset's."""
    gc.collect()
    before = _our_threads()
    with MultiGameDataset(few_stores[1:]) if mixture else AtariZarrDataset(few_stores[0]) as ds:
        view = ds.windows(4)
        it = iter(view.stream(32, seed=3, unit_rows=64, shuffle_buffer=256))
        next(it)
        own = iter(ds.stream(32, seed=3, unit_rows=64, shuffle_buffer=256))
        next(own)
        ds.windows(4).close()  # another view's close
        next(own)  # the dataset's stream reads on, and the first view's
        next(it)
    assert not (_our_threads() - before), "threads left running after close()"
    with pytest.raises(DatasetClosedError):
        next(it)
    with pytest.raises(DatasetClosedError):
        next(own)
