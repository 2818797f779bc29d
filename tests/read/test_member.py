"""The members of a dataset: stores of a catalogued root opened on first use, weights
normalised once, identities (read/member.py)."""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from atari_zarr import MultiGameDataset
from atari_zarr.catalog import write_catalog
from atari_zarr.errors import StoreFormatError, StoreNotFoundError
from atari_zarr.layout import ATTRS_KEY
from atari_zarr.read.dataset import collate_batch
from atari_zarr.read.store import StoreReader


@pytest.fixture
def root(pong_store, tmp_path: Path) -> Path:
    """Three copies of the session's Pong store under one root, with a catalog (each
    says it is Pong/1: a store's game and run are its own attributes)."""
    for name in ("Pong/1", "Pong/2", "Breakout/1"):
        shutil.copytree(pong_store.url, tmp_path / f"{name}.zarr")
    write_catalog(str(tmp_path))
    return tmp_path


def _pending(mix: MultiGameDataset) -> list[bool]:
    return [not m.store.opened for m in mix.members]


def test_a_catalogued_root_opens_no_store_until_a_batch_needs_it(root, pong_store) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mix = MultiGameDataset.from_root(str(root))
    assert _pending(mix) == [True, True, True]
    assert mix.games == ["Pong/1"] * 3 and mix.game_names == ["Pong"]
    assert len(mix) == 3 * pong_store.transitions
    n = pong_store.transitions
    batch = mix[np.array([n + 5, n + 7])]  # two rows of Pong/1 only
    assert _pending(mix) == [True, False, True]
    eager = MultiGameDataset([str(root / "Pong/1.zarr")])
    assert torch.equal(batch["observation"], eager[np.array([5, 7])]["observation"])
    assert batch["game_id"].tolist() == [0, 0] and batch["index"].tolist() == [n + 5, n + 7]
    mix.sample(64, generator=torch.Generator().manual_seed(0))
    assert _pending(mix) == [False, False, False]


def test_a_stream_and_windows_open_every_store(root) -> None:
    mix = MultiGameDataset.from_root(str(root))
    next(iter(mix.stream(8)))
    assert _pending(mix) == [False, False, False]
    wins = MultiGameDataset.from_root(str(root)).windows(4)
    assert wins[0].batch_size == torch.Size([4])


def test_a_pending_store_pickles_pending_and_opens_in_the_worker(root, pong_store) -> None:
    mix = MultiGameDataset.from_root(str(root))
    again = pickle.loads(pickle.dumps(mix))
    assert _pending(again) == [True, True, True]
    loader = torch.utils.data.DataLoader(
        mix,
        batch_size=4,
        sampler=mix.sampler(8),
        collate_fn=collate_batch,
        num_workers=1,
        multiprocessing_context="spawn",  # the dataset is pickled into the worker
    )
    assert sum(len(b) for b in loader) == 8
    assert _pending(mix) == [True, True, True]  # the worker opened its own copies


