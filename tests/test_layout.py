"""The store layout: names, dtypes, dimension names, codecs, metadata."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import zarr

from atari_zarr.errors import InvalidNameError, StoreCorruptError, StoreIncompleteError
from atari_zarr.layout import (
    ARRAYS,
    ATTRS_KEY,
    FORMAT_VERSION,
    OBSERVATION,
    REWARD,
    create_array,
    read_metadata,
    store_path,
    validate_name,
)


@pytest.fixture
def store_url(pong_store_copy):
    """A private copy of the session's Pong/1 store: one test below damages it."""
    return pong_store_copy.url


def test_arrays_dtypes_and_dimension_names(store_url):
    g = zarr.open_group(store_url, mode="r")
    n = g[OBSERVATION].shape[0]
    for name, spec in ARRAYS.items():
        arr = g[name]
        assert arr.shape == (n, *spec.row_shape)
        assert arr.dtype == spec.dtype
        assert arr.metadata.dimension_names == spec.dims
        assert arr.metadata.zarr_format == 3
    assert ARRAYS[OBSERVATION].dims == ("transition", "y", "x")


def test_observation_codecs(store_url):
    meta = json.loads((Path(store_url) / OBSERVATION / "zarr.json").read_text())
    [sharding] = meta["codecs"]
    assert sharding["name"] == "sharding_indexed"
    conf = sharding["configuration"]
    assert conf["index_location"] == "start"
    assert conf["chunk_shape"] == [16, 84, 84]
    blosc = next(c for c in conf["codecs"] if c["name"] == "blosc")
    assert blosc["configuration"]["cname"] == "zstd"
    assert blosc["configuration"]["shuffle"] == "noshuffle"
    assert [c["name"] for c in conf["codecs"]][-1] == "crc32c"
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [4096, 84, 84]


def test_group_attributes_and_consolidation(store_url):
    raw = json.loads((Path(store_url) / "zarr.json").read_text())
    assert raw["consolidated_metadata"]["metadata"]  # one request opens everything
    meta = raw["attributes"][ATTRS_KEY]
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["complete"] is True
    assert (meta["game"], meta["run"]) == ("Pong", "1")
    assert {"capacity", "checkpoints", "gaps", "dropped_rows"} <= set(meta["conversion"])
    assert {"length", "return", "terminated", "first_step"} == set(meta["episodes"])
    assert meta["counts"]["transitions"] == sum(meta["episodes"]["length"])


def test_store_path_and_names():
    assert store_path("/data/out/", "Pong", "1") == "/data/out/Pong/1.zarr"
    assert validate_name("SpaceInvaders", "game") == "SpaceInvaders"
    for bad in ("../x", "x/..", "a\\b", ".hidden", ""):
        with pytest.raises(InvalidNameError):
            validate_name(bad, "game")


# -- unfinished versus damaged (issue 11, defect 2) ---------------------------------------

COMMAND = "atari-zarr convert /data/dqn /data/stores --games Pong"


def killed_while_creating_arrays(path, created: int) -> zarr.Group:
    """A store as `create_store` leaves it when killed after ``created`` arrays."""
    group = zarr.open_group(
        str(path),
        mode="w",
        attributes={
            ATTRS_KEY: {
                "kind": "dqn-replay",
                "command": COMMAND,
                "format_version": FORMAT_VERSION,
                "complete": False,
            }
        },
    )
    for name in list(ARRAYS)[:created]:
        create_array(group, name, 100)
    return group


@pytest.mark.parametrize("created", [0, 3])
def test_a_store_killed_while_creating_arrays_is_unfinished(tmp_path, created):
    group = killed_while_creating_arrays(tmp_path / "Pong" / "1.zarr", created)
    for require_complete in (True, False):  # the reader, and `info`/`verify`
        with pytest.raises(StoreIncompleteError) as caught:
            read_metadata(group, "DEST/Pong/1.zarr", require_complete=require_complete)
        message = str(caught.value)
        assert "unfinished" in message and f"running {COMMAND} again" in message
        assert "damaged" not in message.replace("not a damaged one", "")
        assert list(ARRAYS)[created] in message  # which arrays are still missing


def test_a_complete_store_that_lost_an_array_is_damaged(store_url):
    shutil.rmtree(Path(store_url) / REWARD)
    group = zarr.open_group(store_url, mode="r", use_consolidated=False)
    for require_complete in (True, False):
        with pytest.raises(
            StoreCorruptError,
            match=r"marked complete but lacks the arrays \['next/reward'\].*damaged",
        ):
            read_metadata(group, store_url, require_complete=require_complete)


def _arrays(group: zarr.Group, prefix: str = ""):
    """Every array of ``group`` and its subgroups, by path."""
    for name, arr in group.arrays():
        yield prefix + name, arr
    for name, sub in group.groups():
        yield from _arrays(sub, f"{prefix}{name}/")


@pytest.fixture(params=["dqn-replay", "rl-unplugged", "collected"])
def any_store(request, pong_source, tmp_path):
    """A store of each writer: a DQN Replay run with both derived arrays, RL Unplugged
    shards (kept final frames, unclipped rewards), and play recorded by the collector."""
    from atari_zarr_testkit.rl_unplugged import write_fixture_rlu

    from atari_zarr import convert
    from atari_zarr.record.collector import collect
    from atari_zarr.ale import make_dqn_env

    if request.param == "dqn-replay":
        [store] = convert(
            str(Path(pong_source.url).parents[1]),
            str(tmp_path / "out"),
            return_to_go=True,
            full_action_space=True,
            progress=False,
        )
        return Path(store.url)
    if request.param == "rl-unplugged":
        rlu = write_fixture_rlu(str(tmp_path / "rlu"), num_shards=3, present=(0, 2))
        [store] = convert(rlu.root, str(tmp_path / "out"), progress=False)
        return Path(store.url)
    dest = tmp_path / "pong.zarr"
    collect(make_dqn_env("Pong", max_episode_steps=120), str(dest), steps=300, seed=3)
    return dest


def test_tensorstore_reads_every_array_as_zarr_does(any_store):
    """tensorstore, a reader that shares no code with zarr-python or this package, opens
    every array of a store by its own zarr.json and reads the same values, shapes, dtypes
    and dimension names."""
    import numpy as np
    import tensorstore as ts

    seen = set()
    for path, arr in _arrays(zarr.open_group(str(any_store), mode="r")):
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(any_store / path)}}
        other = ts.open(spec, read=True).result()
        assert other.shape == arr.shape, path
        assert other.dtype.numpy_dtype == arr.dtype, path
        assert tuple(other.domain.labels) == tuple(arr.metadata.dimension_names or ()), path
        np.testing.assert_array_equal(other.read().result(), arr[...], err_msg=path)
        seen.add(path)
    assert set(ARRAYS) <= seen  # every array the layout requires, at least
