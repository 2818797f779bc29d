"""Shared fixtures: fixture runs written by atari_zarr_testkit, and their stores.

The Pong/1 fixture run is written once per session (``pong_source``) and converted
once per session (``pong_store``); tests that only read share them. A test that
changes the run or the store takes a private copy instead: ``pong_run`` (the run,
copied under ``source_root``) or ``pong_store_copy`` (the store, copied under
``dest_root``). Copying costs milliseconds; converting costs most of a second.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from atari_zarr_testkit import FixtureRun, Truth, write_fixture_run
from hypothesis import settings

from atari_zarr import ConvertedStore, convert

# Property tests draw the same examples on every run and keep no database of past
# failures, so the suite gives the same result every time. HYPOTHESIS_PROFILE=explore
# draws new examples (and remembers failures in .hypothesis/) when looking for bugs.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def pytest_configure(config: pytest.Config) -> None:
    """The suite's home (pulled stores, objects read from the Hub) is its own temporary
    directory, never the user's ``~/.cache/atari_zarr``; a test that needs another sets
    ``ATARI_ZARR_HOME`` itself."""
    if not os.environ.get("ATARI_ZARR_HOME", "").strip():
        import tempfile

        home = tempfile.mkdtemp(prefix="atari-zarr-tests-home-")
        os.environ["ATARI_ZARR_HOME"] = home
        config.stash[_HOME] = home


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


_HOME = pytest.StashKey[str]()


#: The Pong/1 fixture run: short episodes, several wraps, missed logs and a final
#: partial checkpoint.
PONG_RUN = {"capacity": 64, "steps": 700, "seed": 0, "max_episode_length": 25}


@pytest.fixture
def source_root(tmp_path: Path) -> Path:
    """An empty directory of this test, for DQN Replay runs (``<root>/<game>/<run>``)."""
    root = tmp_path / "dqn"
    root.mkdir()
    return root


@pytest.fixture
def dest_root(tmp_path: Path) -> Path:
    """Where this test's stores go (not created)."""
    return tmp_path / "stores"


@pytest.fixture(scope="session")
def pong_source(tmp_path_factory: pytest.TempPathFactory) -> FixtureRun:
    """The Pong/1 fixture run, written once per session. Read-only: never change it.

    Its root (the directory holding ``Pong/1``) is ``Path(pong_source.url).parents[1]``.
    """
    root = tmp_path_factory.mktemp("pong-source")
    return write_fixture_run(str(root), "Pong", "1", **PONG_RUN)


@pytest.fixture(scope="session")
def pong_truth(pong_source: FixtureRun) -> Truth:
    """The transitions ``pong_source`` converts to (all checkpoints)."""
    return pong_source.truth()


@pytest.fixture(scope="session")
def pong_store(pong_source: FixtureRun, tmp_path_factory: pytest.TempPathFactory) -> ConvertedStore:
    """``pong_source`` converted with the defaults, once per session. Read-only.

    Tests that write to the store (attributes, arrays, files) use ``pong_store_copy``.
    """
    dest = tmp_path_factory.mktemp("pong-store")
    [store] = convert(str(Path(pong_source.url).parents[1]), str(dest), progress=False)
    return store


@pytest.fixture
def pong_run(pong_source: FixtureRun, source_root: Path) -> FixtureRun:
    """This test's own copy of the Pong/1 fixture run, at ``source_root/Pong/1``.

    Free to change: the files are a copy of ``pong_source``'s, the ground truth is
    shared (it is only read).
    """
    run_dir = source_root / "Pong" / "1"
    shutil.copytree(pong_source.url, run_dir)
    return dataclasses.replace(pong_source, url=str(run_dir))


@pytest.fixture
def pong_store_copy(pong_store: ConvertedStore, dest_root: Path) -> ConvertedStore:
    """This test's own copy of ``pong_store``, at ``dest_root/Pong/1.zarr``; free to change.

    The copy's attributes still name the session's source and destination (and its
    plan fingerprint covers the session's source): a test that converts into
    ``dest_root`` again, or checks the recorded paths, converts for itself.
    """
    target = dest_root / "Pong" / "1.zarr"
    shutil.copytree(pong_store.url, target)
    return dataclasses.replace(pong_store, url=str(target))


@dataclasses.dataclass
class PublicCopy:
    """RL Unplugged's public bucket served by fake-gcs-server, behind a counting proxy.

    ``runs`` are the fixture runs uploaded (``"Asterix/1"`` and ``"Pong/4"`` whole,
    ``"Breakout/1"`` with its last three shards only), their
    shards named exactly as ``gs://rl_unplugged/atari_episodes_ordered`` has them;
    ``bytes`` the size of each shard object by run and shard.
    """

    server: object
    proxy: object
    runs: dict
    bytes: dict


@pytest.fixture(scope="session")
def rlu_public(tmp_path_factory: pytest.TempPathFactory):
    """The public copy (see :class:`PublicCopy`), once per session."""
    gcsfs = pytest.importorskip("gcsfs")
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer
    from atari_zarr_testkit.rl_unplugged import upload_public_layout, write_fixture_rlu

    src = tmp_path_factory.mktemp("rlu-public")
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket("rl_unplugged")
        fs = gcsfs.GCSFileSystem(**server.storage_options())
        runs, sizes = {}, {}
        # whole runs (every shard present) are what a whole-run pull stores; the shards
        # past the first few hold one short cut episode each
        for game, run, present, episodes, seed in (
            ("Asterix", 1, range(50), {0: 6, 1: 6, 2: 6}, 0),
            ("Pong", 4, range(50), {0: 2, 1: 2}, 4),
            ("Breakout", 1, (47, 48, 49), 4, 1),  # the last shards: the Decision Transformer's
        ):
            fixture = write_fixture_rlu(
                str(src),
                game,
                run,
                num_shards=50,
                present=present,
                episodes_per_shard=episodes,
                seed=seed,
                cut_length=40,
            )
            upload_public_layout(fs, fixture)
            runs[f"{game}/{run}"] = fixture
            sizes[f"{game}/{run}"] = {i: os.path.getsize(p) for i, p in fixture.paths.items()}
        yield PublicCopy(server, proxy, runs, sizes)


@pytest.fixture
def public_copy(rlu_public: PublicCopy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The public copy, reached through the code's default URL: the standard emulator
    variable gcsfs honours points at the proxy; the cache is this test's own."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", rlu_public.proxy.endpoint_url)
    monkeypatch.setenv("ATARI_ZARR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ATARI_ZARR_MIRRORS", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    rlu_public.proxy.delay = 0.0
    rlu_public.proxy.reset()
    return rlu_public
