"""TorchRL's prioritized samplers over the drop-in: sampling, priorities, saved state, memory.

Run in ``.venv-torchrl`` (torch 2.14, whose build TorchRL 0.14's C++ extension needs) by
``tests/compat/test_torchrl_prioritized.py``. The TorchRL tests ported here are those of
``test/rb/test_samplers.py`` (TorchRL 0.14) for ``PrioritizedSliceSampler`` that apply to
a read-only storage; see ``tests/compat/test_torchrl_slice_samplers.py`` for the mapping.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from atari_zarr_testkit import write_episodes_store, write_fixture_run, write_two_runs
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import PrioritizedSampler, PrioritizedSliceSampler

from atari_zarr import convert
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.torchrl import AtariZarrExperienceReplay, AtariZarrStorage

DONE = ("next", "done")
TERMINATED = ("next", "terminated")
TRUNCATED = ("next", "truncated")


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    """TorchRL's episodes of 30, 25, 15 and 30 steps, as a store."""
    return write_episodes_store(tmp_path_factory.mktemp("ported"), [30, 25, 15, 30])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Pong/1 (2,000 rows, episodes of 1 to 60 steps) and Breakout/2, converted."""
    return write_two_runs(tmp_path_factory.mktemp("two-runs"))


def _frame_reads(dataset, monkeypatch) -> list[int]:
    frames = dataset.dataset._store.frames
    original = frames.read
    reads: list[int] = []
    monkeypatch.setattr(
        frames, "read", lambda rows, out=None: reads.append(len(rows)) or original(rows, out)
    )
    return reads


@pytest.mark.parametrize(
    "make",
    [
        lambda n: PrioritizedSampler(max_capacity=n, alpha=0.7, beta=0.9),
        lambda n: PrioritizedSliceSampler(
            max_capacity=n, alpha=0.7, beta=0.9, slice_len=8, traj_key="episode"
        ),
        lambda n: PrioritizedSliceSampler(
            max_capacity=n, alpha=0.7, beta=0.9, slice_len=8, end_key=DONE, strict_length=False
        ),
    ],
    ids=["prioritized", "prioritized-slice-traj", "prioritized-slice-end"],
)
def test_priorities_steer_the_drop_ins_samples(root, monkeypatch, make):
    # TorchRL's samplers draw from torch's global generator, their sum tree in float32:
    # a start of weight 1e-6 ** 0.7 among starts of 10 ** 0.7 is drawn now and then, and
    # a slice sampler then draws 8 rows of it (1/8 of a batch). Seeded, the draw is the
    # same every run; the share is taken over all five batches.
    torch.manual_seed(0)
    dataset = AtariZarrExperienceReplay("Pong/1", root=root, batch_size=64, sampler=make(2000))
    reads = _frame_reads(dataset, monkeypatch)
    episode = dataset.episodes
    sample = dataset.sample()  # every row starts at its default priority (TorchRL's doing)
    assert len(reads) == 1 and reads.pop() <= len(sample) * 2
    # all the weight on the rows of two episodes
    chosen = torch.isin(episode, torch.tensor([3, 7]))
    dataset.update_priority(torch.arange(2000), chosen.float() * 10 + 1e-6)
    drawn = []
    for _ in range(5):
        sample = dataset.sample()
        assert len(reads) == 1 and reads.pop() <= len(sample) * 2
        rows = sample["index"].view(-1)
        drawn.append(rows)
        assert chosen[rows].float().mean() > 0.8  # one stray slice of 8 rows at most
        assert torch.equal(sample["episode"], episode[rows])
        if isinstance(dataset.sampler, PrioritizedSliceSampler):
            ends = torch.nonzero(sample[TRUNCATED].view(-1)).view(-1) + 1
            for piece in torch.tensor_split(torch.arange(len(rows)), ends[:-1].tolist()):
                assert torch.equal(rows[piece], rows[piece[0]] + torch.arange(len(piece)))
                assert (episode[rows[piece]] == episode[rows[piece[0]]]).all()
    assert chosen[torch.cat(drawn)].float().mean() > 0.95


def test_priorities_dump_and_load_with_the_drop_in(root, tmp_path):
    def dataset(name="Pong/1", n=2000):
        return AtariZarrExperienceReplay(
            name,
            root=root,
            batch_size=32,
            sampler=PrioritizedSliceSampler(max_capacity=n, alpha=0.7, beta=0.9, num_slices=4),
        )

    first = dataset()
    first.update_priority(torch.arange(2000), torch.linspace(0.1, 5.0, 2000))
    first.dumps(tmp_path / "dump")
    sizes = sum(p.stat().st_size for p in (tmp_path / "dump").rglob("*") if p.is_file())
    assert sizes < 200_000  # the priorities (two trees of 2,000), no frame
    again = dataset()
    again.loads(tmp_path / "dump")
    torch.testing.assert_close(
        torch.as_tensor(again.sampler._sum_tree.query(0, 2000)),
        torch.as_tensor(first.sampler._sum_tree.query(0, 2000)),
    )
    assert again.sampler._max_priority[0] == first.sampler._max_priority[0]
    state = again.state_dict()
    other = dataset("Breakout/2", 300)
    with pytest.raises(InvalidArgumentError, match="was saved from dataset_id Pong/1"):
        other.loads(tmp_path / "dump")
    with pytest.raises(InvalidArgumentError, match="Breakout/2"):
        other.load_state_dict(state)


# -- TorchRL's own tests ---------------------------------------------------------------


@pytest.mark.parametrize("batch_size,num_slices,slice_len", [[100, 20, None]])
@pytest.mark.parametrize("match_episode", [True, False])
def test_slice_sampler_prioritized(ported, batch_size, num_slices, slice_len, match_episode):
    """``test_slice_sampler`` with ``prioritized=True``."""
    torch.manual_seed(0)
    storage = AtariZarrStorage(ported)
    episode = storage.episodes
    first = torch.searchsorted(episode, episode, side="left")
    sampler = PrioritizedSliceSampler(
        max_capacity=100,
        alpha=0.7,
        beta=0.9,
        num_slices=num_slices,
        traj_key="episode" if match_episode else "whatever_episode",
        end_key=DONE,
        slice_len=slice_len,
        strict_length=True,
        truncated_key=TRUNCATED,
    )
    index = torch.arange(0, 100, 1)
    sampler.extend(index)
    sampler.update_priority(index, 1)
    trajs_unique_id = set()
    count_unique = set()
    for _ in range(50):
        index, info = sampler.sample(storage, batch_size=batch_size)
        samples = storage.get(index)
        rows = index[0]
        view = samples.view(num_slices, -1)
        assert view["episode"].unique(dim=1).squeeze().shape == torch.Size([num_slices])
        steps = (rows - first[rows]).view(num_slices, -1)
        assert (steps[..., 1:] - 1 == steps[..., :-1]).all()
        assert rows.numel() == batch_size
        trajs_unique_id |= set(samples["episode"].view(-1).tolist())
        count_unique |= set(rows.view(-1).tolist())
        truncated, terminated = info[TRUNCATED], info[TERMINATED]
        assert (truncated | terminated).view(num_slices, -1)[:, -1].all()
        assert (terminated == samples[TERMINATED].view_as(terminated)).all()
        assert info[DONE].view(num_slices, -1)[:, -1].all()
        if len(count_unique) == 100:
            break
    else:
        raise AssertionError(f"Not all items can be sampled: {set(range(100)) - count_unique}")
    assert len(trajs_unique_id) == 4


def test_prioritized_slice_sampler_doc_example(tmp_path):
    storage = AtariZarrStorage(write_episodes_store(tmp_path, [3, 3, 3]))
    sampler = PrioritizedSliceSampler(max_capacity=9, num_slices=3, alpha=0.7, beta=0.9)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=6)
    sample, info = rb.sample(return_info=True)
    assert sample.batch_size == (6,) and info["priority_weight"].shape == (6,)
    priority = torch.tensor([0, 3, 3, 0, 0, 0, 1, 1, 1])
    rb.update_priority(torch.arange(0, 9, 1), priority=priority)
    sample, info = rb.sample(return_info=True)
    assert set(sample["episode"].tolist()) <= {0, 2}


def test_prioritized_slice_sampler_episodes(ported):
    storage = AtariZarrStorage(ported)
    sampler = PrioritizedSliceSampler(max_capacity=100, alpha=0.7, beta=0.9, num_slices=10)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=20)
    episodes = [rb.sample()["episode"] for _ in range(10)]
    assert {0, 1, 2, 3} == set(torch.cat(episodes).tolist())
    new_priorities = torch.cat([torch.ones(30), torch.zeros(25), torch.ones(15), torch.zeros(30)])
    sampler.update_priority(torch.arange(0, 100, 1), new_priorities)
    episodes = [rb.sample()["episode"] for _ in range(10)]
    assert {0, 2} == set(torch.cat(episodes).tolist())


def test_prioritized_slice_sampler_load_state_dict_restores_priorities(tmp_path):
    url = write_episodes_store(tmp_path, [5, 5, 5, 5])

    def build():
        sampler = PrioritizedSliceSampler(max_capacity=20, num_slices=2, alpha=0.7, beta=0.9)
        rb = TensorDictReplayBuffer(storage=AtariZarrStorage(url), sampler=sampler, batch_size=4)
        return sampler, rb

    sampler, rb = build()
    rb.update_priority(torch.arange(20), torch.arange(1.0, 21.0))
    sd = rb.state_dict()
    sampler2, rb2 = build()
    rb2.load_state_dict(sd)
    assert sampler2._max_priority[0] == sampler._max_priority[0]
    assert sampler2._max_priority[1] == sampler._max_priority[1]
    torch.testing.assert_close(
        torch.as_tensor(sampler2._sum_tree.query(0, 20)),
        torch.as_tensor(sampler._sum_tree.query(0, 20)),
    )


_MEMORY = """
import json, sys, torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import PrioritizedSampler, PrioritizedSliceSampler
from atari_zarr import AtariZarrDataset, ReadOptions
from atari_zarr.torchrl import AtariZarrStorage
torch.set_num_threads(1)


