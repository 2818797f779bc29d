"""AtariZarrDataset: TED layout, indexing, next observations, refusal of incomplete stores."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import (
    StoreCorruptError,
    StoreFormatError,
    StoreIncompleteError,
    StoreNotFoundError,
)
from atari_zarr.layout import (
    ACTION,
    ARRAYS,
    ATTRS_KEY,
    EPISODE,
    OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
    create_array,
)


@pytest.fixture
def converted(pong_store_copy, pong_truth):
    """This test's own copy of the session's Pong/1 store (free to damage), and its truth."""
    return pong_store_copy, pong_truth


@pytest.fixture
def converted_here(pong_run, source_root, dest_root):
    """A conversion of this test's own: its recorded command converts ``source_root`` again."""
    [store] = convert(str(source_root), str(dest_root), progress=False)
    return store, pong_run.truth()


def test_ted_layout(converted):
    store, _ = converted
    ds = AtariZarrDataset(store.url)
    b = ds[np.arange(5)]
    assert b.batch_size == torch.Size([5])
    expected = {
        "observation": ((5, 84, 84), torch.uint8),
        "action": ((5,), torch.int64),
        "episode": ((5,), torch.int64),
        "index": ((5,), torch.int64),
        "done": ((5, 1), torch.bool),
        "terminated": ((5, 1), torch.bool),
        "truncated": ((5, 1), torch.bool),
        ("next", "observation"): ((5, 84, 84), torch.uint8),
        ("next", "reward"): ((5, 1), torch.float32),
        ("next", "terminated"): ((5, 1), torch.bool),
        ("next", "truncated"): ((5, 1), torch.bool),
        ("next", "done"): ((5, 1), torch.bool),
    }
    for key, (shape, dtype) in expected.items():
        assert b[key].shape == shape, key
        assert b[key].dtype == dtype, key
    assert not b["done"].any() and not b["terminated"].any() and not b["truncated"].any()


def test_every_transition_equals_truth(converted):
    store, truth = converted
    ds = AtariZarrDataset(store.url)
    assert len(ds) == len(truth)
    b = ds[torch.arange(len(ds))]
    np.testing.assert_array_equal(b["observation"].numpy(), truth.observation)
    np.testing.assert_array_equal(b["next", "observation"].numpy(), truth.next_observation)
    np.testing.assert_array_equal(b["action"].numpy(), truth.action)
    np.testing.assert_array_equal(b["next", "reward"].numpy()[:, 0], truth.reward)
    np.testing.assert_array_equal(b["next", "terminated"].numpy()[:, 0], truth.terminated)
    np.testing.assert_array_equal(b["next", "truncated"].numpy()[:, 0], truth.truncated)
    np.testing.assert_array_equal(
        b["next", "done"].numpy()[:, 0], truth.terminated | truth.truncated
    )
    np.testing.assert_array_equal(b["episode"].numpy(), truth.episode)
    np.testing.assert_array_equal(b["index"].numpy(), np.arange(len(ds)))


def test_raw_arrays_line_up_with_reader(converted):
    store, _ = converted
    ds = AtariZarrDataset(store.url)
    g = zarr.open_group(store.url, mode="r")
    rows = np.array([0, 7, 100, len(ds) - 1, 7])
    b = ds[rows]
    np.testing.assert_array_equal(g[OBSERVATION].oindex[rows], b["observation"].numpy())
    np.testing.assert_array_equal(g[ACTION].oindex[rows], b["action"].numpy())
    np.testing.assert_array_equal(g[REWARD].oindex[rows], b["next", "reward"].numpy()[:, 0])
    np.testing.assert_array_equal(g[EPISODE].oindex[rows], b["episode"].numpy())
    done = g[TERMINATED][:] | g[TRUNCATED][:]
    for j, r in enumerate(rows):
        expect = np.zeros((84, 84), np.uint8) if done[r] else g[OBSERVATION][r + 1]
        np.testing.assert_array_equal(b["next", "observation"][j].numpy(), expect)
        if not done[r]:
            assert g[EPISODE][r + 1] == g[EPISODE][r]


def test_index_kinds(converted):
    store, truth = converted
    ds = AtariZarrDataset(store.url)
    one = ds[3]
    assert one.batch_size == torch.Size([])
    assert one["observation"].shape == (84, 84)
    assert one["next", "reward"].shape == (1,)
    np.testing.assert_array_equal(one["observation"].numpy(), truth.observation[3])
    last = ds[-1]
    assert int(last["index"]) == len(ds) - 1
    sl = ds[10:20:3]
    assert sl["index"].tolist() == [10, 13, 16, 19]
    assert ds[[4, 4, 2]]["index"].tolist() == [4, 4, 2]
    assert ds[torch.tensor([1, 2])]["index"].tolist() == [1, 2]
    assert ds[np.int64(5)]["index"].item() == 5
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    with pytest.raises(TypeError, match="indices must be integers"):
        ds[np.array([0.5])]


