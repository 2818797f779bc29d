"""Mixtures at scale: hundreds of stores as one dataset, weights as users ask for them.

The stores here are tiny and each holds frames that name the store and the row
(``frame_of(name + row)``), so a frame read from the wrong store or row is caught.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from atari_zarr import AtariZarrDataset, MultiGameDataset
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.mixture import game_numbers, store_weights
from atari_zarr.read.stream import stream_memory_bound
from tests.read.test_stream import frame_of, write_store
from tests.read.test_stream_memory import epoch_rss_growth

STORES = 240
NAME = 10_000  # store g's rows are named g * NAME + row


@pytest.fixture(scope="module")
def many_urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """240 stores of 23 to 61 rows, each with frames of its own."""
    root = tmp_path_factory.mktemp("many")
    return [
        write_store(str(root / f"s{g}.zarr"), 23 + g % 39, seed=g, max_len=9, name=g * NAME)
        for g in range(STORES)
    ]


@pytest.fixture(scope="module")
def many(many_urls: list[str]) -> MultiGameDataset:
    return MultiGameDataset(many_urls)


def check_batches(mix: MultiGameDataset, batches: list, ranks: int) -> None:
    """Every (store, row) once (padding repeats fewer than one item per consumer), each
    item's frames and next frames those of its store's row."""
    index = torch.cat([b["index"] for b in batches]).numpy()
    assert set(index.tolist()) == set(range(len(mix)))
    assert len(index) - len(mix) < ranks
    for b in batches:
        store = np.searchsorted(mix.offsets, b["index"].numpy(), side="right") - 1
        row = b["row"].numpy()
        np.testing.assert_array_equal(row, b["index"].numpy() - mix.offsets[store])
        np.testing.assert_array_equal(b["observation"].numpy(), frame_of(store * NAME + row))
        lengths = np.diff(mix.offsets)[store]
        nxt = b["next", "observation"].numpy()
        done = b["next", "done"].numpy().reshape(-1)
        going = ~done & (row + 1 < lengths)
        np.testing.assert_array_equal(nxt[going], frame_of(store * NAME + row + 1)[going])


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 3])
def test_an_epoch_of_240_stores_yields_every_row_once_with_its_frames(
    many: MultiGameDataset, ranks: int
) -> None:
    batches = []
    counts = set()
    for r in range(ranks):
        mine = list(many.stream(64, seed=2, rank=r, world_size=ranks))
        counts.add(len(mine))
        batches += mine
    assert len(counts) == 1  # every rank the same number of batches
    check_batches(many, batches, ranks)
    # a batch mixes the units of several stores
    assert len(np.unique(np.searchsorted(many.offsets, batches[0]["index"].numpy()))) > 1


@pytest.mark.slow
def test_an_epoch_of_240_stores_through_dataloader_workers(many: MultiGameDataset) -> None:
    stream = many.stream(64, seed=3)
    batches = list(stream.loader(num_workers=2, multiprocessing_context="fork"))
    check_batches(many, batches, 2)
    assert stream.state_dict()["consumed"]["units"] == len(stream.units.bounds)


@pytest.mark.slow
def test_240_stores_resume_on_another_world_size(many: MultiGameDataset) -> None:
    streams = [many.stream(64, seed=4, rank=r, world_size=3) for r in range(3)]
    its = [iter(s) for s in streams]
    first = [next(it) for it in its for _ in range(5)]
    state = streams[0].state_dict()
    rest = []
    for r in range(2):
        again = many.stream(64, seed=4, rank=r, world_size=2)
        again.load_state_dict(state)
        rest += list(again)
    check_batches(many, first + rest, 3 + 2)


def test_a_state_of_an_earlier_release_loads_into_its_stores_only(tmp_path: Path) -> None:
    """A state saved before members' identities were recorded (version 3: names and
    lengths) resumes where its names and lengths are the stream's; a state of one
    state per store (older still) is refused in one line."""
    a = write_store(str(tmp_path / "a.zarr"), 3000, seed=1, name=0)
    b = write_store(str(tmp_path / "b.zarr"), 2000, seed=2, name=NAME)
    opts = {"seed": 1, "unit_rows": 512}
    mix = MultiGameDataset([a, b])
    stream = mix.stream(100, **opts)
    it = iter(stream)
    seen = torch.cat([next(it)["index"] for _ in range(7)])
    state = stream.state_dict()
    ids = state.pop("members")
    old = {**state, "version": 3, "lengths": [i["rows"] for i in ids]}
    old["names"] = [i["name"] for i in ids]
    del old["weights"], old["items"]  # saved before weights and windows: taken
    again = mix.stream(100, **opts)
    again.load_state_dict(old)
    rest = torch.cat([x["index"] for x in again]).numpy()
    assert sorted(np.r_[seen.numpy(), rest].tolist()) == list(range(len(mix)))
    other = MultiGameDataset([b, a]).stream(100, **opts)
    spoiled = {**mix.stream(100, **opts).state_dict(), "weights": ["x", None]}
    for stream, wrong in (
        (other, old),
        (other, {"version": 3, "stores": [state]}),
        (mix.stream(100, **opts), spoiled),
    ):
        with pytest.raises(InvalidArgumentError, match="does not belong") as err:
            stream.load_state_dict(wrong)
        assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def shard_stores(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """48 stores of one whole 4096-frame shard each (copies of one)."""
    root = tmp_path_factory.mktemp("shards")
    first = write_store(str(root / "s0.zarr"), 4096, final=False)
    urls = [first]
    for g in range(1, 48):
        urls.append(shutil.copytree(first, root / f"s{g}.zarr"))
    return [str(u) for u in urls]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_stream_of_48_stores_holds_the_memory_of_one(shard_stores: list[str]) -> None:
    """Resident memory while streaming 48 one-shard stores grows by one stream's bound,
    not by a shard per store (which would be 48 x 29 MB)."""
    options = {"shuffle_buffer": 4096, "units_ahead": 1}
    mix = MultiGameDataset(shard_stores)
    rows, growth = epoch_rss_growth(mix, options)
    assert rows == len(mix) == 48 * 4096
    bound = stream_memory_bound(1, **options)
    # batches alive in the loop, thread stacks, the per-step columns, allocator slack,
    # and each store's memory-mapped shard (its compressed bytes, a few MB in all)
    allowance = 64 << 20
    assert growth <= bound + allowance, (growth, bound)
    assert 48 * 4096 * 84 * 84 > 4 * (bound + allowance)


def test_weights_by_game_and_uniform_over_games(tmp_path: Path) -> None:
    pong = [write_store(str(tmp_path / f"p{i}.zarr"), 400 * (i + 1), seed=i) for i in range(2)]
    other = tmp_path / "q.zarr"
    write_store(str(other), 100, seed=5, game="Qbert", max_len=30)
    mix = MultiGameDataset([*pong, str(other)], weights={"Pong": 1.0, "Qbert": 3.0})
    assert mix.game_names == ["Pong", "Qbert"]
    np.testing.assert_allclose(mix.weights, [0.25 / 3, 0.5 / 3, 0.75])
    ids = mix.sample(4000, generator=torch.Generator().manual_seed(0))["game_id"]
    assert abs((ids == 1).float().mean().item() - 0.75) < 0.03
    even = MultiGameDataset([*pong, str(other)], weights="games")
    np.testing.assert_allclose(even.weights, [1 / 6, 2 / 6, 0.5])
    by_rows = MultiGameDataset([*pong, str(other)], weights="transitions")
    np.testing.assert_allclose(by_rows.weights, np.diff(by_rows.offsets) / len(by_rows))
    # windows count each store's windows
    windows = even.windows(3)
    lengths = np.diff(windows.offsets)
    np.testing.assert_allclose(windows.weights[:2], 0.5 * lengths[:2] / lengths[:2].sum())


def test_huge_and_tiny_weights_are_weights_like_any_other(tmp_path: Path) -> None:
    """weights=[1e308, 1e308] passed the checks, then their sum overflowed: a numpy
    warning and a raw torch ``invalid multinomial distribution`` on sample. Weights
    are relative: any finite ones 0 or more weigh as their ratios say."""
    import warnings

    urls = [write_store(str(tmp_path / f"s{i}.zarr"), 50, seed=i, max_len=9) for i in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        for weights, want in [
            ([1e308, 1e308], [0.5, 0.5]),
            ([1.5e308, 0.5e308], [0.75, 0.25]),
            ([5e-324, 5e-324], [0.5, 0.5]),  # the smallest double: no division by 0
        ]:
            mix = MultiGameDataset(urls, weights=weights)
            np.testing.assert_allclose(mix.weights, want)
            drawn = mix.sample(2000, generator=torch.Generator().manual_seed(0))["index"]
            share = (drawn.numpy() >= mix.offsets[1]).mean()
            assert abs(share - want[1]) < 0.05
            stream = mix.stream(20, seed=0)
            assert sorted(torch.cat([b["index"] for b in stream]).tolist()) == list(range(100))


def test_weights_as_arrays_tensors_and_numbers_no_double_holds(tmp_path: Path) -> None:
    """``weights=[10**400, 1]`` was a raw ``OverflowError``, a 0-d array a raw
    ``TypeError``, a numpy bool array was read as 1 and 0, a 2-d array's message
    spanned lines, and a torch tensor was refused where a numpy array is taken. A 1-d
    array or tensor is a list of weights; everything else is one line."""
    urls = [write_store(str(tmp_path / f"s{i}.zarr"), 30, seed=i, max_len=9) for i in range(2)]
    for weights in (np.array([1.0, 3.0]), torch.tensor([1.0, 3.0]), torch.tensor([1, 3])):
        np.testing.assert_allclose(MultiGameDataset(urls, weights=weights).weights, [0.25, 0.75])
    for bad, match in [
        ([10**400, 1], "must be a number 0 or more; got 1000"),
        (np.array([True, False]), "must be a number 0 or more; got True"),
        (torch.tensor([True, False]), "must be a number 0 or more; got True"),
        (np.array(5.0), "is not a way of weighting"),
        (np.array([[1.0], [2.0]]), "is not a way of weighting"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match) as err:
            MultiGameDataset(urls, weights=bad)
        assert "\n" not in str(err.value)
    with pytest.raises(
        InvalidArgumentError, match=r"weight of .Qbert. .* a number 0 or more"
    ) as err:
        store_weights(
            {"Pong": 1, "Qbert": 10**400},
            ["Pong/1", "Qbert/1"],
            ["Pong", "Qbert"],
            [10, 5],
            "a mixture",
        )
    assert "\n" not in str(err.value)


def test_store_weights_refuse_what_names_no_game() -> None:
    stores, games, lengths = ["Pong/1", "Qbert/1"], ["Pong", "Qbert"], [10, 5]
    for bad, match in [
        ({"Pong": 1.0}, r"missing \['Qbert'\]"),
        ({"Pong": 1.0, "Qbert": 1.0, "Seaquest": 2.0}, r"\['Seaquest'\] are not among them"),
        ({"Pong/1": 1.0}, r"missing \['Qbert/1'\]"),
        ({"Pong": "a lot", "Qbert": 1.0}, "must be a number"),
        ("uniform", "not a way of weighting"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match) as err:
            store_weights(bad, stores, games, lengths, "a mixture")
        assert "\n" not in str(err.value)
    assert store_weights({"Pong/1": 2, "Qbert/1": 1}, stores, games, lengths, "m") == [2.0, 1.0]


def test_game_ids_come_from_the_sorted_names_whatever_the_order() -> None:
    names, ids = game_numbers(["Seaquest", "Breakout", "Pong", "Breakout"])
    assert names == ["Breakout", "Pong", "Seaquest"] and ids.tolist() == [2, 0, 1, 0]
    again = game_numbers(["Pong", "Breakout", "Seaquest"])
    assert again[0] == names and again[1].tolist() == [1, 0, 2]


@pytest.mark.parametrize("budget", ["20%", 64 << 20], ids=["share", "bytes"])
def test_the_stores_of_a_mixture_share_one_memory_budget(tmp_path: Path, budget) -> None:
    """Decoded frames and kept encoded bytes: the dataset's bound, divided among its
    stores, not paid once per store, whether it is a share of memory or bytes."""
    from atari_zarr import ReadOptions

    urls = [write_store(str(tmp_path / f"s{g}.zarr"), 50, seed=g) for g in range(4)]
    options = ReadOptions(frame_cache_bytes=budget, kept_bytes=64 << 20)
    mix = MultiGameDataset(urls, options=options)
    one = AtariZarrDataset(urls[0], options=options)
    for store in [m.store for m in mix.members]:
        assert store.options.kept_bytes * 4 == options.kept_bytes
        assert store.options.frame_cache_limit() * 4 == pytest.approx(
            one._store.options.frame_cache_limit(), rel=1e-6
        )


def test_random_batches_of_240_stores_go_through_one_cache(many: MultiGameDataset) -> None:
    """One decoded-frame cache for the whole mixture, bounded by the dataset's budget:
    a batch read twice decodes once, and the frames are each store's own."""
    readers = [s.frames for s in [m.store for m in many.members]]
    cache = readers[0]._cache
    assert cache is not None and all(r._cache is cache for r in readers)
    assert cache.n_slots * cache.chunk_nbytes == pytest.approx(
        sum(r.cache_bytes for r in readers), abs=cache.chunk_nbytes
    )
    idx = np.random.default_rng(4).choice(len(many), 96, replace=False)
    first = many[idx]
    decoded = sum(r.stats["decoded"] for r in readers)
    again = many[idx]
    assert sum(r.stats["decoded"] for r in readers) == decoded  # every chunk a hit
    for b in (first, again):
        store = np.searchsorted(many.offsets, idx, side="right") - 1
        row = idx - many.offsets[store]
        np.testing.assert_array_equal(b["observation"].numpy(), frame_of(store * NAME + row))


