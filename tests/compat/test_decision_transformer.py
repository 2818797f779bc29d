"""The Decision Transformer drop-in: kzl's items, its selection, a model that learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from atari_zarr_testkit.expect import expected_stacks
from torch import nn

from atari_zarr.compat.decision_transformer import StateActionReturnDataset, create_dataset
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.store import StoreReader

K = 5


def reference_items(obss, actions, rtgs, done_idxs, timesteps, k, idx):
    """kzl's StateActionReturnDataset.__getitem__, described in our own words.

    The window ends at the first trajectory end after ``idx`` or at ``idx + k`` and
    holds ``k`` steps; states are the 4-frame stacks divided by 255 and flattened.
    """
    done_idx = idx + k
    for i in done_idxs:
        if i > idx:
            done_idx = min(int(i), done_idx)
            break
    idx = done_idx - k
    states = torch.tensor(np.array(obss[idx:done_idx]), dtype=torch.float32).reshape(k, -1) / 255.0
    return (
        states,
        torch.tensor(actions[idx:done_idx], dtype=torch.long).unsqueeze(1),
        torch.tensor(rtgs[idx:done_idx], dtype=torch.float32).unsqueeze(1),
        torch.tensor(timesteps[idx : idx + 1], dtype=torch.int64).unsqueeze(1),
    )


def test_items_are_kzls_on_the_same_arrays(pong_store, pong_truth):
    data = create_dataset(4, 150, trajectories_per_buffer=2, store=pong_store.url, seed=1)
    ds = StateActionReturnDataset(data, 3 * K)
    truth = pong_truth
    rows = data.rows
    done = truth.terminated | truth.truncated
    obss = list(expected_stacks(truth.observation, truth.episode, done, rows, 4)[0])
    actions = truth.action[rows]
    # kzl's returns-to-go: per trajectory, the sum of the rewards from each step on
    rewards = truth.reward[rows].astype(np.float64)
    rtgs = np.zeros(len(rows))
    start = 0
    for end in data.done_idxs.tolist():
        rtgs[start:end] = np.cumsum(rewards[start:end][::-1])[::-1]
        start = end
    # kzl's timesteps, quirk included: only the first trajectory's are right there
    quirky = np.zeros(len(rows) + 1, dtype=int)
    start = 0
    for i in data.done_idxs.tolist():
        quirky[start : i + 1] = np.arange(i + 1 - start)
        start = i + 1
    assert len(ds) == len(rows) - K
    first_end = int(data.done_idxs[0])
    crossing = 0
    for idx in range(len(ds)):
        end = min(int(data.done_idxs[np.searchsorted(data.done_idxs, idx, "right")]), idx + K)
        if end - K < 0:
            continue  # kzl slices from a negative index there (see the module docstring)
        crossing += int(
            np.searchsorted(data.done_idxs, end - K, "right")
            < np.searchsorted(data.done_idxs, end - 1, "right")
        )
        got = ds[idx]
        want = reference_items(obss, actions, rtgs, data.done_idxs, quirky, K, idx)
        for g, w, name in zip(got, want, ("states", "actions", "rtgs", "timesteps"), strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            if name == "timesteps" and idx + K > first_end:
                continue  # kzl's off-by-one after the first trajectory (see the module)
            torch.testing.assert_close(g, w, rtol=0, atol=1e-6, msg=name)
    assert crossing > 0  # short trajectories: windows run into the previous one, as kzl's
    # the timesteps given are the step within the episode
    assert (
        data.timesteps
        == rows - np.repeat(rows[np.r_[0, data.done_idxs[:-1]]], np.diff(np.r_[0, data.done_idxs]))
    ).all()


def test_selection_is_whole_trajectories_of_the_last_buffers(pong_store):
    data = create_dataset(3, 80, trajectories_per_buffer=2, store=pong_store.url, seed=0)
    store = StoreReader(pong_store.url)
    starts = set(store.episodes.starts.tolist())
    assert set(data.pieces.start.tolist()) <= starts and data.pieces.terminated.all()
    assert len(data) >= 80 or len(data.pieces) > 0
    again = create_dataset(3, 80, trajectories_per_buffer=2, store=pong_store.url, seed=0)
    assert again.rows.tolist() == data.rows.tolist()
    with pytest.raises(InvalidArgumentError, match="num_buffers 60 is larger than the"):
        create_dataset(60, 80, trajectories_per_buffer=2, store=pong_store.url)


def test_uint8_states_and_batches(pong_store):
    data = create_dataset(4, 100, trajectories_per_buffer=2, store=pong_store.url)
    floats = StateActionReturnDataset(data, 3 * K)
    raw = StateActionReturnDataset(data, 3 * K, uint8=True)
    s8 = raw[3][0]
    assert s8.dtype == torch.uint8 and s8.shape == (K, 4, 84, 84)
    torch.testing.assert_close(s8.reshape(K, -1).float() / 255, floats[3][0])
    loader = torch.utils.data.DataLoader(floats, batch_size=8, shuffle=True)
    states, _actions, _rtgs, timesteps = next(iter(loader))
    assert states.shape == (8, K, 4 * 84 * 84) and timesteps.shape == (8, 1, 1)
    assert floats.vocab_size == int(data.actions.max()) + 1
    with pytest.raises(IndexError):
        floats[len(floats)]


class TinyDT(nn.Module):
    """A minGPT-style Decision Transformer, as small as a test allows."""

    def __init__(self, vocab: int, k: int, max_timestep: int, width: int = 32) -> None:
        super().__init__()
        self.encode = nn.Sequential(
            nn.Conv2d(4, 8, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(8, 8, 4, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 9 * 9, width),
        )
        self.rtg = nn.Linear(1, width)
        self.action = nn.Embedding(vocab, width)
        self.time = nn.Embedding(max_timestep + k + 1, width)
        layer = nn.TransformerEncoderLayer(width, 2, 64, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(width, vocab)
        self.k = k

    def forward(self, states, actions, rtgs, timesteps):
        b, k = actions.shape[:2]
        s = self.encode(states.reshape(b * k, 4, 84, 84)).reshape(b, k, -1)
        t = self.time(timesteps[:, 0, 0, None] + torch.arange(k))
        tokens = torch.stack(
            [self.rtg(rtgs) + t, s + t, self.action(actions[..., 0]) + t], dim=2
        ).reshape(b, 3 * k, -1)
        mask = nn.Transformer.generate_square_subsequent_mask(3 * k)
        out = self.body(tokens, mask=mask, is_causal=True)
        return self.head(out[:, 1::3])  # the action, predicted from each state token


@pytest.mark.slow
def test_a_small_decision_transformer_learns(pong_store):
    torch.manual_seed(0)
    data = create_dataset(6, 400, trajectories_per_buffer=3, store=pong_store.url, seed=0)
    ds = StateActionReturnDataset(data, 3 * K)
    model = TinyDT(ds.vocab_size, K, data.max_timestep)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    losses = []
    while len(losses) < 300:
        for states, actions, rtgs, timesteps in loader:
            logits = model(states, actions, rtgs, timesteps)
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, ds.vocab_size), actions.reshape(-1)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == 300:
                break
    first, last = np.mean(losses[:30]), np.mean(losses[-30:])
    assert np.isfinite(losses).all() and last < 0.7 * first, (first, last)


def _same_data(a, b):
    for name in ("actions", "rtgs", "timesteps", "done_idxs", "returns"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(
        a.store.read_frames(a.rows), b.store.read_frames(b.rows), err_msg="frames"
    )


@pytest.mark.slow
def test_the_original_call_fetches_only_the_last_buffers(public_copy, tmp_path):
    """``create_dataset(num_buffers, num_steps, game, data_dir_prefix, trajectories)``,
    the original's call: no store there, so the run is fetched from RL Unplugged's
    public copy, only its last ``num_buffers`` shards; the selection equals the one
    made from the whole run converted here."""
    from atari_zarr import convert

    fixture = public_copy.runs["Breakout/1"]
    data = create_dataset(2, 300, "Breakout", str(tmp_path / "dqn_replay") + "/", 2)
    fetched = {p for m, p, _, n in public_copy.proxy.log if m == "GET" and "run_1-000" in p and n}
    assert fetched and all("00048-of" in p or "00049-of" in p for p in fetched), fetched
    assert "subsets/dt-2-300-2-seed123/Breakout/1.zarr" in data.store.where
    [whole] = convert(fixture.game_dir, str(tmp_path / "whole"), progress=False)
    _same_data(data, create_dataset(2, 300, trajectories_per_buffer=2, store=whole.url))
    # the second call reads the cache; download=False finds it too
    public_copy.proxy.reset()
    again = create_dataset(2, 300, "Breakout", None, 2, download=False)
    assert public_copy.proxy.requests == 0
    _same_data(data, again)


def test_dqn_replay_files_under_data_dir_prefix_are_converted_beside_them(
    pong_run, source_root, pong_store
):
    """The original reads ``{data_dir_prefix}{game}/1/replay_logs``: those files are
    converted once into ``{data_dir_prefix}{game}/1.zarr``, and read from there."""
    prefix = str(source_root) + "/"
    data = create_dataset(4, 150, "Pong", prefix, 2, seed=1, download=False)
    assert data.store.where == str(source_root / "Pong" / "1.zarr")
    _same_data(
        data, create_dataset(4, 150, trajectories_per_buffer=2, store=pong_store.url, seed=1)
    )
    again = create_dataset(4, 150, "Pong", prefix, 2, seed=1, download=False)
    _same_data(data, again)


def test_a_store_of_another_subset_is_refused(pong_run, source_root, tmp_path):
    from atari_zarr import convert

    [sub] = convert(str(source_root), str(tmp_path), fraction=0.5, progress=False)
    with pytest.raises(InvalidArgumentError, match=r"holds a subset \(fraction 0.5") as info:
        create_dataset(4, 150, trajectories_per_buffer=2, store=sub.url)
    assert "\n" not in str(info.value)
    with pytest.raises(InvalidArgumentError, match="needs the game"):
        create_dataset(4, 150)


def kzl_rtg(stepwise_returns, done_idxs):
    """kzl/decision-transformer's returns-to-go loop (``create_dataset.py``), in our words:
    for the steps ``j`` of the trajectory ending before ``i``, the sum of
    ``stepwise_returns[j:i+1]``; then it goes on at ``i + 1``."""
    rtg = np.zeros_like(stepwise_returns)
    start = 0
    for i in done_idxs:
        i = int(i)
        for j in range(i - 1, start - 1, -1):
            rtg[j] = stepwise_returns[j : i + 1].sum()
        start = i + 1
    return rtg


def test_returns_to_go_differ_from_the_originals_exactly_as_documented(pong_store):
    """The docstring's claim, checked: each trajectory's original returns-to-go add the
    next trajectory's first reward, and every trajectory after the first keeps 0 at its
    first step; elsewhere they are ours."""
    data = create_dataset(6, 400, trajectories_per_buffer=3, store=pong_store.url, seed=0)
    rewards = data.store.read_steps(data.rows)["reward"].astype(np.float64)
    theirs = kzl_rtg(rewards, data.done_idxs)
    ours = data.rtgs.astype(np.float64)
    starts = np.r_[0, data.done_idxs[:-1]]
    for k, (a, b) in enumerate(zip(starts, data.done_idxs, strict=True)):
        nxt = rewards[b] if b < len(rewards) else 0.0
        expected = ours[a:b] + nxt
        if k > 0:
            expected[0] = 0.0
        np.testing.assert_allclose(theirs[a:b], expected, err_msg=f"trajectory {k}")
    # the difference is there to see: trajectories whose first step's return-to-go is not 0
    assert (ours[starts[1:]] != 0).any() and (theirs[starts[1:]] == 0).all()


def test_a_float_index_is_refused_not_rounded(pong_store):
    ds = StateActionReturnDataset(
        create_dataset(4, 150, trajectories_per_buffer=2, store=pong_store.url, seed=1), 3 * K
    )
    with pytest.raises(TypeError, match="indices must be integers"):
        ds[1.5]
    with pytest.raises(IndexError, match=rf"with {len(ds)} items"):
        ds[len(ds)]


@pytest.mark.parametrize("block_size", [2, 7.5, True, "15"])
def test_a_block_size_that_holds_no_context_is_one_line(pong_store, block_size):
    data = create_dataset(4, 150, trajectories_per_buffer=2, store=pong_store.url, seed=1)
    with pytest.raises(InvalidArgumentError, match="block_size must be an integer of at least 3"):
        StateActionReturnDataset(data, block_size)
