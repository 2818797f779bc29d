"""Helpers for tests, examples and benchmarks: fixture data and local servers.

Importing this package changes nothing in the process; servers start only when asked.
"""

from atari_zarr.testing.dqn_replay import (
    DopamineLoggedBuffer,
    FixtureRun,
    Truth,
    fixture_frame,
    store_files,
    write_fixture_run,
)

__all__ = [
    "DopamineLoggedBuffer",
    "FixtureRun",
    "Truth",
    "fixture_frame",
    "store_files",
    "write_fixture_run",
]