def test_a_mixture_caches_frames_where_each_stores_share_is_under_a_chunk(
    tmp_path: Path,
) -> None:
    """The budget is the dataset's, not one per store: 40 stores sharing 40 chunks'
    bytes keep a batch's chunks (alone, each store's share would hold none)."""
    from atari_zarr import ReadOptions
    from atari_zarr.resources import process_memory

    urls = [
        write_store(str(tmp_path / f"s{g}.zarr"), 40, seed=g, max_len=9, name=g * NAME)
        for g in range(40)
    ]
    chunk = 16 * 84 * 84
    share = f"{100 * 40.5 * chunk / process_memory()!r}%"  # of memory: divided among stores
    mix = MultiGameDataset(urls, options=ReadOptions(frame_cache_bytes=share))
    readers = [s.frames for s in [m.store for m in mix.members]]
    assert all(r.cache_bytes < 2 * chunk for r in readers)
    idx = np.arange(0, len(mix), 41)[:15]
    mix[idx]
    decoded = sum(r.stats["decoded"] for r in readers)
    b = mix[idx]
    assert sum(r.stats["decoded"] for r in readers) == decoded
    store = np.searchsorted(mix.offsets, idx, side="right") - 1
    np.testing.assert_array_equal(
        b["observation"].numpy(), frame_of(store * NAME + idx - mix.offsets[store])
    )


