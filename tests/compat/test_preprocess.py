"""TorchRL's preprocess for a store: values, workers, resume, errors, compression."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from torchrl.data import ReplayBuffer

from atari_zarr import AtariZarrDataset
from atari_zarr.compat.preprocess import UNIT_ROWS, fn_fingerprint, preprocess
from atari_zarr.compat.torchrl_storage import PreprocessedStorage
from atari_zarr.errors import (
    InvalidArgumentError,
    StoreExistsError,
    StoreIncompleteError,
)
from tests.read.test_stream import write_store


def shrink(td):
    """Keep the frames' top-left 42x42 corner, rename the action, drop the rest."""
    out = td.select("observation", ("next", "observation"), "action", ("next", "reward"))
    out["observation"] = out["observation"][..., :42, :42]
    out["next", "observation"] = out["next", "observation"][..., :42, :42]
    out["other_action"] = out.pop("action")
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """9,000 transitions: three units of preprocess."""
    return write_store(str(tmp_path_factory.mktemp("pre") / "s.zarr"), 9000)


def expected(ds, rows):
    return shrink(ds[rows].exclude("index"))


def test_values_metadata_and_a_replay_buffer(store, tmp_path):
    ds = AtariZarrDataset(store)
    out = preprocess(ds, shrink, dest=tmp_path / "d", num_workers=0, metadata={"dataset_id": "x"})
    assert isinstance(out, PreprocessedStorage) and len(out) == len(ds)
    rows = np.array([0, 4095, 4096, 8999, 17])
    got, want = out[rows], expected(ds, rows)
    for key in want.keys(include_nested=True, leaves_only=True):
        assert torch.equal(got[key], want[key]), key
    assert got.get_non_tensor("metadata") == {"dataset_id": "x"}
    rb = ReplayBuffer(storage=out, batch_size=16)
    assert rb.sample()["observation"].shape == (16, 42, 42)
    # compressed: far below the raw bytes
    size = sum(p.stat().st_size for p in (tmp_path / "d").rglob("*") if p.is_file())
    assert size < len(ds) * 2 * 42 * 42 / 10


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_write_the_same_store(store, tmp_path, method):
    ds = AtariZarrDataset(store)
    one = preprocess(ds, shrink, dest=tmp_path / "one", num_workers=0)
    two = preprocess(
        ds, shrink, dest=tmp_path / "two", num_workers=2, mp_start_method=method, pbar=True
    )
    rows = np.arange(len(ds))
    assert torch.equal(one[rows]["observation"], two[rows]["observation"])
    assert torch.equal(one[rows]["other_action"], two[rows]["other_action"])


def test_num_frames_and_a_finished_dest_is_reused(store, tmp_path):
    ds = AtariZarrDataset(store)
    calls = []

    def counted(td):
        calls.append(len(td))
        return shrink(td)

    # counted's closure (the list) changes as it runs: version= names what made dest
    out = preprocess(ds, counted, dest=tmp_path / "d", num_frames=100, version="1")
    assert len(out) == 100
    calls.clear()
    again = preprocess(ds, counted, dest=tmp_path / "d", num_frames=100, version="1")
    assert len(again) == 100 and calls == [1]  # the probe only: the dest was complete
    with pytest.raises(StoreExistsError, match="another source or output"):
        preprocess(ds, counted, dest=tmp_path / "d", num_frames=200, version="1")


