"""MultiGameDataset and list_stores: several stores as one dataset, without TorchRL."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from atari_zarr import convert
from atari_zarr.errors import InvalidArgumentError, StoreFormatError
from atari_zarr.read.mixing import MultiGameDataset, list_stores
from atari_zarr.read.dataset import collate_batch
from atari_zarr.testing import write_fixture_run


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


def test_list_stores(two_games, tmp_path):
    root, _ = two_games
    assert list_stores(root) == ["Breakout/2", "Pong/1"]
    with pytest.raises(FileNotFoundError, match="atari-zarr convert"):
        list_stores(str(tmp_path / "nowhere"))


def test_items_carry_game_id_and_the_right_data(two_games):
    root, truths = two_games
    mix = MultiGameDataset.from_root(root, ["Pong/1", "Breakout/2"])
    n_pong = len(truths["Pong/1"])
    assert len(mix) == n_pong + len(truths["Breakout/2"])
    idx = np.array([n_pong + 3, 0, n_pong, 5, n_pong + 3])
    b = mix[idx]
    assert b["game_id"].tolist() == [1, 0, 1, 0, 1]
    assert b["index"].tolist() == idx.tolist()
    assert b["row"].tolist() == [3, 0, 0, 5, 3]
    for i, (g, r) in enumerate(zip(b["game_id"].tolist(), b["row"].tolist(), strict=True)):
        truth = truths[mix.games[g]]
        np.testing.assert_array_equal(b["observation"][i].numpy(), truth.observation[r])
        assert b["action"][i].item() == truth.action[r]
    one = mix[n_pong]
    assert one.batch_size == torch.Size([]) and one["game_id"].item() == 1


def test_weights_decide_the_mix_whatever_the_sizes(two_games):
    root, _ = two_games
    mix = MultiGameDataset.from_root(root, ["Pong/1", "Breakout/2"], weights=[1, 3])
    b = mix.sample(4000, generator=torch.Generator().manual_seed(0))
    share = b["game_id"].float().mean().item()
    assert 0.70 < share < 0.80  # 3/4 from Breakout although it is the smaller store
    w = mix.item_weights()
    assert torch.isclose(w.sum(), torch.tensor(1.0, dtype=w.dtype))
    loader = torch.utils.data.DataLoader(
        mix, batch_size=500, sampler=mix.sampler(2000, generator=torch.Generator().manual_seed(1)),
        collate_fn=collate_batch,
    )
    ids = torch.cat([batch["game_id"] for batch in loader])
    assert len(ids) == 2000 and 0.70 < ids.float().mean().item() < 0.80
    # default: proportional to length (uniform over transitions)
    even = MultiGameDataset.from_root(root)
    lengths = np.diff(even.offsets)
    np.testing.assert_allclose(even.weights, lengths / lengths.sum())


def test_zero_weight_store_is_never_drawn(two_games):
    root, _ = two_games
    mix = MultiGameDataset.from_root(root, ["Pong/1", "Breakout/2"], weights=[0, 1])
    assert (mix.sample(200, generator=torch.Generator().manual_seed(0))["game_id"] == 1).all()


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
        mix, batch_size=64, shuffle=True, num_workers=2, multiprocessing_context=context,
        collate_fn=collate_batch, generator=torch.Generator().manual_seed(0),
    )
    count = 0
    for batch in loader:
        for g, name in enumerate(mix.games):
            sel = batch["game_id"] == g
            rows = batch["row"][sel].numpy()
            np.testing.assert_array_equal(
                batch["observation"][sel].numpy(), truths[name].observation[rows]
            )
        count += batch.batch_size[0]
    assert count == len(mix)
