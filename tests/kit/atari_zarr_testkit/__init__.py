"""Helpers for tests, examples and benchmarks: fixture data and local servers.

Importing this package changes nothing in the process; servers start only when asked.
"""

from atari_zarr_testkit.dqn_replay import (
    DopamineLoggedBuffer,
    FixtureRun,
    Truth,
    craft_index_entry,
    fixture_frame,
    store_files,
    write_episodes_store,
    write_fixture_run,
    write_two_runs,
)
from atari_zarr_testkit.rl_unplugged import RluFixture, RluTruth, write_fixture_rlu
from atari_zarr_testkit.s3 import MotoS3Server

__all__ = [
    "DopamineLoggedBuffer",
    "FixtureRun",
    "MotoS3Server",
    "RluFixture",
    "RluTruth",
    "Truth",
    "craft_index_entry",
    "fixture_frame",
    "store_files",
    "write_episodes_store",
    "write_fixture_rlu",
    "write_fixture_run",
    "write_two_runs",
]