def test_a_store_changed_since_the_catalog_is_read_as_it_is_with_a_warning(root) -> None:
    group = zarr.open_group(str(root / "Pong/1.zarr"), mode="r+")
    group.attrs[ATTRS_KEY] = {**group.attrs[ATTRS_KEY], "note": "edited after indexing"}
    mix = MultiGameDataset.from_root(str(root))
    with pytest.warns(UserWarning, match=r"Pong/1.zarr changed since .*atari-zarr index"):
        got = mix[len(mix) // 2]
    assert got["row"].item() == len(mix) // 2 - len(mix) // 3


def test_a_store_of_another_length_stops_the_read_that_opens_it(root, source_root, pong_run, tmp_path_factory) -> None:
    from atari_zarr import convert

    [other] = convert(str(source_root), str(tmp_path_factory.mktemp("other")), max_episodes=2, progress=False)
    mix = MultiGameDataset.from_root(str(root))
    shutil.rmtree(root / "Pong/1.zarr")
    shutil.copytree(other.url, root / "Pong/1.zarr")
    shutil.rmtree(root / "Pong/2.zarr")
    assert mix[0]["row"].item() == 0  # Breakout/1 is as indexed
    with pytest.warns(UserWarning), pytest.raises(StoreFormatError) as err:
        mix.sample(256, generator=torch.Generator().manual_seed(0))
    text = str(err.value)
    assert "Pong/1.zarr holds" in text and "numbered this dataset's items" in text
    assert f"`atari-zarr index {root}` again" in text and "\n" not in text
    with pytest.raises(StoreNotFoundError, match=r"Pong/2.zarr, listed in its root's catalog.json, is no longer"):
        mix[len(mix) - 1]


def test_a_stream_opens_a_store_when_its_first_unit_is_read(root, pong_store) -> None:
    """The stream's plan takes each store's shards from its zarr.json alone; a store is
    opened when a unit of it is read, and one epoch is still every row once."""
    mix = MultiGameDataset.from_root(str(root))
    ordered = mix.stream(32, shuffle=False, unit_rows=64, units_ahead=1, shuffle_buffer=64)
    assert _pending(mix) == [True, True, True]  # the plan opened nothing
    first = next(iter(ordered))  # units in stored order: the first store's come first
    assert first["index"].max().item() < pong_store.transitions
    assert _pending(mix) == [False, True, True]
    stream = mix.stream(32, seed=3, unit_rows=64)
    seen = torch.cat([b["index"] for b in stream]).tolist()
    assert sorted(seen) == list(range(len(mix)))  # every (store, row) once
    n = pong_store.transitions
    eager = MultiGameDataset([str(root / "Pong/2.zarr")])
    batch = mix[np.array([2 * n + 1, 2 * n + 9])]
    assert torch.equal(batch["observation"], eager[np.array([1, 9])]["observation"])


def test_a_pickled_stream_keeps_its_stores_unopened(root, pong_store) -> None:
    mix = MultiGameDataset.from_root(str(root))
    stream = pickle.loads(pickle.dumps(mix.stream(64, seed=0)))
    assert [s.opened for s in stream.stores] == [False, False, False]
    got = sum(len(b) for b in stream.loader(num_workers=1, multiprocessing_context="spawn"))
    assert got == 3 * pong_store.transitions and _pending(mix) == [True, True, True]


def test_a_store_rechunked_since_the_plan_stops_its_first_read(root) -> None:
    """A store whose frame shards changed after the stream cut its units (its attributes,
    and so its catalog entry, the same) is refused in one line, never read misaligned."""
    mix = MultiGameDataset.from_root(str(root))
    stream = mix.stream(64, seed=0, shuffle=False)
    group = zarr.open_group(str(root / "Breakout/1.zarr"), mode="r+")
    frames = group["observation"][:]
    del group["observation"]
    group.create_array(
        "observation", data=frames, chunks=(16, 84, 84), shards=(2048, 84, 84),
        compressors=[zarr.codecs.BloscCodec(cname="zstd")], dimension_names=("step", "y", "x"),
    )
    zarr.consolidate_metadata(str(root / "Breakout/1.zarr"))
    with pytest.raises(StoreFormatError, match=r"Breakout/1.zarr .*shards .*atari-zarr index") as err:
        next(iter(stream))
    assert "\n" not in str(err.value)


def test_a_stalled_server_fails_a_pending_store_once(pong_store) -> None:
    """A server that stalls before ``stream()`` of a catalogued mixture failed after twice
    the timeout: the look at a pending store's frame shards swallowed the first, and the
    open that followed waited a second. The first timeout is the error, after one request."""
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    from atari_zarr.catalog import content_id
    from atari_zarr.errors import RemoteAccessError
    from atari_zarr.read.options import ReadOptions
    from atari_zarr.read.store import StoreReader

    content = content_id(StoreReader(pong_store.url).metadata)
    entry = {"game": "Pong", "run": "1", "transitions": pong_store.transitions, "content": content}
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket("stalls")
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
        fs.put(pong_store.url, "stalls/Pong/1.zarr", recursive=True)
        url = f"{proxy.endpoint_url}/stalls/Pong/1.zarr"
        pending = StoreReader(url, entry=entry, options=ReadOptions(timeout=1))
        proxy.reset()
        proxy.delay = 30  # the server stalls
        with pytest.raises(RemoteAccessError, match="did not finish within 1 s"):
            pending.frame_rows()
        asked = proxy.requests
        proxy.delay = 0
    assert asked == 1


def test_members_normalise_the_weights_once_and_an_unopened_store_has_an_identity(
    root, pong_store
) -> None:
    """The weights asked for become each member's probability in one place; a store
    known by its catalog entry tells its identity (name, content, rows, shards) from
    its entry and its zarr.json, and stays unopened."""
    from atari_zarr.read.items import Items
    from atari_zarr.read.member import members

    mix = MultiGameDataset.from_root(str(root), weights=[2, 1, 1])
    assert [m.weight for m in mix.members] == [0.5, 0.25, 0.25]
    assert mix.weights.tolist() == [0.5, 0.25, 0.25]
    ids = [m.identity() for m in mix.members]
    assert _pending(mix) == [True, True, True]  # told without opening a store
    opened = StoreReader(str(root / "Pong/2.zarr"))
    assert ids[1] == {
        "name": "Pong/1",  # the store's own attributes name it
        "content": opened.content,
        "rows": len(opened),
        "shard_rows": opened.frame_rows()[1],
    }
    empty = members([opened], [Items.transitions(0)])
    assert empty[0].weight == 0.0  # nothing to draw: sampling says so


def test_a_store_opened_from_its_entry_pickles_and_reads_in_the_worker(root) -> None:
    """A store of a catalogued root that a batch opened pickles as the store it is: the
    unpickled copy opens it and checks it is the same (a spawned DataLoader worker)."""
    mix = MultiGameDataset.from_root(str(root))
    n = len(mix.members[0].store)
    want = mix[np.array([1, n + 2])]  # opens the first two stores
    assert _pending(mix) == [False, False, True]
    again = pickle.loads(pickle.dumps(mix))
    got = again[np.array([1, n + 2])]
    assert torch.equal(got["observation"], want["observation"])
    assert _pending(again)[2]  # the one never opened stays so
