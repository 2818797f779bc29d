"""Test harness settings for the whole tree: the tests and the examples in docstrings.

The examples in docstrings share one small converted store instead of each
converting its own: they find ``source_root`` (a DQN Replay root holding
``Pong/1/replay_logs``), ``store_url`` (that run converted) and ``dest_root`` (the
directory holding ``Pong/1.zarr``) in their namespace.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem

# a run that stops early (an INTERNALERROR) says how many tests never ran, and fails
pytest_plugins = ["tests.harness"]

# gcsfs probes a gRPC control plane per bucket unless this is false; the emulator the
# tests use has none, and every probe would wait about 60 s. Read once when gcsfs is
# imported, so it is set here, before any test imports it. Tests only: the package
# itself never changes the environment.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Tests talk only to loopback: a gs:// URL that no test points at a server of its own
# (the drop-ins download from gs://rl_unplugged by default) goes to a closed port on
# 127.0.0.1, never to Cloud Storage. Tests of pulls point this variable, the one gcsfs
# honours for emulators, at their fake-gcs-server.
os.environ["STORAGE_EMULATOR_HOST"] = "http://127.0.0.1:9"


@pytest.fixture(scope="session")
def doctest_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One fixture run and its store, made once for every docstring example."""
    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert

    source = tmp_path_factory.mktemp("doctest-source")
    dest = tmp_path_factory.mktemp("doctest-stores")
    write_fixture_run(str(source), "Pong", "1", capacity=64, steps=300, seed=0)
    [store] = convert(str(source), str(dest), progress=False, scheduler="synchronous")
    return {"source_root": str(source), "dest_root": str(dest), "store_url": store.url}


@pytest.fixture(autouse=True)
def _doctest_namespace(request: pytest.FixtureRequest) -> None:
    if isinstance(request.node, DoctestItem):
        namespace = request.getfixturevalue("doctest_namespace")
        namespace.update(request.getfixturevalue("doctest_store"))


#: The files that take longest, in the order they start. ``scripts/test.sh`` runs the suite
#: on two pytest-xdist workers, a file to a worker, handed out in collection order: a long
#: file collected last would leave one worker running it alone at the end.
LONGEST_FIRST = (
    "tests/test_site.py",
    "tests/compat/test_d3rlpy.py",
    "tests/test_wheel.py",
    "tests/read/test_mixture.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the files of ``LONGEST_FIRST`` to the front, each file's tests in their order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = Path(__file__).parent

    def place(item: pytest.Item) -> int:
        if not item.path.is_relative_to(root):  # a file outside the repository: in its turn
            return len(rank)
        return rank.get(item.path.relative_to(root).as_posix(), len(rank))

    items.sort(key=place)