def peak_kb():
    # this process's own peak (ru_maxrss carries the parent's over fork and exec)
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("VmHWM")))


storage = AtariZarrStorage(
    AtariZarrDataset(sys.argv[1], frame_stack=4, options=ReadOptions(frame_cache_bytes=1 << 20))
)
n = len(storage)
TensorDictReplayBuffer(storage=storage, batch_size=120).sample()  # the read path warmed once
before = peak_kb()
rows = 0
for sampler in (
    PrioritizedSampler(max_capacity=n, alpha=0.7, beta=0.9),
    PrioritizedSliceSampler(max_capacity=n, alpha=0.7, beta=0.9, slice_len=30, traj_key="episode"),
    PrioritizedSliceSampler(
        max_capacity=n, alpha=0.7, beta=0.9, slice_len=30, end_key=("next", "done"),
        strict_length=False,
    ),
):
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=120)
    for _ in range(10):
        sample = rb.sample()
        rb.update_priority(sample["index"], torch.rand(len(sample)))
        rows += len(sample)
after = peak_kb()
print(json.dumps({"growth_kb": after - before, "rows": rows, "n": n}))
"""


def test_prioritized_samplers_over_a_store_larger_than_their_memory(tmp_path):
    """40,000 rows (282 MB of decoded frames) with a 1 MB frame cache."""
    source = tmp_path / "source"
    write_fixture_run(
        str(source), "Pong", "1", capacity=20000, steps=40000, seed=2, max_episode_length=400
    )
    [store] = convert(str(source), str(tmp_path / "stores"), progress=False)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_MEMORY), store.url],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    frames_mb = out["n"] * 84 * 84 / 1e6
    assert frames_mb > 250 and out["rows"] > 3 * 10 * 60
    assert out["growth_kb"] / 1e3 < frames_mb / 5, out
