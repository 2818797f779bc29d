"""Every dataset and stream object crosses into spawned DataLoader workers (the default
start method on macOS and Windows), before and after its first read; a loader broken out
of ends."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from atari_zarr import AtariZarrDataset, MultiGameDataset
from atari_zarr.compat.decision_transformer import StateActionReturnDataset, create_dataset

SPAWN_SCRIPT = """
import sys, warnings
warnings.simplefilter("ignore")
import torch
from atari_zarr import AtariZarrDataset, MultiGameDataset
from atari_zarr.compat.decision_transformer import StateActionReturnDataset, create_dataset
from atari_zarr.read.dataset import collate_batch


def first(items):
    return items[0]


if __name__ == "__main__":
    url = sys.argv[1]
    ds = AtariZarrDataset(url, frame_stack=4)
    mix = MultiGameDataset([url])
    data = create_dataset(4, 120, trajectories_per_buffer=2, store=url)
    # (the dataset and the multi-game dataset have spawn tests of their own:
    # tests/read/test_dataloader.py, tests/read/test_mixing.py)
    maps = {
        "windows": (ds.windows(5), collate_batch),
        "decision-transformer": (StateActionReturnDataset(data, 15), None),
    }
    for name, (dataset, collate) in maps.items():
        dataset[0]  # read once before it crosses
        kwargs = {"collate_fn": collate} if collate else {}
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=4, num_workers=1, multiprocessing_context="spawn", **kwargs
        )
        next(iter(loader))
        print(name, "ok", flush=True)
    streams = {
        "windows-stream": ds.windows(5).stream(8, unit_rows=64),
        "multi-game-windows-stream": mix.windows(5).stream(8, unit_rows=64),
    }
    for name, stream in streams.items():
        for _ in stream.loader(num_workers=1, multiprocessing_context="spawn"):
            break  # broken out of: the worker must end without aborting
        print(name, "ok", flush=True)
"""


def test_every_object_pickles_before_and_after_a_read(pong_store):
    ds = AtariZarrDataset(pong_store.url, frame_stack=4)
    data = create_dataset(4, 120, trajectories_per_buffer=2, store=pong_store.url)
    objects = [
        ds,
        ds.windows(5),
        MultiGameDataset([pong_store.url]),
        data,
        StateActionReturnDataset(data, 15),
        data.store,
    ]
    for obj in objects:
        pickle.loads(pickle.dumps(obj))
        if hasattr(obj, "__getitem__") and not hasattr(obj, "metadata"):
            obj[0]
        clone = pickle.loads(pickle.dumps(obj))
        if hasattr(clone, "__getitem__") and not hasattr(clone, "metadata"):
            clone[0]


@pytest.mark.slow
def test_spawned_workers_read_every_object_and_end_quietly(pong_store, tmp_path):
    script = tmp_path / "spawn_loaders.py"
    script.write_text(SPAWN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), pong_store.url], capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [
        word
        for name in (
            "windows", "decision-transformer", "windows-stream", "multi-game-windows-stream"
        )
        for word in (name, "ok")
    ]
    # before: a worker broken out of a windows stream was aborted as it ended (its queue's
    # feeder thread stopped inside C++), about one run in four
    assert "terminate called" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_store_replaced_before_a_worker_opens_it_is_refused_there(tmp_path) -> None:
    """A store written again after the parent opened it: spawned workers unpickled the
    dataset and read the new store while the parent read the old one, with no word in
    either process. The pickled dataset carries which store it is; a worker that finds
    another refuses in one line."""
    import pickle
    import shutil

    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import AtariZarrDataset, convert
    from atari_zarr.errors import StoreChangedError

    for name, seed in (("a", 1), ("b", 2)):
        write_fixture_run(str(tmp_path / name), "Pong", "1", capacity=64, steps=300, seed=seed)
    [store] = convert(str(tmp_path / "a"), str(tmp_path / "out"), progress=False)
    ds = AtariZarrDataset(store.url)
    handed = pickle.dumps(ds)
    assert len(pickle.loads(handed)) == len(ds)  # the same store: opened again, silently
    shutil.rmtree(store.url)
    convert(str(tmp_path / "b"), str(tmp_path / "out"), progress=False)
    with pytest.raises(StoreChangedError) as info:
        pickle.loads(handed)
    text = str(info.value)
    assert "\n" not in text and "was replaced since this dataset was opened" in text
    assert "Open the dataset again" in text
