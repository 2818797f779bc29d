"""Windows of K steps: the rows they claim, stacks, returns-to-go, timesteps, masks, epochs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from atari_zarr_testkit import write_fixture_rlu
from atari_zarr_testkit.expect import expected_return_to_go, expected_stacks

from atari_zarr import AtariZarrDataset, MultiGameDataset, convert
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.batch import collate_batch


def window_starts(episode: np.ndarray, k: int, pad: bool = False) -> list[tuple[int, int]]:
    """(start, real rows) of every window, found by walking the rows one at a time."""
    out = []
    n = len(episode)
    first = 0
    for r in range(n + 1):
        if r == n or episode[r] != episode[first]:
            length = r - first
            if length >= k:
                out.extend((s, k) for s in range(first, r - k + 1))
            elif pad:
                out.append((first, length))
            first = r
    return out


def check_against_truth(batch, starts, truth, k: int, stack: int, final=None) -> None:
    """Every field of a [B, K] batch of windows equals the truth, position by position."""
    done = truth.terminated | truth.truncated
    rtg = expected_return_to_go(truth.reward, truth.episode)
    firsts = {int(e): int(np.flatnonzero(truth.episode == e)[0]) for e in np.unique(truth.episode)}
    for b, (s, real) in enumerate(starts):
        rows = np.arange(s, s + real)
        obs, nxt = expected_stacks(truth.observation, truth.episode, done, rows, stack, final)
        got = batch[b]
        np.testing.assert_array_equal(got["observation"][:real].numpy(), obs)
        np.testing.assert_array_equal(got["next", "observation"][:real].numpy(), nxt)
        np.testing.assert_array_equal(got["index"][:real].numpy(), rows)
        np.testing.assert_array_equal(got["action"][:real].numpy(), truth.action[rows])
        np.testing.assert_array_equal(got["next", "reward"][:real, 0].numpy(), truth.reward[rows])
        np.testing.assert_array_equal(
            got["next", "terminated"][:real, 0].numpy(), truth.terminated[rows]
        )
        np.testing.assert_array_equal(
            got["next", "truncated"][:real, 0].numpy(), truth.truncated[rows]
        )
        np.testing.assert_array_equal(got["episode"][:real].numpy(), truth.episode[rows])
        np.testing.assert_allclose(got["return_to_go"][:real, 0].numpy(), rtg[rows], rtol=1e-6)
        first = firsts[int(truth.episode[s])]
        np.testing.assert_array_equal(got["timestep"][:real].numpy(), rows - first)
        assert got["mask"][:real].all() and not got["mask"][real:].any()
        # one episode per window
        assert len(set(truth.episode[rows].tolist())) == 1
        if real < k:  # padding: zeros everywhere, index -1
            assert not got["observation"][real:].any()
            assert not got["next", "observation"][real:].any()
            assert (got["index"][real:] == -1).all()
            assert not got["action"][real:].any() and not got["return_to_go"][real:].any()
            assert not got["next", "done"][real:].any()


@pytest.mark.parametrize(("k", "stack"), [(1, 1), (5, 1), (5, 4), (12, 3)])
def test_every_window_equals_the_truth(pong_store, pong_truth, k: int, stack: int) -> None:
    w = AtariZarrDataset(pong_store.url, frame_stack=stack).windows(k)
    want = window_starts(pong_truth.episode, k)
    assert len(w) == len(want)
    assert w.starts(np.arange(len(w))).tolist() == [s for s, _ in want]
    batch = w[np.arange(len(w))]
    assert batch.batch_size == (len(w), k)
    check_against_truth(batch, want, pong_truth, k, stack)
    # single items are [K]
    assert w[0].batch_size == (k,) and w[-1]["index"][-1] == want[-1][0] + k - 1


def test_pad_gives_one_padded_window_per_short_episode(pong_store, pong_truth) -> None:
    k = 20
    w = AtariZarrDataset(pong_store.url, frame_stack=4).windows(k, pad=True)
    want = window_starts(pong_truth.episode, k, pad=True)
    assert any(real < k for _, real in want) and any(real == k for _, real in want)
    assert len(w) == len(want)
    check_against_truth(w[np.arange(len(w))], want, pong_truth, k, 4)


def test_cut_and_terminal_episodes(pong_store, pong_truth) -> None:
    """A truncated episode's return-to-go stops at its last stored row; terminal ones end done."""
    truth = pong_truth
    assert truth.truncated.any() and truth.terminated.any()
    w = AtariZarrDataset(pong_store.url).windows(3)
    batch = w[np.arange(len(w))]
    last = batch[:, -1]
    ends = last["next", "done"][:, 0]
    # a window ending on an episode's last row: return-to-go of that row is its reward
    np.testing.assert_array_equal(
        last["return_to_go"][ends, 0].numpy(), last["next", "reward"][ends, 0].numpy()
    )
    assert last["next", "truncated"].any() and last["next", "terminated"].any()


