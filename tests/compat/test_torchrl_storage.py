"""The TorchRL storage: bulk reads stay lazy, every TorchRL sampler reads only its batch's
frames, slices agree with ``windows(K)``, and a replay buffer's state dumps without frames."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from atari_zarr_testkit import write_fixture_run, write_two_runs

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import InvalidArgumentError

pytest.importorskip("torchrl")

from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import (
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)

from atari_zarr.compat.lazy_rows import LazyRows
from atari_zarr.torchrl import AtariZarrExperienceReplay, AtariZarrStorage

DONE = ("next", "done")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Pong/1 (2,000 rows, episodes of 1 to 60 steps) and Breakout/2, converted."""
    return write_two_runs(tmp_path_factory.mktemp("two-runs"))


def _spy_frames(storage: AtariZarrStorage, monkeypatch) -> list[int]:
    """The number of rows of each frame read the storage's store makes."""
    frames = storage.dataset._store.frames
    original = frames.read
    reads: list[int] = []
    monkeypatch.setattr(
        frames, "read", lambda rows, out=None: reads.append(len(rows)) or original(rows, out)
    )
    return reads


def _same(lazy: TensorDict, eager: TensorDict) -> None:
    keys = set(eager.keys(include_nested=True, leaves_only=True)) - {"metadata"}
    assert set(lazy.keys(include_nested=True, leaves_only=True)) - {"metadata"} == keys
    for key in keys:
        a, b = lazy[key], eager[key]
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key
    assert lazy.get_non_tensor("metadata") == eager.get_non_tensor("metadata")


def test_a_whole_storage_column_reads_no_frame(root, monkeypatch):
    storage = AtariZarrStorage(f"{root}/Pong/1.zarr", frame_stack=4)
    eager = storage.dataset[np.arange(len(storage))]
    reads = _spy_frames(storage, monkeypatch)
    whole = storage[:]
    assert isinstance(whole, LazyRows) and whole.batch_size == (len(storage),)
    for key in ("episode", "action", "done", DONE, ("next", "terminated"), ("next", "reward")):
        assert torch.equal(whole[key], eager[key]), key
        assert whole[key].dtype == eager[key].dtype
    assert reads == []  # per-step entries: no frame read
    assert storage[:]["episode"] is whole["episode"]  # the whole storage's, read once
    assert torch.equal(whole["next", "observation"], eager["next", "observation"])
    assert len(reads) == 1  # the frames, once, when asked
    assert torch.equal(whole["observation"], eager["observation"]) and len(reads) == 1


@pytest.mark.parametrize(
    "index",
    [
        torch.tensor([5, 3, 3, 1999]),
        [0, -1, 7],
        slice(10, 40, 3),
        slice(1990, None),
        (torch.tensor([[4], [9]]),),
        np.array([12]),
    ],
    ids=["tensor", "list", "stepped-slice", "tail-slice", "tuple-column", "array"],
)
def test_lazy_rows_are_the_rows_the_buffer_reads(root, index):
    storage = AtariZarrStorage(f"{root}/Pong/1.zarr", frame_stack=2)
    _same(storage[index], storage.get(index))


def test_a_single_row_is_one_item(root):
    storage = AtariZarrStorage(f"{root}/Pong/1.zarr")
    assert storage[3].batch_size == () and torch.equal(
        storage[3]["observation"], storage.get(3)["observation"]
    )


def _samplers(n: int):
    return {
        "random": (RandomSampler(), 64),
        "without-replacement": (SamplerWithoutReplacement(), 64),
        "slice-traj-key": (SliceSampler(slice_len=8, traj_key="episode"), 64),
        "slice-end-key": (SliceSampler(slice_len=8, end_key=DONE), 64),
        "slice-end-key-loose": (SliceSampler(slice_len=8, end_key=DONE, strict_length=False), 64),
        "slice-num-slices-cached": (
            SliceSampler(num_slices=4, traj_key="episode", cache_values=True),
            64,
        ),
        "slice-without-replacement-traj": (
            SliceSamplerWithoutReplacement(slice_len=8, traj_key="episode"),
            64,
        ),
        "slice-without-replacement-end": (
            SliceSamplerWithoutReplacement(slice_len=8, end_key=DONE, strict_length=False),
            64,
        ),
    }


