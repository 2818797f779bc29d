"""Shared fixtures: fixture runs written by atari_zarr.testing."""

from __future__ import annotations

import pytest

from atari_zarr.testing import FixtureRun, write_fixture_run


@pytest.fixture
def source_root(tmp_path):
    root = tmp_path / "dqn"
    root.mkdir()
    return root


@pytest.fixture
def dest_root(tmp_path):
    return tmp_path / "stores"


@pytest.fixture
def pong_run(source_root) -> FixtureRun:
    """A run with short episodes: several wraps, missed logs and a final partial checkpoint."""
    return write_fixture_run(
        str(source_root), "Pong", "1", capacity=64, steps=700, seed=0, max_episode_length=25
    )
