"""The TorchRL drop-in: AtariZarrExperienceReplay and AtariZarrStorage with real TorchRL."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from atari_zarr_testkit import write_fixture_run
from torch import nn

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import (
    ReadOnlyDatasetError,
    StoreNotFoundError,
)

pytest.importorskip("torchrl")

from torchrl.data import Categorical
from torchrl.data.replay_buffers import (
    ReplayBufferEnsemble,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.envs import CatFrames, Compose, UnsqueezeTransform
from torchrl.modules import QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

from atari_zarr.torchrl import AtariZarrExperienceReplay, AtariZarrStorage


@pytest.fixture(scope="module")
def root(pong_source, tmp_path_factory):
    """Pong/1 (short episodes, gaps) and Breakout/3, converted under one root (read-only)."""
    source_root = tmp_path_factory.mktemp("torchrl-dqn")
    shutil.copytree(pong_source.url, source_root / "Pong" / "1")
    write_fixture_run(
        str(source_root), "Breakout", "3", capacity=64, steps=300, seed=3, max_episode_length=20
    )
    dest_root = tmp_path_factory.mktemp("torchrl-stores")
    convert(str(source_root), str(dest_root), progress=False)
    return str(dest_root)


@pytest.fixture
def truth(pong_truth):
    return pong_truth


@pytest.mark.slow
def test_import_atari_zarr_never_imports_torchrl():
    code = (
        "import sys, atari_zarr, atari_zarr.read.mixing, atari_zarr.read.dataset\n"
        "bad = sorted(m for m in sys.modules if m == 'torchrl' or m.startswith('torchrl.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy())


def test_available_datasets_paths_and_errors(root, tmp_path):
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=4, root=root)
    assert ds.available_datasets == ["Breakout/3", "Pong/1"]
    assert AtariZarrExperienceReplay.list_datasets(root) == ["Breakout/3", "Pong/1"]
    assert ds.data_path == f"{root}/Pong/1.zarr"
    assert ds.dataset_id == "Pong/1" and len(ds) == len(ds.dataset)
    with pytest.raises(
        StoreNotFoundError,
        match=r"Pong/5 is not in .*close matches there: \['Pong/1'\], of 2 stores.*"
        r"`atari-zarr pull Pong/5`",
    ) as info:
        AtariZarrExperienceReplay("Pong/5", root=root, download=False)
    assert "\n" not in str(info.value)
    with pytest.raises(StoreNotFoundError, match=r"Zaxxon/9 .*close matches there: none, of 2"):
        AtariZarrExperienceReplay("Zaxxon/9", root=root, download=False)
    # a run RL Unplugged does not have is refused before anything is fetched
    with pytest.raises(StoreNotFoundError, match=r"RL Unplugged has runs 1 to 5 of Zaxxon"):
        AtariZarrExperienceReplay("Zaxxon/9", root=root)


def test_sample_is_ted_with_objective_shapes(root, truth):
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=16, root=root)
    s = ds.sample()
    assert s.batch_size == (16,)
    assert s["observation"].shape == (16, 84, 84) and s["observation"].dtype == torch.uint8
    assert s["action"].dtype == torch.int64 and s["action"].shape == (16,)
    for key in [
        "done",
        "terminated",
        "truncated",
        ("next", "done"),
        ("next", "terminated"),
        ("next", "truncated"),
        ("next", "reward"),
    ]:
        assert s[key].shape == (16, 1), key
    rows = s["index"].numpy()
    np.testing.assert_array_equal(s["observation"].numpy(), truth.observation[rows])
    np.testing.assert_array_equal(s["next", "observation"].numpy(), truth.next_observation[rows])
    np.testing.assert_array_equal(s["next", "terminated"].numpy()[:, 0], truth.terminated[rows])


@pytest.mark.parametrize("strict", [True, False])
def test_slices_are_consecutive_and_never_cross_an_episode(root, truth, strict):
    ds = AtariZarrExperienceReplay(
        "Pong/1", batch_size=40, slice_len=8, root=root, strict_length=strict
    )
    assert isinstance(ds.sampler, SliceSampler)
    assert torch.equal(ds.episodes, torch.from_numpy(truth.episode))
    lengths = np.bincount(truth.episode)
    assert (lengths < 8).any()  # some episodes are shorter than a slice
    for _ in range(20):
        s = ds.sample()
        idx = s["index"].view(-1)
        episode = s["episode"]
        np.testing.assert_array_equal(episode.numpy(), truth.episode[idx.numpy()])
        # the sampler marks the last step of every slice as truncated: cut there
        ends = torch.nonzero(s["next", "truncated"].view(-1)).view(-1) + 1
        assert ends[-1] == len(idx)
        pieces = torch.tensor_split(torch.arange(len(idx)), ends[:-1])
        for piece in pieces:
            assert torch.equal(idx[piece], idx[piece[0]] + torch.arange(len(piece)))
            assert (episode[piece] == episode[piece[0]]).all()
            if strict:
                assert len(piece) == 8
        if not strict:
            assert min(len(p) for p in pieces) >= 1
        if strict:
            assert s.batch_size == (40,)


def test_num_slices_and_the_strict_len_spelling(root):
    ds = AtariZarrExperienceReplay(
        "Pong/1", batch_size=24, num_slices=3, root=root, strict_len=False
    )
    assert ds.sampler.num_slices == 3 and ds.sampler.strict_length is False


def test_without_replacement_covers_every_index_once_per_epoch(root):
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=32, replacement=False, root=root)
    assert isinstance(ds.sampler, SamplerWithoutReplacement)
    for _epoch in range(2):
        seen = torch.cat([batch["index"] for batch in ds])
        assert sorted(seen.tolist()) == list(range(len(ds)))


def test_slices_without_replacement_take_every_episode_once_per_epoch(root, truth):
    ds = AtariZarrExperienceReplay(
        "Pong/1", batch_size=16, slice_len=4, replacement=False, strict_len=False, root=root
    )
    assert isinstance(ds.sampler, SliceSamplerWithoutReplacement)
    episodes = []
    for batch in ds:
        idx = batch["index"].view(-1)
        cuts = torch.nonzero(batch["episode"][1:] != batch["episode"][:-1]).view(-1) + 1
        for piece in torch.tensor_split(torch.arange(len(idx)), cuts):
            assert torch.equal(idx[piece], idx[piece[0]] + torch.arange(len(piece)))
            episodes.append(int(batch["episode"][piece[0]]))
    assert sorted(episodes) == sorted(set(truth.episode.tolist()))


class _QNet(nn.Module):
    def __init__(self, frames: int, actions: int) -> None:
        super().__init__()
        self.frames = frames
        self.linear = nn.Linear(frames * 84 * 84, actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float().div(255)
        return self.linear(x.flatten(-3) if self.frames > 1 else x.flatten(-2))


@pytest.mark.parametrize("frame_stack", [1, 4])
def test_dqn_loss_runs_on_a_batch_as_is(root, frame_stack):
    torch.manual_seed(0)
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=32, root=root, frame_stack=frame_stack)
    s = ds.sample()
    net = _QNet(frame_stack, 6)
    actor = QValueActor(net, in_keys=["observation"], spec=Categorical(6))
    loss_module = DQNLoss(actor, action_space="categorical", delay_value=True)
    SoftUpdate(loss_module, eps=0.99)
    gamma = 0.9
    loss_module.make_value_estimator(gamma=gamma)
    loss = loss_module(s)["loss"]
    loss.backward()
    assert net.linear.weight.grad is not None and net.linear.weight.grad.abs().sum() > 0
    # the same loss by hand: one-step TD target that ignores the zero frame after the end
    with torch.no_grad():
        q = net(s["observation"]).gather(-1, s["action"].unsqueeze(-1))
        next_q = net(s["next", "observation"]).max(-1, keepdim=True).values
        not_term = (~s["next", "terminated"]).float()
        target = s["next", "reward"] + gamma * not_term * next_q
        expected = (q - target).pow(2).mean()
    torch.testing.assert_close(loss.detach(), expected)


def test_ensemble_of_two_games(root):
    pong = AtariZarrExperienceReplay("Pong/1", batch_size=32, slice_len=8, root=root)
    breakout = AtariZarrExperienceReplay("Breakout/3", batch_size=32, slice_len=8, root=root)
    ens = ReplayBufferEnsemble(pong, breakout, batch_size=32, sample_from_all=True)
    s = ens.sample()
    assert s.batch_size == (2, 16)
    ids = s["index", "buffer_ids"]
    assert (ids[0] == 0).all() and (ids[1] == 1).all()
    for b, member in enumerate([pong, breakout]):
        rows = s["index", "index"][b].view(-1)
        ref = member.dataset[rows]
        assert torch.equal(s["observation"][b], ref["observation"])
        assert torch.equal(s["episode"][b], ref["episode"])


@pytest.mark.filterwarnings(
    "ignore:The last dimension of the tensordict should be marked as 'time'"
)
def test_catframes_over_slices_matches_frame_stack(root):
    keys = ["observation", ("next", "observation")]
    transform = Compose(
        UnsqueezeTransform(-3, in_keys=keys),
        CatFrames(N=4, dim=-3, in_keys=keys, padding="constant"),
    )
    ds = AtariZarrExperienceReplay(
        "Pong/1", batch_size=32, slice_len=8, root=root, transform=transform
    )
    ref = AtariZarrDataset(ds.data_path, frame_stack=4)
    for _ in range(5):
        s = ds.sample()
        assert s["observation"].shape == (32, 4, 84, 84)
        r = ref[s["index"].view(-1)]
        # from the 4th step of a slice on, CatFrames has seen enough of the slice
        got = s["observation"].view(4, 8, 4, 84, 84)[:, 3:]
        want = r["observation"].view(4, 8, 4, 84, 84)[:, 3:]
        assert torch.equal(got, want)
        got = s["next", "observation"].view(4, 8, 4, 84, 84)[:, 3:]
        want = r["next", "observation"].view(4, 8, 4, 84, 84)[:, 3:]
        assert torch.equal(got, want)


def test_storage_is_read_only_and_pickles(root):
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=root, frame_stack=2)
    storage = ds._storage
    assert isinstance(storage, AtariZarrStorage)
    sample = ds.sample()
    for write, match in (
        (lambda: ds.extend(sample), "cannot be extended; copy samples into a regular"),
        (lambda: ds.add(sample[0]), "nothing is added to it"),
        (lambda: ds.empty(), "cannot be emptied"),
        (lambda: ds.delete(), "does not delete it"),
        (lambda: storage.set(0, sample), "read-only"),
    ):
        with pytest.raises(ReadOnlyDatasetError, match=match) as info:
            write()
        assert "Pong/1.zarr" in str(info.value) and "\n" not in str(info.value)
    clone = pickle.loads(pickle.dumps(storage))
    assert len(clone) == len(storage) and clone.dataset.frame_stack == 2
    assert torch.equal(
        clone[torch.arange(5)]["observation"], storage[torch.arange(5)]["observation"]
    )
    assert clone[3]["observation"].shape == (2, 84, 84)
    assert torch.equal(storage[2:6]["episode"], storage[[2, 3, 4, 5]]["episode"])


def test_repeated_reads_do_not_share_added_keys(root):
    storage = AtariZarrStorage(f"{root}/Pong/1.zarr")
    first = storage[torch.arange(4)]
    first["extra"] = torch.ones(4)
    second = storage[torch.arange(4)]
    assert "extra" not in second.keys()
    assert torch.equal(first["observation"], second["observation"])


def test_slice_sampling_fetches_frames_once(root, monkeypatch):
    # SliceSampler reads the batch for its done flags, then the buffer reads it again
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=32, slice_len=8, root=root)
    calls = []
    frames = ds.dataset._store.frames
    original = frames.read
    monkeypatch.setattr(
        frames, "read", lambda rows, out=None: calls.append(1) or original(rows, out)
    )
    ds.sample()
    assert len(calls) == 1


def test_prefetch_and_pin_memory_pass_through(root):
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=root, prefetch=2)
    batches = [ds.sample() for _ in range(3)]
    assert all(b.batch_size == (8,) for b in batches)
    assert ds._prefetch_cap == 2


def _prefetchers() -> set:
    return {t for t in threading.enumerate() if t.name.startswith("atari_zarr-prefetch")}


def test_batches_drawn_ahead_come_from_one_named_thread_in_order(root):
    """``prefetch=4``: four batches in flight, drawn by one thread (TorchRL's pool would
    have four, taking the GIL from each other), in the order ``sample()`` without
    prefetch draws them; ``shutdown()`` stops the thread."""
    before = _prefetchers()

    def seeded() -> torch.Generator:  # not the global one, which other threads may draw
        return torch.Generator().manual_seed(7)

    plain = AtariZarrExperienceReplay("Pong/1", batch_size=16, root=root, generator=seeded())
    want = [plain.sample()["index"] for _ in range(6)]
    ahead = AtariZarrExperienceReplay(
        "Pong/1", batch_size=16, root=root, prefetch=4, generator=seeded()
    )
    got = [ahead.sample()["index"] for _ in range(6)]
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
    assert len(ahead._prefetch_queue) == 4
    assert len(_prefetchers() - before) == 1
    ahead.shutdown()
    assert _prefetchers() <= before


def test_batches_drawn_ahead_carry_their_info_before_the_caller_takes_them(root):
    """With ``prefetch``, the prefetch thread sets a batch's ``info`` in it (what TorchRL's
    ``sample()`` did on the caller's thread): the batches waiting in the queue already
    hold their ``"index"``, and ``sample()`` gives each with the info it was drawn with."""
    gen = torch.Generator().manual_seed(3)
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=root, prefetch=3, generator=gen)
    data, info = ds.sample(return_info=True)
    assert torch.equal(data["index"], info["index"])
    waiting = [future.result() for future in list(ds._prefetch_queue)]
    assert len(waiting) == 3
    for batch, batch_info in waiting:
        assert torch.equal(batch["index"], batch_info["index"])
    for batch, batch_info in waiting:  # taken in the order they were drawn
        got, got_info = ds.sample(return_info=True)
        assert got is batch and got_info is batch_info
    ds.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        ds.sample()


def test_batches_drawn_ahead_without_replacement_follow_the_epochs(root):
    """A sampler without replacement with ``prefetch``: the same batches as without it,
    every row once an epoch, across the end of an epoch (where TorchRL stops drawing
    ahead until the sampler starts the next one)."""

    def batches(**kwargs) -> list[torch.Tensor]:
        ds = AtariZarrExperienceReplay(
            "Pong/1",
            batch_size=64,
            root=root,
            replacement=False,
            generator=torch.Generator().manual_seed(5),
            **kwargs,
        )
        n = len(ds)
        out = [ds.sample()["index"] for _ in range(2 * -(-n // 64) + 1)]
        ds.shutdown()
        return out

    plain, ahead = batches(), batches(prefetch=2)
    assert len(plain) == len(ahead)
    for want, got in zip(plain, ahead, strict=True):
        assert torch.equal(want, got)
    n = int(sum(len(b) for b in plain[: len(plain) // 2]))
    first_epoch = torch.cat(ahead)[:n]
    assert torch.equal(first_epoch.sort().values, torch.arange(n))


@pytest.mark.parametrize("slices", [False, True])
def test_dumps_and_loads_keep_the_batches_drawn_ahead(root, tmp_path, slices):
    """``prefetch`` without replacement: the sampler had drawn the queued batches, and
    ``dumps`` left them out, so an epoch resumed from the dump never gave their rows
    (2,788 of 39,936 rows twice, others never). Now the dump holds their rows and
    sampling info (no frame, no pickle), and the resumed buffer gives exactly the
    batches the uninterrupted one gives, every row once an epoch."""
    import json

    from atari_zarr.errors import InvalidArgumentError

    def buffer(prefetch=3):
        kwargs = {"num_slices": 4} if slices else {}
        return AtariZarrExperienceReplay(
            "Pong/1",
            batch_size=40,
            root=root,
            replacement=False,
            prefetch=prefetch,
            generator=torch.Generator().manual_seed(7),
            **kwargs,
        )

    def key(data) -> list:
        return [data["index"].tolist(), data["next", "truncated"].tolist()]

    first = buffer()
    rows = len(first)
    seen = [first.sample() for _ in range(5)]
    first.dumps(tmp_path / "dump")
    ahead = len(first._prefetch_queue)  # the drawn-ahead batches, still queued
    assert ahead == 3 or (slices and ahead)  # (fewer where the epoch has fewer left)
    again = buffer()
    again.loads(tmp_path / "dump")
    steps = -(-rows // 40) - 5  # the rest of the epoch, uninterrupted and resumed
    rest = [first.sample() for _ in range(steps)]
    resumed = [again.sample() for _ in range(steps)]
    assert steps > 3 and [key(a) for a in rest] == [key(b) for b in resumed]
    for a, b in zip(rest[:3], resumed[:3], strict=True):  # the saved ones: their frames
        assert torch.equal(a["observation"], b["observation"])
        assert torch.equal(a["next", "observation"], b["next", "observation"])
    if not slices:  # every row once
        epoch = torch.cat([b["index"] for b in seen + resumed])
        assert sorted(epoch.tolist()) == list(range(rows))
    files = [p for p in (tmp_path / "dump").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 100_000  # no frame (40 rows: 280 kB)
    assert not list((tmp_path / "dump").rglob("*.pkl"))
    saved = json.loads((tmp_path / "dump" / "atari_zarr_prefetch.json").read_text())
    assert len(saved["batches"]) == ahead
    # a buffer that draws nothing ahead has nowhere to put them: one line
    with pytest.raises(InvalidArgumentError, match="batches drawn ahead") as err:
        buffer(prefetch=None).loads(tmp_path / "dump")
    assert "\n" not in str(err.value) and "prefetch=3" in str(err.value)
    for ds in (first, again):
        ds.shutdown()


def test_a_tampered_dump_of_batches_drawn_ahead_is_one_line_and_changes_nothing(root, tmp_path):
    """``atari_zarr_prefetch.json`` edited by hand: rows as floats, strings or bools were
    cast (``3.7`` read row 3, ``"3"`` row 3), rows beyond the store or a bool mask were
    refused only after the sampler's state was loaded, a huge row was a raw
    ``OverflowError``, 150 batches for ``prefetch=2`` were all read again, and an info
    entry named ``observation`` replaced the frames read from the store. Each is now
    one line naming the file, before anything of the buffer changes."""
    import copy
    import json

    from atari_zarr.errors import InvalidArgumentError

    def buffer():
        return AtariZarrExperienceReplay(
            "Pong/1",
            batch_size=8,
            root=root,
            replacement=False,
            prefetch=2,
            generator=torch.Generator().manual_seed(3),
        )

    saved = buffer()
    for _ in range(3):
        saved.sample()
    saved.dumps(tmp_path / "dump")
    saved.shutdown()
    file = tmp_path / "dump" / "atari_zarr_prefetch.json"
    doc = json.loads(file.read_text())

    def edited(change) -> str:
        bad = copy.deepcopy(doc)
        change(bad, bad["batches"][0][0]["arrays"][0])  # the first batch's index
        return json.dumps(bad)

    def put(at, value):
        return lambda _, a: a["values"].__setitem__(at, value)

    tampered = {
        "truncated": file.read_text()[:100],
        "row as a float": edited(put(0, 3.7)),
        "row as a string": edited(put(0, "3")),
        "row as a bool": edited(put(0, True)),
        "row past the end": edited(put(0, 10**6)),
        "negative row": edited(put(0, -1)),
        "row past int64": edited(put(0, 2**70)),
        "row past uint8": edited(lambda _, a: a.update(dtype="uint8", values=[300] * 8)),
        "a mask": edited(lambda _, a: a.update(dtype="bool", values=[True] * 8)),
        "rows as floats": edited(lambda _, a: a.update(dtype="float64")),
        "2-d rows": edited(lambda _, a: a.update(shape=[2, 4])),
        "too many batches": json.dumps({**doc, "batches": doc["batches"] * 75}),
        "frames": edited(
            lambda d, _: d["batches"][0].append(
                {
                    "key": "observation",
                    "arrays": [{"dtype": "uint8", "shape": [8], "values": [0] * 8}],
                }
            )
        ),
    }
    fresh = buffer()
    want = [fresh.sample()["index"].tolist() for _ in range(2)]
    fresh.shutdown()
    for what, text in tampered.items():
        file.write_text(text)
        loading = buffer()
        with pytest.raises(InvalidArgumentError, match=r"atari_zarr_prefetch\.json") as err:
            loading.loads(tmp_path / "dump")
        assert "\n" not in str(err.value), what
        # refused before anything changed: the buffer goes on as a fresh one
        assert [loading.sample()["index"].tolist() for _ in range(2)] == want, what
        loading.shutdown()


def test_a_batch_size_other_than_the_constructors_is_drawn_as_torchrl_draws_it(root):
    """``sample(batch_size=...)`` other than the constructor's, with ``prefetch``: TorchRL's
    own path (one warning, the batch of that size once the queue is empty)."""
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=root, prefetch=2)
    assert len(ds.sample()) == 8
    with pytest.warns(UserWarning, match="conflicting batch_sizes"):
        sizes = [len(ds.sample(4)) for _ in range(4)]
    assert sizes[-1] == 4 and set(sizes) <= {4, 8}
    # the batches TorchRL's path queued come out with their info set all the same
    for _ in range(4):
        data, info = ds.sample(return_info=True)
        assert torch.equal(data["index"], info["index"])
    ds.shutdown()


def test_a_transform_that_reshapes_the_batch_fails_as_torchrl_says_with_prefetch_too(root):
    """TorchRL's ``sample()`` cannot set the info in a batch a transform reshaped, and says
    so; drawn ahead, the batch fails the same way when the caller takes it."""
    said = []
    for prefetch in (None, 2):
        ds = AtariZarrExperienceReplay(
            "Pong/1", batch_size=8, root=root, prefetch=prefetch, transform=lambda td: td[:4]
        )
        with pytest.raises(RuntimeError, match="Failed to set the metadata") as info:
            ds.sample()
        said.append(str(info.value))
        ds.shutdown()
    assert said[0] == said[1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_ahead_with_a_thread_of_its_own(root):
    """The parent's prefetch thread does not cross a fork: the child's ``sample()`` starts
    its own (the parent's pool, with no thread behind it, would never answer)."""
    ds = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=root, prefetch=2)
    ds.sample()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        import signal

        signal.alarm(60)  # a child waiting on the parent's pool would hang: end it
        code = 1
        try:
            ok = all(ds.sample().batch_size == (8,) for _ in range(4))
            code = 0 if ok and _prefetchers() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert ds.sample().batch_size == (8,)
    ds.shutdown()


