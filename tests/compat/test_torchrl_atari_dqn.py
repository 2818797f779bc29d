"""TorchRL's own tests of ``AtariDQNExperienceReplay`` (``TestAtariDQN``), against the drop-in.

Each test asserts what TorchRL's ``test/libs/test_datasets.py::TestAtariDQN`` asserts,
with the same datasets ("Asterix/1", "Pong/4"), parameters and calls, twice:

* ``download``: TorchRL's constructor call as it is (no ``root=``, ``download=True`` by
  default): the runs are fetched from RL Unplugged's public layout, served by
  fake-gcs-server (``STORAGE_EMULATOR_HOST`` points gcsfs at it; the code's source URL
  is the public one), into the cache;
* ``root``: the constructor takes ``root=`` (stores converted from DQN Replay fixture
  runs), and nothing is downloaded.

TorchRL's file itself is not copied here; the tests are written again from it, call
for call.

One substitution: TorchRL's preprocessing test resizes frames with ``Resize``, which
needs torchvision, and torchvision has no CPU build that works beside this project's
torch. ``Downsample`` below does the same resize (to 32x32) with
``torch.nn.functional.interpolate``.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("torchrl")

from atari_zarr_testkit import write_fixture_run
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers import ReplayBufferEnsemble
from torchrl.envs import Compose, RenameTransform, UnsqueezeTransform
from torchrl.envs.transforms import ObservationTransform

from atari_zarr import convert
from atari_zarr.torchrl import AtariZarrExperienceReplay as AtariDQNExperienceReplay

# TorchRL's class-scoped fixture is an instance method, which pytest 9 deprecates
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestRemovedIn10Warning")


@pytest.fixture(params=["download", "root"])
def where(request, tmp_path_factory):
    """The constructor's extra arguments: none (download) or ``root=``."""
    if request.param == "root":
        return {"root": request.getfixturevalue("root")}
    public = request.getfixturevalue("rlu_public")
    home = request.getfixturevalue("download_home")
    mp = request.getfixturevalue("monkeypatch")
    mp.setenv("STORAGE_EMULATOR_HOST", public.proxy.endpoint_url)
    mp.setenv("ATARI_ZARR_HOME", home)
    return {}


@pytest.fixture(scope="module")
def download_home(tmp_path_factory):
    """The cache the downloads of this module go to (each run is fetched once)."""
    return str(tmp_path_factory.mktemp("atari-dqn-home"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Asterix/1 and Pong/4, episodes long enough for TorchRL's slices of 32."""
    source = tmp_path_factory.mktemp("atari-dqn-source")
    for game, run, seed in (("Asterix", "1", 1), ("Pong", "4", 4)):
        write_fixture_run(
            str(source), game, run, capacity=256, steps=1200, seed=seed, max_episode_length=120
        )
    dest = tmp_path_factory.mktemp("atari-dqn-stores")
    convert(str(source), str(dest), progress=False)
    return str(dest)


class Downsample(ObservationTransform):
    """``Resize(32)`` without torchvision: bilinear interpolation of the last two dims."""

    def __init__(self, size, in_keys):
        super().__init__(in_keys=in_keys, out_keys=in_keys)
        self.size = size

    def _apply_transform(self, obs):
        flat = obs.reshape(-1, 1, *obs.shape[-2:]).float()
        out = torch.nn.functional.interpolate(flat, size=(self.size, self.size), mode="bilinear")
        return out.reshape(*obs.shape[:-2], self.size, self.size).to(obs.dtype)


@pytest.mark.slow
class TestAtariDQN:
    @pytest.fixture(scope="class")
    def limit_max_runs(self):
        prev_val = AtariDQNExperienceReplay._max_runs
        AtariDQNExperienceReplay._max_runs = 3
        yield
        AtariDQNExperienceReplay._max_runs = prev_val

    @pytest.mark.parametrize("dataset_id", ["Asterix/1", "Pong/4"])
    @pytest.mark.parametrize("num_slices,slice_len", [[None, None], [None, 8], [2, None]])
    def test_single_dataset(self, dataset_id, slice_len, num_slices, limit_max_runs, where):
        dataset = AtariDQNExperienceReplay(
            dataset_id, slice_len=slice_len, num_slices=num_slices, **where
        )
        sample = dataset.sample(64)
        for key in (
            ("next", "observation"),
            ("next", "truncated"),
            ("next", "terminated"),
            ("next", "done"),
            ("next", "reward"),
            "observation",
            "action",
            "done",
            "truncated",
            "terminated",
        ):
            assert key in sample.keys(True)
        assert sample.shape == (64,)
        assert sample.get_non_tensor("metadata")["dataset_id"] == dataset_id

    @pytest.mark.parametrize("num_slices,slice_len", [[None, None], [None, 8], [2, None]])
    def test_double_dataset(self, slice_len, num_slices, limit_max_runs, where):
        dataset_pong = AtariDQNExperienceReplay(
            "Pong/4", slice_len=slice_len, num_slices=num_slices, **where
        )
        dataset_asterix = AtariDQNExperienceReplay(
            "Asterix/1", slice_len=slice_len, num_slices=num_slices, **where
        )
        dataset = ReplayBufferEnsemble(
            dataset_pong, dataset_asterix, sample_from_all=True, batch_size=128
        )
        sample = dataset.sample()
        assert sample.shape == (2, 64)
        assert sample[0].get_non_tensor("metadata")["dataset_id"] == "Pong/4"
        assert sample[1].get_non_tensor("metadata")["dataset_id"] == "Asterix/1"

    @pytest.mark.parametrize("dataset_id", ["Pong/4"])
    def test_atari_preproc(self, dataset_id, tmpdir, where):
        dataset = AtariDQNExperienceReplay(
            dataset_id,
            slice_len=None,
            num_slices=8,
            batch_size=64,
            # num_procs=max(0, os.cpu_count() - 4),
            num_procs=0,
            **where,
        )

        t = Compose(
            UnsqueezeTransform(dim=-3, in_keys=["observation", ("next", "observation")]),
            # torchvision's Resize(32, ...) in TorchRL's test (see the module docstring)
            Downsample(32, in_keys=["observation", ("next", "observation")]),
            RenameTransform(in_keys=["action"], out_keys=["other_action"]),
        )

        def preproc(data):
            return t(data)

        new_storage = dataset.preprocess(
            preproc,
            num_workers=max(1, os.cpu_count() - 4),
            num_chunks=1000,
            # mp_start_method="fork",
            pbar=True,
            dest=tmpdir,
            num_frames=100,
        )

        dataset = ReplayBuffer(storage=new_storage, batch_size=32)
        assert len(dataset) == 100
