"""MultiGameDataset and complete_stores: several stores as one dataset, without TorchRL."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from atari_zarr_testkit import write_fixture_run

from atari_zarr import convert
from atari_zarr.catalog import complete_stores
from atari_zarr.errors import InvalidArgumentError, StoreFormatError
from atari_zarr.read.dataset import collate_batch
from atari_zarr.read.mixing import MixtureSampler, MultiGameDataset, store_probabilities


@pytest.fixture
def two_games(source_root, dest_root):
    runs = {
        "Pong/1": write_fixture_run(str(source_root), "Pong", "1", capacity=64, steps=300, seed=1),
        "Breakout/2": write_fixture_run(
            str(source_root), "Breakout", "2", capacity=64, steps=150, seed=2
        ),
    }
    convert(str(source_root), str(dest_root), progress=False)
    return str(dest_root), {name: run.truth() for name, run in runs.items()}


def test_complete_stores(two_games, tmp_path):
    root, _ = two_games
    assert complete_stores(root) == ["Breakout/2", "Pong/1"]
    with pytest.raises(FileNotFoundError, match="atari-zarr convert"):
        complete_stores(str(tmp_path / "nowhere"))


def test_items_carry_game_id_and_the_right_data(two_games):
    root, truths = two_games
    mix = MultiGameDataset.from_root(root, ["Pong/1", "Breakout/2"])
    n_pong = len(truths["Pong/1"])
    assert len(mix) == n_pong + len(truths["Breakout/2"])
    idx = np.array([n_pong + 3, 0, n_pong, 5, n_pong + 3])
    b = mix[idx]
    # game_id: the game's place among the sorted game names, whatever the stores' order
    assert mix.game_names == ["Breakout", "Pong"]
    assert b["game_id"].tolist() == [0, 1, 0, 1, 0]
    assert b["index"].tolist() == idx.tolist()
    assert b["row"].tolist() == [3, 0, 0, 5, 3]
    store_of = {mix.game_names.index(n.split("/")[0]): n for n in mix.games}
    for i, (g, r) in enumerate(zip(b["game_id"].tolist(), b["row"].tolist(), strict=True)):
        truth = truths[store_of[g]]
        np.testing.assert_array_equal(b["observation"][i].numpy(), truth.observation[r])
        assert b["action"][i].item() == truth.action[r]
    one = mix[n_pong]
    assert one.batch_size == torch.Size([]) and one["game_id"].item() == 0
    other = MultiGameDataset.from_root(root, ["Breakout/2", "Pong/1"])
    assert other[0]["game_id"].item() == 0 and other[len(other) - 1]["game_id"].item() == 1


def test_weights_decide_the_mix_whatever_the_sizes(two_games):
    root, _ = two_games
    mix = MultiGameDataset.from_root(root, ["Pong/1", "Breakout/2"], weights=[1, 3])
    b = mix.sample(4000, generator=torch.Generator().manual_seed(0))
    breakout = mix.game_names.index("Breakout")
    share = (b["game_id"] == breakout).float().mean().item()
    assert 0.70 < share < 0.80  # 3/4 from Breakout although it is the smaller store
    loader = torch.utils.data.DataLoader(
        mix,
        batch_size=500,
        sampler=mix.sampler(2000, generator=torch.Generator().manual_seed(1)),
        collate_fn=collate_batch,
    )
    ids = torch.cat([batch["game_id"] for batch in loader])
    assert len(ids) == 2000 and 0.70 < (ids == breakout).float().mean().item() < 0.80
    # default: proportional to length (uniform over transitions)
    even = MultiGameDataset.from_root(root)
    lengths = np.diff(even.offsets)
    np.testing.assert_allclose(even.weights, lengths / lengths.sum())


def test_zero_weight_store_is_never_drawn(two_games):
    root, _ = two_games
    mix = MultiGameDataset.from_root(root, ["Pong/1", "Breakout/2"], weights=[0, 1])
    got = mix.sample(200, generator=torch.Generator().manual_seed(0))["game_id"]
    assert (got == mix.game_names.index("Breakout")).all()


def test_frame_stack_and_pickle(two_games):
    root, truths = two_games
    mix = MultiGameDataset.from_root(root, frame_stack=4)
    mix2 = pickle.loads(pickle.dumps(mix))
    b = mix2[[0, len(mix2) - 1]]
    assert b["observation"].shape == (2, 4, 84, 84)
    last = truths[mix2.games[1]]
    np.testing.assert_array_equal(b["observation"][1, -1].numpy(), last.observation[-1])


def test_bad_arguments(two_games):
    root, _ = two_games
    with pytest.raises(StoreFormatError, match=r"holds no store for \['Qbert/1'\]"):
        MultiGameDataset.from_root(root, ["Qbert/1"])
    with pytest.raises(InvalidArgumentError, match="one per store"):
        MultiGameDataset.from_root(root, weights=[1.0])
    with pytest.raises(InvalidArgumentError, match="no store can be drawn"):
        MultiGameDataset.from_root(root, weights=[0, 0])
    with pytest.raises(InvalidArgumentError, match="at least one store"):
        MultiGameDataset([])
    with pytest.raises(IndexError, match="out of range"):
        MultiGameDataset.from_root(root)[10_000]


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers(two_games, context):
    root, truths = two_games
    mix = MultiGameDataset.from_root(root)
    loader = torch.utils.data.DataLoader(
        mix,
        batch_size=64,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=collate_batch,
        generator=torch.Generator().manual_seed(0),
    )
    count = 0
    for batch in loader:
        for name in mix.games:
            sel = batch["game_id"] == mix.game_names.index(name.split("/")[0])
            rows = batch["row"][sel].numpy()
            np.testing.assert_array_equal(
                batch["observation"][sel].numpy(), truths[name].observation[rows]
            )
        count += batch.batch_size[0]
    assert count == len(mix)


# -- the two-stage sampler (a store by weight, then a uniform row) ------------------------

# chi-square critical values at p = 0.001: a correct sampler fails these with
# probability 1/1000 for a random seed, and never for the fixed seeds below
_CHI2_999 = {3: 16.27, 9: 27.88}


def _chi2(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def test_sampler_memory_does_not_grow_with_transitions():
    """60 stores of 50M transitions (3e9 in all) or of 1e11: the same few kilobytes.

    One float64 weight per transition (the old WeightedRandomSampler) would hold
    24 GB for the first and 800 GB for the second.
    """
    import tracemalloc

    peaks = []
    for per_store in (1000, 50_000_000, 10**11):
        lengths = [per_store] * 60
        tracemalloc.start()
        try:
            sampler = MixtureSampler(
                lengths, None, 5000, generator=torch.Generator().manual_seed(0)
            )
            drawn = np.fromiter(sampler, dtype=np.int64, count=len(sampler))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(drawn) == 5000 and 0 <= drawn.min() and drawn.max() < 60 * per_store
        peaks.append(peak)
    assert max(peaks) < 1 << 20, peaks  # the 5000 indices themselves, not the transitions
    assert peaks[-1] < 2 * peaks[0] + (64 << 10), peaks


def test_sampler_draws_stores_by_weight_and_rows_uniformly():
    lengths = np.array([10**11, 3, 7 * 10**9, 12_345], dtype=np.int64)
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = 40_000
    gen = torch.Generator().manual_seed(0)
    idx = np.array(list(MixtureSampler(lengths, weights, n, generator=gen)))
    assert len(idx) == n and idx.min() >= 0 and idx.max() < offsets[-1]
    store = np.searchsorted(offsets, idx, side="right") - 1
    counts = np.bincount(store, minlength=4)
    assert _chi2(counts, n * weights) < _CHI2_999[3], counts
    # rows of the 1e11-transition store fall evenly into 10 bins
    rows = idx[store == 0]
    bins = np.bincount(rows * 10 // lengths[0], minlength=10)
    assert _chi2(bins, np.full(10, len(rows) / 10)) < _CHI2_999[9], bins
    # every row of the 3-transition store is drawn, and nothing beyond it
    assert set((idx[store == 1] - offsets[1]).tolist()) == {0, 1, 2}


def test_sampler_is_reproducible_and_sized():
    def draw(seed: int, n: int = 300) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return list(MixtureSampler([50, 0, 70], [1, 1, 2], n, generator=gen))

    assert draw(1) == draw(1) != draw(2)
    assert len(MixtureSampler([5], None, 12)) == 12 == len(list(MixtureSampler([5], None, 12)))
    big = MixtureSampler([10], None, MixtureSampler.block * 2 + 3)
    assert len(list(big)) == MixtureSampler.block * 2 + 3  # drawn in blocks
    with pytest.raises(InvalidArgumentError, match="one per store"):
        MixtureSampler([5, 5], [1], 10)
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        MixtureSampler([5], None, -1)
    with pytest.raises(InvalidArgumentError, match="no store can be drawn"):
        MixtureSampler([0, 5], [1, 0], 10)
    np.testing.assert_allclose(store_probabilities([10, 0, 30], [1, 5, 1]), [0.5, 0, 0.5])


def test_dataset_sampler_and_sample_are_the_same_draw(two_games):
    root, _ = two_games
    mix = MultiGameDataset.from_root(root, ["Pong/1", "Breakout/2"], weights=[1, 3])
    sampler = mix.sampler(500, generator=torch.Generator().manual_seed(7))
    assert isinstance(sampler, MixtureSampler)
    np.testing.assert_array_equal(sampler.offsets, mix.offsets)
    batch = mix.sample(500, generator=torch.Generator().manual_seed(7))
    assert list(sampler) == batch["index"].tolist()
    assert mix.sample(0)["index"].shape == (0,)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ({"transitions": 100}, "holds 300 transitions of Pong, but the 100 of Pong"),
        ({"transitions": 4000}, "holds 300 transitions of Pong, but the 4,000 of Pong"),
        ({"transitions": 10**15}, "holds 300 transitions of Pong, but the 1,000,000,000,000,000"),
        ({"game": "Breakout"}, "holds 300 transitions of Pong, but the 300 of Breakout"),
    ],
)
def test_what_a_catalog_claims_is_checked_when_its_store_opens(two_games, edit, said):
    """A catalog's ``transitions`` or ``game`` edited by hand was trusted: 100 for a
    300-row store dropped 200 rows silently, 4000 blamed a healthy store or raised a raw
    IndexError, 10**15 a MemoryError, and Breakout labelled Pong's frames. The store's
    own attributes are compared with its entry when it opens, before any row is read."""
    import json
    from pathlib import Path

    from atari_zarr.catalog import write_catalog

    root, _ = two_games
    write_catalog(root)
    catalog = Path(root) / "catalog.json"
    doc = json.loads(catalog.read_text())
    [pong] = [e for e in doc["stores"] if e["path"] == "Pong/1.zarr"]
    pong.update(edit)
    catalog.write_text(json.dumps(doc))
    mix = MultiGameDataset.from_root(root)
    with pytest.raises(StoreFormatError) as info:
        for i in range(len(mix)):  # every item, until the Pong store opens
            mix[i]
    text = str(info.value)
    assert "\n" not in text and said in text and "atari-zarr index" in text, text


@pytest.mark.parametrize("spoil", ["negative", "duplicate"])
def test_a_catalog_with_impossible_entries_is_not_read(two_games, spoil):
    """A negative count raised a ValueError from ``__len__``, and a duplicated entry won
    silently: such a catalog is not what `index` writes, so the root is listed."""
    import json
    from pathlib import Path

    from atari_zarr.catalog import write_catalog

    root, _ = two_games
    write_catalog(root)
    catalog = Path(root) / "catalog.json"
    doc = json.loads(catalog.read_text())
    if spoil == "negative":
        doc["stores"][0]["transitions"] = -5
    else:
        doc["stores"].append(dict(doc["stores"][0]))
    catalog.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match="not a catalog this version reads"):
        mix = MultiGameDataset.from_root(root)
    assert len(mix) == 450 and sorted(mix.games) == ["Breakout/2", "Pong/1"]


def test_a_store_added_after_index_is_read_and_named(two_games, source_root):
    """A store converted after `atari-zarr index` was left out of ``from_root`` silently,
    and naming it advised `atari-zarr convert`: it is read from its own zarr.json, with a
    warning that says to run `atari-zarr index`."""
    from atari_zarr.catalog import write_catalog

    root, _ = two_games
    write_catalog(root)
    write_fixture_run(str(source_root), "Pong", "3", capacity=64, steps=120, seed=3)
    convert(str(source_root), root, games=["Pong"], runs=["3"], progress=False)
    for names in (None, ["Pong/3"]):
        with pytest.warns(UserWarning, match=r"does not list \['Pong/3'\].*atari-zarr index"):
            mix = MultiGameDataset.from_root(root, names)
        assert "Pong/3" in [f"{s.game}/{s.run}" for s in [m.store for m in mix.members]]


def test_from_root_refuses_what_is_not_a_root_and_names_that_are_not_a_list(two_games):
    """A game directory, a store or a file as the root said "needs at least one store",
    and ``names="Pong/1"`` spoke of run names: each is one line saying what to pass."""
    from pathlib import Path

    root, _ = two_games
    (Path(root) / "notes.txt").write_text("not a root")
    for where, said in (
        (f"{root}/Pong", "a game directory"),
        (f"{root}/Pong/1.zarr", "is a store, not a root"),
        (f"{root}/notes.txt", "is a file, not a root"),
    ):
        with pytest.raises(InvalidArgumentError, match=said) as info:
            MultiGameDataset.from_root(where)
        assert "\n" not in str(info.value) and "Pass" in str(info.value)
    with pytest.raises(InvalidArgumentError, match=r"Pass names=\['Pong/1'\] for one store"):
        MultiGameDataset.from_root(root, "Pong/1")


def _generator():
    yield 1.0
    yield 2.0


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        (
            {"Pong/1": 1, "Breakout/9": 1},
            r"\['Breakout/9'\] are not among them and missing \['Breakout/2'\]",
        ),
        (
            {"Pong": -1, "Breakout": 1},
            r"the weight of 'Pong' .* must be a number 0 or more; got -1",
        ),
        (["a", 1], r"the weight of store 0 \(Breakout/2\) .* got 'a'"),
        ([1, 2, 3], "must be one per store, 2 for"),
        (5, "weights=5 is not a way of weighting"),
        ({1.0, 2.0}, "a set has no order"),
        (_generator(), "a generator is read once"),
    ],
)
def test_weights_that_cannot_be_used_are_one_line_naming_them(two_games, weights, said):
    """Each failed raw or half-worked: a dict with one unknown store reported the
    missing games, negative game weights were reported as derived numbers, a string, a
    number, a set and a generator failed raw or were taken in an arbitrary order."""
    root, _ = two_games
    with pytest.raises(InvalidArgumentError, match=said) as info:
        MultiGameDataset.from_root(root, weights=weights)
    assert "\n" not in str(info.value)


def test_a_zero_weight_leaves_a_store_out_of_batches_not_out_of_a_stream(two_games):
    """The message said "0 leaves one out", which is false for stream(): an epoch reads
    every item once, the units of stores of weight 0 last."""
    root, _ = two_games
    mix = MultiGameDataset.from_root(root, weights={"Pong/1": 1, "Breakout/2": 0})
    batch = mix.sample(64, generator=torch.Generator().manual_seed(0))
    assert set(batch["game_id"].tolist()) == {mix.games.index("Pong/1")}
    seen = [int(g) for b in mix.stream(batch_size=50, seed=0) for g in b["game_id"]]
    breakout = mix.games.index("Breakout/2")
    assert seen.count(breakout) == 150 and len(seen) == 450
    with pytest.raises(InvalidArgumentError, match="a stream still reads every item of it"):
        MultiGameDataset.from_root(root, weights={"Pong/1": 1})