def test_sample_is_reproducible(converted):
    store, _ = converted
    ds = AtariZarrDataset(store.url)
    a = ds.sample(16, generator=torch.Generator().manual_seed(1))
    b = ds.sample(16, generator=torch.Generator().manual_seed(1))
    assert a["index"].tolist() == b["index"].tolist()
    assert a.batch_size == torch.Size([16])
    assert (a["index"] < len(ds)).all()


def test_pickle_reopens(converted):
    store, _ = converted
    ds = AtariZarrDataset(store.url)
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == len(ds)
    assert torch.equal(clone[5]["observation"], ds[5]["observation"])


def test_incomplete_store_is_refused(converted):
    store, _ = converted
    g = zarr.open_group(store.url, mode="r+")
    meta = dict(g.attrs[ATTRS_KEY])
    meta["complete"] = False
    g.attrs[ATTRS_KEY] = meta
    with pytest.raises(
        StoreIncompleteError, match=r"is incomplete.*Finish it by running atari-zarr convert"
    ):
        AtariZarrDataset(store.url)


def test_not_a_store(tmp_path):
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w")
    with pytest.raises(StoreFormatError, match="not an atari_zarr store"):
        AtariZarrDataset(str(tmp_path / "other.zarr"))
    with pytest.raises(StoreNotFoundError, match="missing.zarr does not exist"):
        AtariZarrDataset(str(tmp_path / "missing.zarr"))


def test_newer_format_is_refused(converted):
    store, _ = converted
    g = zarr.open_group(store.url, mode="r+")
    meta = dict(g.attrs[ATTRS_KEY])
    meta["format_version"] = 99
    g.attrs[ATTRS_KEY] = meta
    with pytest.raises(StoreFormatError, match=r"format version 99.*Upgrade atari_zarr"):
        AtariZarrDataset(store.url)


def test_conversion_killed_while_creating_arrays_is_unfinished(
    converted_here, source_root, dest_root
):
    """Such a store names the command that finishes it, never "damaged"."""
    store, truth = converted_here
    attrs = dict(zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY])
    command = attrs["command"]
    assert command.startswith("atari-zarr convert ")
    # what convert leaves when killed inside create_store: the group's attributes
    # (complete: False), then the first arrays only
    shutil.rmtree(store.url)
    group = zarr.open_group(
        store.url, mode="w", attributes={ATTRS_KEY: {**attrs, "complete": False}}
    )
    for name in list(ARRAYS)[:2]:
        create_array(group, name, len(truth))
    with pytest.raises(StoreIncompleteError) as caught:
        AtariZarrDataset(store.url)
    message = str(caught.value)
    assert "unfinished" in message and f"Finish it by running {command} again" in message
    assert "damaged;" not in message and "convert it again with --overwrite" not in message
    # and running that command again does finish it
    convert(str(source_root), str(dest_root), progress=False)
    assert len(AtariZarrDataset(store.url)) == len(truth)


def test_complete_store_that_lost_an_array_is_damaged(converted):
    store, _ = converted
    shutil.rmtree(Path(store.url) / TRUNCATED)
    zarr.consolidate_metadata(store.url)  # the group no longer lists the array
    with pytest.raises(StoreCorruptError, match=r"marked complete but lacks.*damaged"):
        AtariZarrDataset(store.url)


def test_damaged_chunk_names_the_command_that_rewrites_the_store(converted_here, tmp_path):
    """In place: the store's own command, from scratch; a copy elsewhere: copy it again
    (the command would rewrite the original, not this copy)."""
    store, _ = converted_here
    copy = tmp_path / "elsewhere" / "Pong" / "1.zarr"
    shutil.copytree(store.url, copy)
    shard = copy / OBSERVATION / "c" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    ds = AtariZarrDataset(str(copy))
    with pytest.raises(StoreCorruptError, match="crc32c") as caught:
        ds[np.arange(len(ds))]
    assert "damaged; copy the store again from where it was written" in str(caught.value)
    command = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]["command"]
    shard = Path(store.url) / OBSERVATION / "c" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0xFF  # inside the last chunk of the shard
    shard.write_bytes(bytes(raw))
    ds = AtariZarrDataset(store.url)
    with pytest.raises(StoreCorruptError, match="crc32c") as caught:
        ds[np.arange(len(ds))]
    assert f"damaged; write it again ({command} --overwrite)" in str(caught.value)


# --------------------------------------------------------------------------- #
# episodes
# --------------------------------------------------------------------------- #


