"""TorchRL's preprocess for a store: values, workers, resume, errors, compression."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from torchrl.data import ReplayBuffer

from atari_zarr import AtariZarrDataset
from atari_zarr.compat.preprocess import UNIT_ROWS, preprocess
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
    out = preprocess(ds, shrink, dest=tmp_path / "d", num_frames=100)
    assert len(out) == 100
    calls = []

    def counted(td):
        calls.append(len(td))
        return shrink(td)

    again = preprocess(ds, counted, dest=tmp_path / "d", num_frames=100)
    assert len(again) == 100 and calls == [1]  # the probe only: the dest was complete
    with pytest.raises(StoreExistsError, match="another source or output"):
        preprocess(ds, shrink, dest=tmp_path / "d", num_frames=200)


def test_a_failure_names_the_sample_and_a_second_run_resumes(store, tmp_path):
    ds = AtariZarrDataset(store)

    bad_episode = int(ds[5000]["episode"])

    def fails(td):
        if int(td["episode"].max()) >= bad_episode:
            raise ValueError("a bad frame")
        return shrink(td)

    first = int(np.flatnonzero(ds.episodes.numpy() >= bad_episode)[0])
    with pytest.raises(InvalidArgumentError, match=rf"fn fails on sample {first} \(ValueError"):
        preprocess(ds, fails, dest=tmp_path / "d", num_workers=0)
    with pytest.raises(StoreIncompleteError, match="unfinished preprocess"):
        PreprocessedStorage(tmp_path / "d")
    seen = []

    def fine(td):
        seen.append(int(td["episode"][0]))
        return shrink(td)

    out = preprocess(ds, fine, dest=tmp_path / "d", num_workers=0)
    assert len(out) == len(ds)
    # the first unit was kept: only the probe and the units after it ran again
    assert len(seen) == 1 + -(-(len(ds) - UNIT_ROWS) // 256)


def test_fn_that_changes_the_batch_size(store, tmp_path):
    ds = AtariZarrDataset(store)
    with pytest.raises(InvalidArgumentError, match=r"fn returned torch.Size\(\[2\]\) .*sample 0"):
        preprocess(
            ds, lambda td: shrink(td)[:2] if len(td) > 2 else shrink(td), dest=tmp_path / "d"
        )
    with pytest.raises(InvalidArgumentError, match="dim=1 is not supported"):
        preprocess(ds, shrink, dim=1, dest=tmp_path / "e")
    with pytest.raises(InvalidArgumentError, match="num_frames must be a positive count"):
        preprocess(ds, shrink, num_frames=0, dest=tmp_path / "f")
