"""GroupRows: the rows of a group's arrays, equal to zarr-python's, and a missing array named."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec

from atari_zarr.errors import StoreFormatError
from atari_zarr.read.arrays import GroupRows


def _group(tmp_path) -> zarr.Group:
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    rng = np.random.default_rng(0)
    pixels = group.create_array(
        "pixels", shape=(300, 5, 7), chunks=(16, 5, 7), shards=(64, 5, 7), dtype="uint8",
        compressors=[BloscCodec(cname="zstd", clevel=3)],
    )
    pixels[:] = rng.integers(0, 255, size=(300, 5, 7), dtype=np.uint8)
    nested = group.create_array("next/value", shape=(300,), chunks=(32,), dtype="float32")
    nested[:] = rng.standard_normal(300).astype(np.float32)
    return group


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_rows_in_any_order_equal_zarr_pythons(tmp_path, cache_bytes: int) -> None:
    group = _group(tmp_path)
    reader = GroupRows(
        zarr.open_group(str(tmp_path / "g.zarr"), mode="r"),
        ["pixels", "next/value"],
        where="g.zarr",
        cache_bytes=cache_bytes,
    )
    assert reader.paths == ["pixels", "next/value"]
    rows = np.array([299, 0, 0, 17, 64, 63, 150, 299])
    for _ in range(2):  # the second time from the cache, when there is one
        got = reader.read(rows)
        for path in ("pixels", "next/value"):
            want = group[path][:][rows]
            assert got[path].dtype == want.dtype
            np.testing.assert_array_equal(got[path], want)


def test_a_path_the_group_lacks_is_one_line_naming_it(tmp_path) -> None:
    _group(tmp_path)
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="r")
    with pytest.raises(StoreFormatError) as info:
        GroupRows(group, ["pixels", "next/missing"], where="g.zarr")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("g.zarr/next/missing is missing: expected an array at that path")