def test_episodes_equal_the_truth(converted):
    store, truth = converted
    ds = AtariZarrDataset(store.url, frame_stack=2)
    table = ds.episode_table
    starts = np.flatnonzero(np.r_[True, truth.episode[1:] != truth.episode[:-1]])
    lengths = np.diff(np.r_[starts, len(truth)])
    assert table["first_row"].tolist() == starts.tolist()
    assert table["length"].tolist() == lengths.tolist()
    ends = starts + lengths - 1
    assert table["terminated"].tolist() == truth.terminated[ends].tolist()
    np.testing.assert_allclose(table["return"], np.add.reduceat(truth.reward, starts))
    # checkpoints: every episode's first row lies in the checkpoint named
    parts = ds.metadata["conversion"]["checkpoints"]
    for first, ckpt in zip(table["first_row"], table["checkpoint"], strict=True):
        part = next(p for p in parts if p["suffix"] == ckpt)
        assert part["first_transition"] <= first < part["first_transition"] + part["transitions"]
    for i in (0, 5, -1):
        ep = ds.episode(i)
        rows = np.arange(starts[i], starts[i] + lengths[i])
        assert ep.batch_size == (lengths[i],)
        assert ep["index"].tolist() == rows.tolist()
        np.testing.assert_array_equal(ep["observation"][:, -1].numpy(), truth.observation[rows])
        assert int(ep["next", "done"].sum()) == 1 and bool(ep["next", "done"][-1])


def test_iterating_episodes_decodes_each_chunk_once(converted):
    store, truth = converted
    ds = AtariZarrDataset(store.url)
    frames = ds._store.frames
    total = sum(len(ep) for ep in ds.iter_episodes())
    assert total == len(truth)
    chunks = -(-len(truth) // frames.grid.chunk_rows)
    assert frames.stats["decoded"] == chunks


def test_bad_episode_numbers(converted):
    store, _ = converted
    ds = AtariZarrDataset(store.url)
    n = ds.num_episodes
    with pytest.raises(
        IndexError, match=rf"episode {n} is out of range .* holds {n} episodes \(0 to {n - 1}\)"
    ):
        ds.episode(n)
    with pytest.raises(TypeError, match="an episode number must be an int"):
        ds.episode(1.5)


def test_reader_inputs_are_refused_in_one_line(pong_store):
    """Each of these was rounded, accepted or failed with another library's error."""
    from atari_zarr import ReadOptions
    from atari_zarr.errors import InvalidArgumentError

    ds = AtariZarrDataset(pong_store.url)
    with pytest.raises(TypeError, match="an episode number must be an int"):
        next(ds.iter_episodes([1.5]))  # as episode(1.5): never rounded to 1
    with pytest.raises(InvalidArgumentError, match="episodes must be None"):
        next(ds.iter_episodes("all"))
    assert [len(e) for e in ds.iter_episodes(np.array([0, 1]))] == [
        len(ds.episode(0)),
        len(ds.episode(1)),
    ]
    as_dict = AtariZarrDataset(pong_store.url, options={"prefetch": 2})
    assert as_dict.options.prefetch == 2
    with pytest.raises(InvalidArgumentError, match="no field 'prefetc'"):
        AtariZarrDataset(pong_store.url, options={"prefetc": 2})
    with pytest.raises(InvalidArgumentError, match="must be ReadOptions"):
        AtariZarrDataset(pong_store.url, options=[("prefetch", 2)])
    for bad in (-1, float("nan"), "soon", True):
        with pytest.raises(InvalidArgumentError, match="expected a number of seconds"):
            ReadOptions(timeout=bad)
    assert ReadOptions(timeout=0).timeout is None and ReadOptions(timeout=None).timeout is None
    with pytest.raises(InvalidArgumentError, match="GiB of frames") as err:
        ds.sample(10**12)
    assert "\n" not in str(err.value)


def test_a_directory_where_a_file_belongs_is_called_a_directory(pong_store_copy, tmp_path):
    """Not a "special file (FIFO ...)": a directory in place of a shard object, or of a
    store's zarr.json."""
    shard = Path(pong_store_copy.url) / OBSERVATION / "c" / "0" / "0" / "0"
    shard.unlink()
    shard.mkdir()
    with pytest.raises(StoreFormatError) as err:
        AtariZarrDataset(pong_store_copy.url)[0]
    assert f"{shard} is a directory; expected a regular file" in str(err.value)
    plain = tmp_path / "plain"
    (plain / "zarr.json").mkdir(parents=True)
    with pytest.raises(StoreFormatError) as err:
        AtariZarrDataset(str(plain))
    assert "zarr.json is a directory" in str(err.value) and "FIFO" not in str(err.value)


def test_closing_a_dataset_stops_its_reading_threads(pong_store) -> None:
    """``with AtariZarrDataset(...)`` (or ``close()``) stops the threads that decode and
    fetch for its stores; the dataset reads again, starting anew, when asked."""
    import threading

    from atari_zarr import ReadOptions

    def ours() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("atari_zarr-read")}

    before = ours()
    with AtariZarrDataset(pong_store.url, options=ReadOptions(threads=2)) as ds:
        ds[np.arange(len(ds))]  # every chunk: the compiled loop, a share on each thread
        assert ours() - before
        ds.read_frames(np.arange(64))
        ds.read_frames(np.arange(64, 128))  # a sequential read: the next chunks decoded ahead
        assert ours() - before
    assert ours() <= before
    assert len(ds[np.arange(8)]) == 8
