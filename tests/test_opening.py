"""A store opened for reading, and damage told from a store replaced while it was read."""

from __future__ import annotations

import shutil

import pytest
import zarr

from atari_zarr.errors import (
    StoreChangedError,
    StoreCorruptError,
    StoreFormatError,
    StoreIncompleteError,
    StoreNotFoundError,
)
from atari_zarr.layout import ATTRS_KEY
from atari_zarr.opening import changed_or_damaged, open_store

DAMAGE = (
    "{url}: chunk 3 of array 'observation' (rows 48-63), stored in 'observation/c/0/0/0', "
    "fails its crc32c check. The store is damaged; write it again."
)


def test_open_store_gives_group_metadata_and_one_line_errors(pong_store, tmp_path):
    opened = open_store(pong_store.url)
    assert opened.metadata["game"] == "Pong" and "observation" in opened.group
    with pytest.raises(StoreNotFoundError, match="nothing.zarr does not exist: expected"):
        open_store(str(tmp_path / "nothing.zarr"))
    (tmp_path / "notes").mkdir()  # something there, but no zarr.json
    with pytest.raises(StoreNotFoundError, match="exists but is not a Zarr store.*found none"):
        open_store(str(tmp_path / "notes"))
    for i, text in enumerate(
        [
            '{"zarr_format": 3, "node_type": "group", "attributes": 5}',
            '{"zarr_format": 3, "node_type": "group", "consolidated_metadata": 7}',
        ]
    ):
        bad = tmp_path / f"bad{i}.zarr"
        bad.mkdir()
        (bad / "zarr.json").write_text(text)
        with pytest.raises(StoreFormatError) as info:
            open_store(str(bad))
        message = str(info.value)
        assert "\n" not in message and message.startswith(str(bad))
        assert "not valid Zarr v3 metadata" in message and "convert the source again" in message


def test_an_unfinished_store_is_refused_unless_asked(pong_store_copy):
    url = pong_store_copy.url
    group = zarr.open_group(url, mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])
    meta["complete"] = False
    group.attrs[ATTRS_KEY] = meta
    with pytest.raises(StoreIncompleteError):
        open_store(url)
    assert open_store(url, require_complete=False).metadata["complete"] is False


def test_damage_in_an_unchanged_store_stays_damage(pong_store):
    meta = open_store(pong_store.url).metadata
    err = StoreCorruptError(DAMAGE.format(url=pong_store.url))
    assert changed_or_damaged(err, pong_store.url, None, meta) is err


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("gone", "it is gone"),
        ("unfinished", "it is being written again"),
        ("rewritten", "it was written again since it was opened"),
        ("foreign", "it is no longer an atari_zarr store"),
    ],
)
def test_a_replaced_store_is_changed_not_damaged(pong_store_copy, change, why):
    url = pong_store_copy.url
    meta = open_store(url).metadata
    if change == "gone":
        shutil.rmtree(url)
    else:
        group = zarr.open_group(url, mode="r+")
        now = dict(group.attrs[ATTRS_KEY])
        if change == "unfinished":
            now["complete"] = False
        elif change == "rewritten":
            now["conversion"] = "another-conversion"
        if change == "foreign":
            del group.attrs[ATTRS_KEY]
        else:
            group.attrs[ATTRS_KEY] = now
    err = StoreCorruptError(DAMAGE.format(url=url))
    got = changed_or_damaged(err, url, None, meta)
    assert isinstance(got, StoreChangedError)
    text = str(got)
    assert "\n" not in text and why in text and "damaged" not in text
    assert text.startswith(f"{url} changed while it was being read")
    assert "chunk 3 of array 'observation'" in text and "AtariZarrDataset(" in text


def test_a_chunk_of_zero_rows_in_the_metadata_is_one_line(pong_store, tmp_path):
    """A crafted ``zarr.json`` whose frames' chunks in a shard have 0 rows: zarr's own
    check of the metadata divides by it; the store is refused in one line, never with a
    raw ``ZeroDivisionError``."""
    import json

    copy = tmp_path / "Pong.zarr"
    shutil.copytree(pong_store.url, copy)
    doc = json.loads((copy / "zarr.json").read_text())
    meta = doc["consolidated_metadata"]["metadata"]["observation"]
    config = meta["codecs"][0]["configuration"]
    config["chunk_shape"] = [0, *config["chunk_shape"][1:]]
    (copy / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError) as info:
        open_store(str(copy))
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(copy))
    assert "not valid Zarr v3 metadata" in message and "convert the source again" in message
