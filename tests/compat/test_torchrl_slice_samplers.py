"""TorchRL 0.14's own slice-sampler tests, run against the drop-in's storage.

These are the tests of ``test/rb/test_samplers.py`` (TorchRL 0.14) that apply to a
read-only storage, with the same samplers, calls and assertions. What changes is where
the data come from: TorchRL writes a TensorDict into its storage; here each test's
trajectories are episodes of a store of the same lengths (``write_episodes_store``),
read through :class:`~atari_zarr.torchrl.AtariZarrStorage`:

* TorchRL's ``episode``/``another_episode``/``traj`` entries are the store's ``episode``
  (its ids count from 0, where a test's ids may count from 1), its ``done`` entry
  ``("next", "done")`` and its ``terminated``/``truncated`` those under ``next``;
* ``steps`` (the step within an episode) and ``count``/``obs`` (the row) are derived
  from the rows sampled; ``storage._storage[index]`` is ``storage.get(index)``.

Not applicable, and left out: two-dimensional storages (``ndim=2``, ``at_capacity``
with a cursor: a store is one run in order), ``test_slice_sampler_errors`` (a storage
holding malformed done flags, or a ListStorage), the traj-key auto-detection tests
that need a ``("collector", "traj_ids")`` entry, the ``is_init`` marker tests (a store
has no ``is_init``: TorchRL adds no marker then), fragmented and GPU variants. The
prioritized ones need TorchRL's C++ extension: ``torchrl_ext_env/checks_prioritized.py``.
"""

from __future__ import annotations

import pytest
import torch
from atari_zarr_testkit import write_episodes_store

pytest.importorskip("torchrl")

from torchrl.collectors.utils import split_trajectories
from torchrl.data import ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers import SliceSampler, SliceSamplerWithoutReplacement

from atari_zarr.torchrl import AtariZarrStorage