def test_a_failure_names_the_sample_and_the_same_version_resumes(store, tmp_path):
    ds = AtariZarrDataset(store)

    bad_episode = int(ds[5000]["episode"])

    def fails(td):
        if int(td["episode"].max()) >= bad_episode:
            raise ValueError("a bad frame")
        return shrink(td)

    first = int(np.flatnonzero(ds.episodes.numpy() >= bad_episode)[0])
    with pytest.raises(InvalidArgumentError, match=rf"fn fails on sample {first} \(ValueError"):
        preprocess(ds, fails, dest=tmp_path / "d", num_workers=0, version="1")
    with pytest.raises(StoreIncompleteError, match="unfinished preprocess"):
        PreprocessedStorage(tmp_path / "d")
    seen = []

    def fine(td):
        seen.append(int(td["episode"][0]))
        return shrink(td)

    out = preprocess(ds, fine, dest=tmp_path / "d", num_workers=0, version="1")
    assert len(out) == len(ds)
    # the first unit was kept: only the probe and the units after it ran again
    assert len(seen) == 1 + -(-(len(ds) - UNIT_ROWS) // 256)


def test_another_fn_never_mixes_into_dest(store, tmp_path):
    """fn_v1 fails on its 20th call; fn_v2 (same keys, other values) starts dest over."""
    ds = AtariZarrDataset(store)
    calls = []

    def fn_v1(td):
        calls.append(1)
        if len(calls) == 20:
            raise ValueError("a bad frame")
        return shrink(td)

    def fn_v2(td):
        out = shrink(td)
        out["observation"] = 255 - out["observation"]
        return out

    with pytest.raises(InvalidArgumentError, match="fix fn and run preprocess again"):
        preprocess(ds, fn_v1, dest=tmp_path / "d", num_workers=0)
    with pytest.raises(StoreExistsError, match="begun by another fn.*overwrite=True") as err:
        preprocess(ds, fn_v2, dest=tmp_path / "d", num_workers=0)  # refused: never mixed
    assert "\n" not in str(err.value)
    out = preprocess(ds, fn_v2, dest=tmp_path / "d", num_workers=0, overwrite=True)
    rows = np.arange(len(ds))
    assert torch.equal(out[rows]["observation"], fn_v2(ds[rows].exclude("index"))["observation"])
    # a complete dest: a changed fn is refused in one line, never served the old output
    with pytest.raises(StoreExistsError, match=r"another fn .*overwrite=True") as err:
        preprocess(ds, shrink, dest=tmp_path / "d", num_workers=0)
    assert "\n" not in str(err.value)
    # a closure's value is part of fn
    def scaled(k):
        return lambda td: shrink(td).apply(lambda t: t * k if t.dtype.is_floating_point else t)

    preprocess(ds, scaled(2.0), dest=tmp_path / "e", num_frames=300, num_workers=0)
    with pytest.raises(StoreExistsError, match="another fn"):
        preprocess(ds, scaled(3.0), dest=tmp_path / "e", num_frames=300, num_workers=0)
    again = preprocess(ds, scaled(2.0), dest=tmp_path / "e", num_frames=300, num_workers=0)
    assert len(again) == 300
    # overwrite=True writes it again, with the new fn
    out = preprocess(ds, shrink, dest=tmp_path / "d", num_workers=0, overwrite=True)
    assert torch.equal(out[rows]["observation"], shrink(ds[rows].exclude("index"))["observation"])


def test_fn_fingerprint_rule():
    import functools

    def make(k):
        return lambda td: td * k

    assert fn_fingerprint(make(1)) == fn_fingerprint(make(1))
    assert fn_fingerprint(make(1)) != fn_fingerprint(make(2))
    assert fn_fingerprint(functools.partial(max, 1)) != fn_fingerprint(functools.partial(max, 2))
    assert fn_fingerprint(shrink, version="a") == fn_fingerprint(make(1), version="a")
    assert fn_fingerprint(shrink) != fn_fingerprint(shrink, version="a")

    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, td):
            return td * self.k

    assert fn_fingerprint(Scale(1)) == fn_fingerprint(Scale(1))
    assert fn_fingerprint(Scale(1)) != fn_fingerprint(Scale(2))


def test_fn_that_changes_the_batch_size(store, tmp_path):
    ds = AtariZarrDataset(store)
    with pytest.raises(InvalidArgumentError, match=r"fn returned torch.Size\(\[2\]\) .*sample 0"):
        preprocess(
            ds, lambda td: shrink(td)[:2] if len(td) > 2 else shrink(td), dest=tmp_path / "d"
        )
    with pytest.raises(InvalidArgumentError, match="dim=1 is not supported"):
        preprocess(ds, shrink, dim=1, dest=tmp_path / "e")
    with pytest.raises(InvalidArgumentError, match="num_frames must be a positive integer"):
        preprocess(ds, shrink, num_frames=0, dest=tmp_path / "f")


FINGERPRINTS = """
import torch
from atari_zarr.compat.preprocess import fn_fingerprint

class Crop:
    def __init__(self):
        self.keys = {"observation", "next_observation", "action"}
        self.size = 64
    def __call__(self, td):
        return td

def with_set(td, keys={"a", "b", "c", "d"}):
    return td

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
print(fn_fingerprint(Crop()), fn_fingerprint(model), fn_fingerprint(with_set))
"""


@pytest.mark.parametrize("seeds", [("1", "2")])
def test_the_fingerprint_of_the_same_fn_is_the_same_in_every_process(seeds):
    """A class instance, an nn.Module and a function whose defaults hold a set: the same
    code and values give the same fingerprint whatever the process's hash seed."""
    import subprocess
    import sys

    outs = []
    for seed in seeds:
        proc = subprocess.run(
            [sys.executable, "-c", FINGERPRINTS],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout.split())
    assert outs[0] == outs[1]
    assert len(set(outs[0])) == 3


KILLED_PARENT = """
import sys, time
from atari_zarr import AtariZarrDataset
from atari_zarr.compat.preprocess import preprocess

def slow(td):
    time.sleep(0.5)
    return td.select("action")

preprocess(AtariZarrDataset(sys.argv[1]), slow, dest=sys.argv[2], num_workers=2,
           mp_start_method=sys.argv[3], version="slow")
"""


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_end_with_a_parent_killed_with_kill_9(store, tmp_path, method):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT, store, str(tmp_path / "d"), method],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        workers: list[int] = []
        for _ in range(3000):  # the pool starts its two workers (import time varies)
            workers = [p for p in _children(proc.pid) if _alive(p)]
            if len(workers) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert len(workers) >= 2, proc.stderr.read() if proc.poll() is not None else workers
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        for _ in range(3000):  # at most 300 s: the kernel ends them at once
            if not any(_alive(p) for p in workers):
                break
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), [p for p in workers if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _children(proc.pid):
            os.kill(p, signal.SIGKILL)
        proc.stderr.close()
