"""The store layout: names, dtypes, dimension names, codecs, metadata."""

from __future__ import annotations

import json

import pytest
import zarr

from atari_zarr import convert
from atari_zarr.errors import InvalidNameError
from atari_zarr.layout import ARRAYS, ATTRS_KEY, FORMAT_VERSION, OBSERVATION, store_path, validate_name


@pytest.fixture
def store_url(pong_run, source_root, dest_root):
    return convert(str(source_root), str(dest_root), progress=False)[0].url


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
    meta = json.loads((__import__("pathlib").Path(store_url) / OBSERVATION / "zarr.json").read_text())
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
    raw = json.loads((__import__("pathlib").Path(store_url) / "zarr.json").read_text())
    assert raw["consolidated_metadata"]["metadata"]  # one request opens everything
    meta = raw["attributes"][ATTRS_KEY]
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["complete"] is True
    assert (meta["game"], meta["run"]) == ("Pong", "1")
    assert {"capacity", "checkpoints", "gaps", "dropped_rows"} <= set(meta["conversion"])
    assert {"length", "return", "terminated"} == set(meta["episodes"])
    assert meta["counts"]["transitions"] == sum(meta["episodes"]["length"])


def test_store_path_and_names():
    assert store_path("/data/out/", "Pong", "1") == "/data/out/Pong/1.zarr"
    assert validate_name("SpaceInvaders", "game") == "SpaceInvaders"
    for bad in ("../x", "x/..", "a\\b", ".hidden", ""):
        with pytest.raises(InvalidNameError):
            validate_name(bad, "game")