DONE = ("next", "done")
TERMINATED = ("next", "terminated")
TRUNCATED = ("next", "truncated")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One store per episode layout the tests use, written on first use."""
    made: dict[tuple[int, ...], str] = {}

    def store(lengths: list[int]) -> AtariZarrStorage:
        key = tuple(lengths)
        if key not in made:
            made[key] = write_episodes_store(tmp_path_factory.mktemp("episodes"), lengths)
        return AtariZarrStorage(made[key])

    return store


def _steps(storage: AtariZarrStorage, rows: torch.Tensor) -> torch.Tensor:
    """TorchRL's ``steps`` entry: each row's step within its episode."""
    episode = storage.episodes
    first = torch.searchsorted(episode, episode, side="left")
    return rows - first[rows]


@pytest.mark.parametrize(
    "batch_size,num_slices,slice_len",
    [[100, 20, None], [120, 30, None], [100, None, 5], [120, None, 4], [101, None, 101]],
)
@pytest.mark.parametrize("match_episode", [True, False])
def test_slice_sampler(stores, batch_size, num_slices, slice_len, match_episode):
    torch.manual_seed(0)
    storage = stores([30, 25, 15, 30])
    strict_length = not (slice_len is not None and slice_len > 15)
    sampler = SliceSampler(
        num_slices=num_slices,
        # a key the storage lacks: TorchRL falls back to the end key
        traj_key="episode" if match_episode else "whatever_episode",
        end_key=DONE,
        slice_len=slice_len,
        strict_length=strict_length,
        truncated_key=TRUNCATED,
    )
    if slice_len is not None:
        num_slices = batch_size // slice_len
    trajs_unique_id = set()
    too_short = False
    count_unique = set()
    for _ in range(50):
        index, info = sampler.sample(storage, batch_size=batch_size)
        samples = storage.get(index)
        rows = index[0] if isinstance(index, tuple) else index
        steps = _steps(storage, rows)
        if strict_length:
            view = samples.view(num_slices, -1)
            unique_another_episode = view["episode"].unique(dim=1).squeeze()
            assert unique_another_episode.shape == torch.Size([num_slices])
            steps_view = steps.view(num_slices, -1)
            assert (steps_view[..., 1:] - 1 == steps_view[..., :-1]).all()
        index_numel = rows.numel()
        too_short = too_short or index_numel < batch_size
        trajs_unique_id = trajs_unique_id.union(samples["episode"].view(-1).tolist())
        count_unique = count_unique.union(rows.view(-1).tolist())

        truncated = info[TRUNCATED]
        terminated = info[TERMINATED]
        assert (truncated | terminated).view(num_slices, -1)[:, -1].all()
        assert (terminated == samples[TERMINATED].view_as(terminated)).all()
        done = info[DONE]
        assert done.view(num_slices, -1)[:, -1].all()
        if len(count_unique) == 100:
            break
    else:
        raise AssertionError(
            f"Not all items can be sampled: {set(range(100)) - count_unique} are missing"
        )
    if strict_length:
        assert not too_short
    else:
        assert too_short
    assert len(trajs_unique_id) == 4


@pytest.mark.parametrize("batch_size,num_slices", [[20, 4], [4, 2]])
@pytest.mark.parametrize("match_episode", [True, False])
def test_slice_sampler_without_replacement(stores, batch_size, num_slices, match_episode):
    torch.manual_seed(0)
    storage = stores([5] * 20)
    sampler = SliceSamplerWithoutReplacement(
        num_slices=num_slices,
        traj_key="episode" if match_episode else "whatever_episode",
        end_key=DONE,
    )
    trajs_unique_id = set()
    for i in range(5):
        index, info = sampler.sample(storage, batch_size=batch_size)
        samples = storage.get(index).view(num_slices, -1)
        steps = _steps(storage, index[0]).view(num_slices, -1)
        assert samples["episode"].unique(dim=1).squeeze().shape == torch.Size([num_slices])
        assert (steps[..., 1:] - 1 == steps[..., :-1]).all()
        cur_episodes = samples["episode"].view(-1).tolist()
        for ep in cur_episodes:
            assert ep not in trajs_unique_id, i
        trajs_unique_id = trajs_unique_id.union(cur_episodes)
    done_recon = info[TRUNCATED] | info[TERMINATED]
    assert done_recon.view(num_slices, -1)[:, -1].all()
    done = info[DONE]
    assert done.view(num_slices, -1)[:, -1].all()


def test_slice_sampler_left_right(stores):
    torch.manual_seed(0)
    storage = stores([10] * 10)
    for n in (2, 4):
        rb = TensorDictReplayBuffer(
            sampler=SliceSampler(num_slices=10, traj_key="episode", span=(n, n)),
            batch_size=50,
            storage=storage,
        )
        for _ in range(10):
            sample = rb.sample()
            rows = sample["index"].view(-1)
            # TorchRL's entries: obs = the step + 1, eps = the episode + 1 (0 is padding)
            sample["obs"] = _steps(storage, rows) + 1
            sample["eps"] = sample["episode"] + 1
            sample = split_trajectories(sample)
            assert (sample["next", "truncated"].squeeze(-1).sum(-1) == 1).all()
            assert ((sample["obs"] == 0).sum(-1) <= n).all(), sample["obs"]
            assert ((sample["eps"] == 0).sum(-1) <= n).all()
            for i in range(sample.shape[0]):
                curr_eps = sample[i]["eps"]
                curr_eps = curr_eps[curr_eps != 0]
                assert curr_eps.unique().numel() == 1


def test_slice_sampler_strictlength(stores):
    torch.manual_seed(0)
    storage = stores([2, 10])  # TorchRL's traj: 1 1 then ten 0s; here episodes 0 then 1
    buffer = ReplayBuffer(
        storage=storage,
        sampler=SliceSampler(num_slices=2, strict_length=True, traj_key="episode"),
        batch_size=8,
    )
    for _ in range(50):
        sample = buffer.sample()
        assert sample.shape == torch.Size([8])
        assert (sample["episode"] == 1).all()

    buffer = ReplayBuffer(
        storage=storage,
        sampler=SliceSampler(num_slices=2, strict_length=False, traj_key="episode"),
        batch_size=8,
    )
    for _ in range(50):
        sample = buffer.sample()
        if sample.shape == torch.Size([6]):
            assert (sample["episode"] != 1).any()
        else:
            assert len(sample["episode"].unique()) == 1


def test_slice_sampler_auto_traj_key_episode(stores):
    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(
        storage=stores([3, 3, 2]), sampler=SliceSampler(num_slices=2), batch_size=6
    )
    rb.sample()
    assert rb.sampler.traj_key == "episode"
    assert rb.sampler._fetch_traj is True


def test_slice_sampler_explicit_traj_key_no_auto(stores):
    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(
        storage=stores([3, 3, 2]),
        sampler=SliceSampler(num_slices=2, traj_key="episode"),
        batch_size=6,
    )
    rb.sample()
    assert rb.sampler.traj_key == "episode"
    assert getattr(rb.sampler, "_traj_key_auto", False) is False


def _short_trajs_rb(stores, traj_lengths, slice_len, num_slices):
    return TensorDictReplayBuffer(
        storage=stores(traj_lengths),
        sampler=SliceSampler(
            slice_len=slice_len, traj_key="episode", strict_length=False, pad_output=True
        ),
        batch_size=num_slices * slice_len,
    )


def test_slice_sampler_mask_present_when_short_trajs(stores):
    torch.manual_seed(0)
    sample = _short_trajs_rb(stores, [3, 6, 2], slice_len=5, num_slices=3).sample()
    assert ("collector", "mask") in sample.keys(True)


def test_slice_sampler_mask_shape_dtype(stores):
    torch.manual_seed(0)
    b, t = 4, 6
    sample = _short_trajs_rb(stores, [2, 5, 3, 4], slice_len=t, num_slices=b).sample()
    mask = sample[("collector", "mask")]
    assert mask.shape == torch.Size([b * t])
    assert mask.dtype == torch.bool
    assert mask.shape[0] == sample.batch_size[0]


def test_slice_sampler_mask_correctness(stores):
    torch.manual_seed(0)
    b, t = 6, 8
    rb = _short_trajs_rb(stores, [3, 8, 2, 7, 1, 5], slice_len=t, num_slices=b)
    for _ in range(20):
        mask = rb.sample()[("collector", "mask")].reshape(b, t)
        lengths = mask.sum(-1)
        for i in range(b):
            length = lengths[i].item()
            assert 1 <= length <= t
            assert mask[i, :length].all()
            assert not mask[i, length:].any()


def test_slice_sampler_mask_padded_obs_is_valid(stores):
    torch.manual_seed(0)
    sample = _short_trajs_rb(stores, [2, 6, 3], slice_len=5, num_slices=3).sample()
    rows = sample["index"].view(-1)
    # padded positions repeat the last real index: every one a row of the store
    assert ((rows >= 0) & (rows < 11)).all()
    assert torch.equal(sample["observation"], sample["observation"].clamp(0, 255))


def test_slice_sampler_strict_length_no_mask(stores):
    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(
        storage=stores([6, 6]),
        sampler=SliceSampler(slice_len=4, traj_key="episode", strict_length=True, pad_output=False),
        batch_size=8,
    )
    assert ("collector", "mask") not in rb.sample().keys(True)


def test_slice_sampler_mask_all_long_trajs_no_mask(stores):
    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(
        storage=stores([8, 8]),
        sampler=SliceSampler(slice_len=4, traj_key="episode", strict_length=False, pad_output=True),
        batch_size=8,
    )
    assert ("collector", "mask") not in rb.sample().keys(True)


def test_slice_sampler_truncated_marks_last_real_step(stores):
    torch.manual_seed(0)
    b, t = 4, 6
    sample = _short_trajs_rb(stores, [2, 5, 3, 4], slice_len=t, num_slices=b).sample()
    mask = sample[("collector", "mask")].reshape(b, t)
    lengths = mask.sum(-1)
    trunc = sample[TRUNCATED].reshape(b, t)
    for i in range(b):
        length = lengths[i].item()
        assert trunc[i, length - 1].item()
        if length < t:
            assert not trunc[i, length:].any()


def test_replacement_kwarg_slice_in_replay_buffer(stores):
    torch.manual_seed(0)
    storage = stores([20, 20, 20])
    rb = ReplayBuffer(
        storage=storage,
        sampler=SliceSampler(
            replacement=False, slice_len=5, traj_key="episode", strict_length=True
        ),
        batch_size=10,
    )
    _, info = rb.sample(return_info=True)
    index = info["index"][0] if isinstance(info["index"], tuple) else info["index"]
    obs = index.view(2, 5)  # TorchRL's obs entry: the row
    diffs = obs[:, 1:] - obs[:, :-1]
    assert (diffs == 1).all(), obs