@pytest.fixture(scope="module")
def rlu_store(tmp_path_factory):
    """RL Unplugged shards (terminal frames kept in final_observation), converted."""
    fixture = write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=2, present=(0, 1))
    [store] = convert(
        fixture.root,
        str(tmp_path_factory.mktemp("rlu-out")),
        progress=False,
        scheduler="synchronous",
    )
    return store.url, fixture.truth()


@pytest.mark.parametrize("stack", [1, 4])
def test_rl_unplugged_windows_end_on_the_terminal_frame(rlu_store, stack: int) -> None:
    url, truth = rlu_store
    k = 6
    w = AtariZarrDataset(url, frame_stack=stack).windows(k, pad=True)
    want = window_starts(truth.episode, k, pad=True)
    batch = w[np.arange(len(w))]
    check_against_truth(batch, want, truth, k, stack, final=truth.final_observation)
    ends = batch["next", "terminated"][:, :, 0]
    assert ends.any()
    last = batch["next", "observation"][ends]
    frames = last if stack == 1 else last[:, -1]
    eps = batch["episode"][ends].numpy()
    np.testing.assert_array_equal(frames.numpy(), truth.final_observation[eps])


def test_stacks_are_views_of_k_plus_stack_distinct_frames(pong_store) -> None:
    """[B, K, 4, 84, 84] costs the memory of [B, K + 4, 84, 84]."""
    w = AtariZarrDataset(pong_store.url, frame_stack=4).windows(10)
    batch = w[np.arange(8)]
    obs, nxt = batch["observation"], batch["next", "observation"]
    assert obs.shape == (8, 10, 4, 84, 84)
    assert obs.untyped_storage().data_ptr() == nxt.untyped_storage().data_ptr()
    assert obs.untyped_storage().nbytes() >= 8 * 14 * 84 * 84
    assert obs.untyped_storage().nbytes() < 8 * 10 * 4 * 84 * 84
    assert not obs.is_contiguous()
    assert torch.equal(obs.contiguous(), obs)  # .contiguous() gives the same values


def test_sample_and_sample_iter_and_dataloader(pong_store) -> None:
    ds = AtariZarrDataset(pong_store.url, frame_stack=2)
    w = ds.windows(4)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    a = w.sample(16, generator=g1)
    assert a.batch_size == (16, 4)
    drawn = list(w.sample_iter(16, batches=2, prefetch=2, generator=g2))
    assert torch.equal(drawn[0]["index"], a["index"])
    loader = torch.utils.data.DataLoader(w, batch_size=8, shuffle=True, collate_fn=collate_batch)
    batch = next(iter(loader))
    assert batch.batch_size == (8, 4) and batch["observation"].shape == (8, 4, 2, 84, 84)
    again = pickle.loads(pickle.dumps(w))
    assert len(again) == len(w) and torch.equal(again[3]["observation"], w[3]["observation"])


def test_windows_stream_is_every_window_once(pong_store) -> None:
    w = AtariZarrDataset(pong_store.url, frame_stack=2).windows(8)
    seen = []
    for rank in range(2):
        stream = w.stream(50, seed=3, rank=rank, world_size=2, unit_rows=64, shuffle_buffer=128)
        loader = torch.utils.data.DataLoader(
            stream,
            batch_size=None,
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=collate_batch,
        )
        for batch in loader:
            assert batch.batch_size[1:] == (8,)
            rows = batch["index"]
            assert bool(((rows[:, 1:] - rows[:, :-1]) == 1).all())
            assert bool((batch["episode"] == batch["episode"][:, :1]).all())
            seen.append(rows[:, 0].numpy())
            ref = w[np.searchsorted(w.starts(np.arange(len(w))), rows[:, 0].numpy())]
            for key in ("observation", ("next", "observation"), "return_to_go", "timestep"):
                assert torch.equal(batch[key], ref[key]), key
    starts = np.concatenate(seen)
    # every window once, and the padding (a repeat, so that every consumer has as many)
    _, pads = stream.balance(4)
    assert set(starts.tolist()) == set(w.starts(np.arange(len(w))).tolist())
    assert len(starts) == len(w) + int(pads.sum()) and pads.max() <= 1