def _guide_block(page: str) -> str:
    """The first Python block of a page of the site (``docs/guides/PAGE.md``)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guides", f"{page}.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    block = text.split("```{not-run} python\n", 1)[1].split("```", 1)[0]
    return block.split("\n", 1)[1] if block.startswith(":reason:") else block


def test_the_guides_migration_code_runs(tmp_path, monkeypatch, capsys):
    # TorchRL's own docstring examples, with only the import and the root changed
    src = tmp_path / "dqn"
    for game in ("Pong", "Asterix"):
        write_fixture_run(
            str(src), game, "5", capacity=256, steps=900, seed=5, episode_lengths=[90, 130, 70, 160]
        )
    convert(str(src), str(tmp_path / "stores"), progress=False)
    monkeypatch.chdir(tmp_path)
    code = _guide_block("migrate-torchrl")
    assert (
        "from atari_zarr.torchrl import AtariZarrExperienceReplay as AtariDQNExperienceReplay"
        in code
    )
    namespace: dict = {}
    exec(compile(code, "docs/guides/migrate-torchrl.md", "exec"), namespace)
    sample = namespace["sample"]
    assert sample.batch_size == (2, 64)
    assert (sample["index", "buffer_ids"][0] == 0).all()
    idx = namespace["data"].get("index").view(2, 64)
    assert (idx[:, 1:] == idx[:, :-1] + 1).all()
    assert "first sample, Pong" in capsys.readouterr().out


def test_url_root_with_storage_options(pong_run, source_root):
    from atari_zarr_testkit.gcs import FakeGCSServer

    truth = pong_run.truth()
    with FakeGCSServer() as server:
        server.create_bucket("atari")
        opts = server.storage_options()
        root = "gs://atari/stores"
        convert(str(source_root), root, progress=False, storage_options=opts)
        ds = AtariZarrExperienceReplay(
            "Pong/1", batch_size=16, slice_len=4, root=root, storage_options=opts
        )
        assert ds.available_datasets == ["Pong/1"]
        assert ds.data_path == "gs://atari/stores/Pong/1.zarr"
        s = ds.sample()
        rows = s["index"].view(-1).numpy()
        np.testing.assert_array_equal(s["observation"].numpy(), truth.observation[rows])
        # what a worker process gets: the URL and options, re-opened
        clone = pickle.loads(pickle.dumps(ds._storage))
        np.testing.assert_array_equal(
            clone[torch.from_numpy(rows)]["next", "observation"].numpy(),
            truth.next_observation[rows],
        )


def test_the_rest_of_torchrls_documented_surface(root):
    """Each method of TorchRL's reference page for the class either works or raises one line
    (the writing ones: test_storage_is_read_only_and_pickles); docs/torchrl.md lists them."""
    from torchrl.data.replay_buffers import RandomSampler
    from torchrl.envs import RenameTransform

    ds = AtariZarrExperienceReplay("Pong/1", batch_size=16, root=root)
    # metadata, as TorchRL's samples carry it
    sample = ds.sample()
    assert sample.get_non_tensor("metadata") == {"dataset_id": "Pong/1"}
    # transforms: appended and inserted, applied by sample()
    ds.append_transform(RenameTransform(["observation"], ["pixels"]))
    ds.insert_transform(0, UnsqueezeTransform(-3, in_keys=["observation"]))
    out = ds.sample()
    assert "observation" not in out.keys() and out["pixels"].shape == (16, 1, 84, 84)
    # state dicts: the sampler's state travels, the data stay in the store
    ds3 = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=root, replacement=False)
    first = ds3.sample()["index"]
    state = ds3.state_dict()
    ds4 = AtariZarrExperienceReplay("Pong/1", batch_size=8, root=root, replacement=False)
    ds4.load_state_dict(state)
    ds3_next, ds4_next = ds3.sample()["index"], ds4.sample()["index"]
    assert torch.equal(ds3_next, ds4_next) and not torch.equal(first, ds3_next)
    # hooks register (they run on dumps/loads, which a store-backed dataset refuses)
    ds3.register_save_hook(lambda x: x)
    ds3.register_load_hook(lambda x: x)
    # a plain random sampler set afterwards, and iteration
    ds3.set_sampler(RandomSampler())
    assert next(iter(ds3)).batch_size == (8,)
    assert ds3.data_path_root == root and ds3.data_path.endswith("Pong/1.zarr")


def test_torchrls_registry_loads_the_drop_in(root):
    """``load_dataset("atari_zarr:Game/run")`` once ``atari_zarr.torchrl`` is imported."""
    from torchrl.data.datasets import load_dataset

    import atari_zarr.torchrl  # noqa: F401  (registers the prefix)

    ds = load_dataset("atari_zarr:Pong/1", batch_size=8, root=root, download=False)
    assert isinstance(ds, AtariZarrExperienceReplay) and ds.dataset_id == "Pong/1"
    assert ds.sample().shape == (8,)