def test_a_remote_mixture_keeps_encoded_bytes_in_one_cache(tmp_path: Path) -> None:
    """The stores of a mixture in a bucket keep what requests brought in one cache
    bounded by the dataset's ``kept_bytes``; each store's bytes are its own."""
    from atari_zarr import ReadOptions
    from tests.read.test_prefetch import _memory_copy

    local = [
        write_store(str(tmp_path / f"s{g}.zarr"), 40, seed=g, max_len=9, name=g * NAME)
        for g in range(3)
    ]
    urls = [_memory_copy(u, f"kept-mix-{g}") for g, u in enumerate(local)]
    mix = MultiGameDataset(urls, options=ReadOptions(kept_bytes=3 << 20))
    kept = [s.engine.kept for s in [m.store for m in mix.members]]
    shared = kept[0].kept
    assert all(k.kept is shared for k in kept) and shared.max_bytes == 3 << 20
    idx = np.arange(len(mix))
    b = mix[idx]
    assert 0 < shared.nbytes <= shared.max_bytes
    store = np.searchsorted(mix.offsets, idx, side="right") - 1
    np.testing.assert_array_equal(
        b["observation"].numpy(), frame_of(store * NAME + idx - mix.offsets[store])
    )


_LOW_NOFILE = """
import json, os, resource, sys
import numpy as np, torch
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
torch.set_num_threads(1)
from atari_zarr import MultiGameDataset
from tests.read.test_mixture import check_batches

urls = json.loads(sys.argv[1])
mix = MultiGameDataset(urls)
peak = 0
generator = torch.Generator().manual_seed(0)
for _ in range(20):  # random batches over every store: each touches about 200 of them
    batch = mix.sample(256, generator=generator)
    assert len(np.unique(batch["game_id"].numpy())) >= 1 and len(batch) == 256
    peak = max(peak, len(os.listdir("/proc/self/fd")))
batches = []
for batch in mix.stream(128, seed=0):
    batches.append(batch)
    peak = max(peak, len(os.listdir("/proc/self/fd")))
check_batches(mix, batches, 1)
print(json.dumps({"peak_fds": peak, "files": sum(len(fs) for u in urls for _, _, fs in os.walk(u))}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs Linux /proc")
def test_240_stores_read_under_a_low_limit_of_open_files(many_urls: list[str]) -> None:
    """``ulimit -n 256`` and some 2,000 shard files: random batches and an epoch of the
    stream read every store (memory maps hold a descriptor each on Python 3.11: they
    died of "Too many open files" after a few batches)."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _LOW_NOFILE, json.dumps(many_urls)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["files"] > 256 * 4 and got["peak_fds"] < 256