@pytest.mark.parametrize("name", list(_samplers(0)))
def test_every_torchrl_sampler_reads_only_its_batchs_frames(root, monkeypatch, name):
    sampler, batch = _samplers(0)[name]
    dataset = AtariZarrExperienceReplay(
        "Pong/1", root=root, batch_size=batch, sampler=sampler, frame_stack=4
    )
    reads = _spy_frames(dataset._storage, monkeypatch)
    episode = dataset.episodes
    for _ in range(5):
        sample = dataset.sample()
        # one frame read per batch, of at most its rows and their stacks
        assert len(reads) == 1 and reads.pop() <= len(sample) * (4 + 1)
        rows = sample["index"].view(-1)
        assert torch.equal(sample["episode"], episode[rows])
        if "slice" in name:
            # a slice never crosses an episode: TorchRL cuts at its truncated marks
            ends = torch.nonzero(sample["next", "truncated"].view(-1)).view(-1) + 1
            for piece in torch.tensor_split(torch.arange(len(rows)), ends[:-1].tolist()):
                assert torch.equal(rows[piece], rows[piece[0]] + torch.arange(len(piece)))
                assert (episode[rows[piece]] == episode[rows[piece[0]]]).all()


@pytest.mark.parametrize("key", [{"traj_key": "episode"}, {"end_key": DONE}])
def test_slices_are_the_windows_of_the_same_rows(root, key):
    k = 6
    dataset = AtariZarrExperienceReplay(
        "Pong/1",
        root=root,
        batch_size=5 * k,
        frame_stack=4,
        sampler=SliceSampler(slice_len=k, **key),
    )
    windows = AtariZarrDataset(f"{root}/Pong/1.zarr", frame_stack=4).windows(k)
    for _ in range(4):
        sample = dataset.sample().view(5, k)
        index = sample["index"].reshape(5, k)  # TorchRL's index column: [5, k, 1]
        starts = index[:, 0].numpy()
        which = windows.items.count_before(starts)
        assert (windows.starts(which).ravel() == starts).all()  # each slice starts a window
        expected = windows[which]
        for name in (
            "observation",
            ("next", "observation"),
            "action",
            ("next", "reward"),
            "episode",
        ):
            assert torch.equal(sample[name], expected[name]), name
        assert torch.equal(index, expected["index"])


_MEMORY_CHECK = """
import json, sys
import torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import (
    RandomSampler, SamplerWithoutReplacement, SliceSampler, SliceSamplerWithoutReplacement,
)
from atari_zarr import AtariZarrDataset, ReadOptions
from atari_zarr.torchrl import AtariZarrStorage

torch.set_num_threads(1)


def peak_kb():
    # this process's own peak (ru_maxrss carries the parent's over fork and exec)
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("VmHWM")))


url = sys.argv[1]
options = ReadOptions(frame_cache_bytes=1 << 20)
storage = AtariZarrStorage(AtariZarrDataset(url, frame_stack=4, options=options))
done = ("next", "done")
samplers = [
    RandomSampler(), SamplerWithoutReplacement(),
    SliceSampler(slice_len=30, traj_key="episode"), SliceSampler(slice_len=30, end_key=done),
    SliceSampler(slice_len=30, end_key=done, strict_length=False),
    SliceSamplerWithoutReplacement(slice_len=30, traj_key="episode", strict_length=False),
]
rb = TensorDictReplayBuffer(storage=storage, sampler=samplers[0], batch_size=120)
rb.sample()  # the read path warmed once
episode = storage.episodes
before = peak_kb()
rows = 0
for sampler in samplers:
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=120)
    for _ in range(10):
        sample = rb.sample()
        rows += len(sample)
        index = sample["index"].view(-1)
        assert torch.equal(sample["episode"], episode[index])
        if isinstance(sampler, SliceSampler):  # exact slices: 30 rows of one episode
            ends = torch.nonzero(sample["next", "truncated"].view(-1)).view(-1) + 1
            for piece in torch.tensor_split(torch.arange(len(index)), ends[:-1].tolist()):
                assert torch.equal(index[piece], index[piece[0]] + torch.arange(len(piece)))
                assert (episode[index[piece]] == episode[index[piece[0]]]).all()
after = peak_kb()
print(json.dumps({"growth_kb": after - before, "rows": rows, "n": len(storage)}))
"""


