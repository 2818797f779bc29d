"""Summaries of stores: ``open_store_group`` errors and the ``ls`` table."""

from __future__ import annotations

from pathlib import Path

import pytest

from atari_zarr.errors import AtariZarrError, StoreFormatError, StoreNotFoundError
from atari_zarr.info import format_store_list, open_store_group


def test_open_store_group_errors_are_ours(tmp_path: Path) -> None:
    missing = tmp_path / "Pong" / "1.zarr"
    with pytest.raises(StoreNotFoundError, match=r"does not exist.*atari-zarr ls") as info:
        open_store_group(str(missing))
    # one `except AtariZarrError` in the CLI handles it; callers catching the built-in too
    assert isinstance(info.value, AtariZarrError) and isinstance(info.value, FileNotFoundError)
    (tmp_path / "notes.zarr").mkdir()
    with pytest.raises(StoreFormatError, match="is not a Zarr store"):
        open_store_group(str(tmp_path / "notes.zarr"))


def test_empty_listing() -> None:
    assert format_store_list([]) == "no stores found"