def test_two_threads_reading_a_fresh_mixture_get_their_own_stores_rows(
    many_urls: list[str],
) -> None:
    """Two threads draw random batches from a mixture none of whose stores is open yet:
    the stores open, join the shared chunk tables and move their actions and rewards
    onto the step axis while the other thread reads. Every item's frames, next frames
    and action are its own store's row's."""
    from concurrent.futures import ThreadPoolExecutor

    mix = MultiGameDataset(many_urls)

    def read(seed: int) -> list[tuple[np.ndarray, dict]]:
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(12):
            idx = rng.choice(len(mix), 64, replace=False)
            out.append((idx, mix[idx]))
        return out

    with ThreadPoolExecutor(2) as pool:
        done = [f.result() for f in [pool.submit(read, s) for s in (1, 2)]]
    tables = mix.members[0].store.frames.engine.rows()[0]
    assert all(m.store.frames.engine.rows()[0] is tables for m in mix.members if m.store.opened)
    for idx, b in (pair for batches in done for pair in batches):
        store = np.searchsorted(mix.offsets, idx, side="right") - 1
        row = idx - mix.offsets[store]
        np.testing.assert_array_equal(b["observation"].numpy(), frame_of(store * NAME + row))
        own = [
            int(mix.members[g].store.action[np.array([r])][0])
            for g, r in zip(store, row, strict=True)
        ]
        assert b["action"].tolist() == own


def test_a_mixture_asks_each_store_for_its_frame_reader_once(many_urls: list[str]) -> None:
    """Over 20 random batches a mixture asks each store it touches for its frame
    reader once: what a batch needs of it (its cache token, where its chunks lie) is
    kept, and every item's frames are still its own store's row's."""
    mix = MultiGameDataset(many_urls)
    frames = mix._frame_readers
    asked: list[int] = []
    reader_of = frames.reader_of

    def counted(g: int):  # type: ignore[no-untyped-def]
        asked.append(g)
        return reader_of(g)

    frames.reader_of = counted
    gen = torch.Generator().manual_seed(3)
    touched: set[int] = set()
    for _ in range(20):
        b = mix.sample(64, generator=gen)
        store = np.searchsorted(mix.offsets, b["index"].numpy(), side="right") - 1
        touched |= set(store.tolist())
        np.testing.assert_array_equal(
            b["observation"].numpy(), frame_of(store * NAME + b["row"].numpy())
        )
    assert sorted(asked) == sorted(touched) and len(touched) > 100