@pytest.mark.slow
def test_samplers_over_a_store_larger_than_their_memory(tmp_path):
    """40,000 rows: 282 MB of decoded frames, a 1 MB frame cache; the samplers' process
    grows by far less than the frames (an eager ``storage[:]`` reads all of them)."""
    source = tmp_path / "source"
    write_fixture_run(
        str(source), "Pong", "1", capacity=20000, steps=40000, seed=2, max_episode_length=400
    )
    [store] = convert(str(source), str(tmp_path / "stores"), progress=False)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_MEMORY_CHECK), store.url],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    frames_mb = out["n"] * 84 * 84 / 1e6
    assert frames_mb > 250 and out["rows"] > 6 * 10 * 60
    assert out["growth_kb"] / 1e3 < frames_mb / 5, out


def test_dumps_and_loads_keep_an_epoch_without_frames(root, tmp_path):
    def dataset():
        return AtariZarrExperienceReplay("Pong/1", root=root, batch_size=100, replacement=False)

    first = dataset()
    seen = [first.sample()["index"] for _ in range(7)]
    first.dumps(tmp_path / "dump")
    rest = []
    for batch in first:  # the rest of the epoch, as the original goes on
        rest.append(batch["index"])
        if sum(len(r) for r in rest) + 700 >= len(first):
            break
    files = [p for p in (tmp_path / "dump").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 200_000  # no frame (2,000 rows: 14 MB)
    assert not (tmp_path / "dump" / "prefetch.pkl").exists()
    saved = json.loads((tmp_path / "dump" / "storage" / "atari_zarr_storage.json").read_text())
    assert saved == {
        "dataset_id": "Pong/1",
        "transitions": 2000,
        "episodes": first.dataset.num_episodes,
    }

    again = dataset()
    again.loads(tmp_path / "dump")
    resumed = []
    while sum(len(r) for r in resumed) < sum(len(r) for r in rest):
        resumed.append(again.sample()["index"])
    assert torch.equal(torch.cat(resumed), torch.cat(rest))
    everything = torch.cat(seen + rest)
    assert sorted(everything.tolist()) == list(range(len(first)))  # each row once


def test_a_state_of_another_store_is_refused_in_one_line(root, tmp_path):
    pong = AtariZarrExperienceReplay("Pong/1", root=root, batch_size=8, replacement=False)
    pong.sample()
    pong.dumps(tmp_path / "dump")
    breakout = AtariZarrExperienceReplay("Breakout/2", root=root, batch_size=8, replacement=False)
    for load in (
        lambda: breakout.loads(tmp_path / "dump"),
        lambda: breakout.load_state_dict(pong.state_dict()),
    ):
        with pytest.raises(InvalidArgumentError, match="was saved from dataset_id Pong/1") as err:
            load()
        assert "Breakout/2" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match=r"atari_zarr_storage\.json is missing"):
        breakout.loads(tmp_path / "nowhere")
    state = pong.state_dict()
    fresh = AtariZarrExperienceReplay("Pong/1", root=root, batch_size=8, replacement=False)
    fresh.load_state_dict(state)  # the same store: taken
    assert fresh.state_dict()["_storage"] == state["_storage"]


def test_a_preprocessed_storage_is_lazy_too(root, tmp_path):
    dataset = AtariZarrExperienceReplay("Pong/1", root=root, batch_size=16)
    out = dataset.preprocess(
        lambda td: td.select("observation", "episode", DONE),
        dest=tmp_path / "pre.zarr",
        num_frames=400,
    )
    whole = out[:]
    assert isinstance(whole, LazyRows) and whole[DONE].shape == (400, 1)
    assert whole.is_read() is False  # the observation column was not read
    eager = out.get(slice(None))
    assert torch.equal(whole["observation"], eager["observation"])
    assert torch.equal(whole[DONE], eager[DONE])
    rb = TensorDictReplayBuffer(
        storage=out, sampler=SliceSampler(slice_len=4, end_key=DONE), batch_size=8
    )
    sample = rb.sample().view(2, 4)
    assert (sample["episode"] == sample["episode"][:, :1]).all()