def test_windows_stream_resumes_with_what_was_not_seen(pong_store) -> None:
    w = AtariZarrDataset(pong_store.url).windows(6, pad=True)
    whole = [b["index"][:, 0] for b in w.stream(40, seed=1, unit_rows=64, shuffle_buffer=128)]
    stream = w.stream(40, seed=1, unit_rows=64, shuffle_buffer=128)
    first = []
    for batch in stream:
        first.append(batch["index"][:, 0])
        if len(first) == 3:
            break
    state = stream.state_dict()
    assert state["items"] == "windows:6:pad" and state["positions"] == {0: 120}
    again = w.stream(40, seed=0, unit_rows=64, shuffle_buffer=128)
    again.load_state_dict(state)
    rest = [b["index"][:, 0] for b in again]
    assert torch.cat(first + rest).tolist() == torch.cat(whole).tolist()
    # a transitions stream's state is not a windows stream's
    plain = AtariZarrDataset(pong_store.url).stream(40, unit_rows=64, shuffle_buffer=128)
    with pytest.raises(InvalidArgumentError, match="does not belong to this stream"):
        plain.load_state_dict(state)


def test_multi_game_windows(pong_store, rlu_store) -> None:
    mix = MultiGameDataset([pong_store.url, rlu_store[0]]).windows(5)
    parts = [AtariZarrDataset(u).windows(5) for u in (pong_store.url, rlu_store[0])]
    assert len(mix) == sum(len(p) for p in parts)
    batch = mix[np.array([0, len(parts[0])])]
    games = [mix.game_names.index(name.split("/")[0]) for name in mix.games]
    assert batch["game_id"][:, 0].tolist() == games
    assert batch["row"][1, 0] == parts[1].starts(0)[0]
    assert batch["index"][1, 0] == len(AtariZarrDataset(pong_store.url)) + parts[1].starts(0)[0]
    first_rows = torch.cat([b["index"][:, 0] for b in mix.stream(64, seed=0, unit_rows=64)])
    second = first_rows >= len(AtariZarrDataset(pong_store.url))
    assert [int((~second).sum()), int(second.sum())] == [len(p) for p in parts]


def test_full_action_space(pong_store, tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match="--full-action-space"):
        AtariZarrDataset(pong_store.url, full_action_space=True)
    src = str(tmp_path / "src")
    from atari_zarr_testkit import write_fixture_run

    write_fixture_run(src, "Pong", "1", capacity=64, steps=200, seed=2)
    [store] = convert(src, str(tmp_path / "out"), progress=False, full_action_space=True)
    minimal = AtariZarrDataset(store.url).windows(4)[np.arange(5)]["action"]
    full = AtariZarrDataset(store.url, full_action_space=True).windows(4)[np.arange(5)]["action"]
    from atari_zarr.ale import minimal_action_set

    table = torch.tensor(minimal_action_set("Pong"))
    assert torch.equal(full, table[minimal])


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_bad_window_lengths(pong_store, bad) -> None:
    with pytest.raises(InvalidArgumentError, match="window length must be a positive integer"):
        AtariZarrDataset(pong_store.url).windows(bad)


def test_window_longer_than_every_episode(pong_store, pong_truth) -> None:
    longest = int(np.bincount(pong_truth.episode).max())
    with pytest.raises(InvalidArgumentError, match=rf"the longest has {longest} steps.*pad=True"):
        AtariZarrDataset(pong_store.url).windows(longest + 1)
    assert len(AtariZarrDataset(pong_store.url).windows(longest + 1, pad=True)) > 0


def test_bad_batch_sizes_indices_and_states_are_one_line(pong_store) -> None:
    """Issue "never wrong, round two", item 12: what used to be a raw RuntimeError, a
    silent rounding, or a state accepted as it was."""
    ds = AtariZarrDataset(pong_store.url)
    w = ds.windows(6)
    mix = MultiGameDataset([pong_store.url])
    with pytest.raises(IndexError, match=rf"out of range for .* with {len(w)} windows"):
        w[len(w)]
    for sampler in (ds, w, mix):
        for bad in (-1, 2.5, True, "3"):
            with pytest.raises(InvalidArgumentError, match="batch_size must be a non-negative integer") as info:
                sampler.sample(bad)
            assert "\n" not in str(info.value)
        with pytest.raises(InvalidArgumentError, match="batch_size must be a non-negative integer"):
            next(iter(sampler.sample_iter(2.5, batches=1)))
        assert len(sampler.sample(np.int64(3))) == len(sampler.sample(torch.tensor(3))) == 3
    stream = ds.stream(40, unit_rows=64, shuffle_buffer=128)
    next(iter(stream))
    state = stream.state_dict()
    for key, value in (("epoch", -1), ("positions", {0: -40})):
        spoiled = {**state, key: value}
        again = ds.stream(40, unit_rows=64, shuffle_buffer=128)
        with pytest.raises(InvalidArgumentError, match="negative") as info:
            again.load_state_dict(spoiled)
        assert "\n" not in str(info.value)
