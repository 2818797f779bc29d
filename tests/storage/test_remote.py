"""Remote stores on a local GCS emulator: gs:// -> gs:// conversion, lazy reads, the local
cache, faults (retries, deadlines, clear errors without credentials), DataLoader workers.

Everything talks to 127.0.0.1 only (fake-gcs-server started by the tests).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import fsspec
import numpy as np
import pytest
import torch
import zarr
from atari_zarr_testkit import Truth, fixture_frame, write_fixture_run
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

from atari_zarr import convert
from atari_zarr.cli import main as cli_main
from atari_zarr.episodes import EpisodeLedger
from atari_zarr.errors import RemoteAccessError, RemoteTimeoutError
from atari_zarr.layout import (
    ACTION,
    EPISODE,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    create_store,
    mark_complete,
)
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.storage.paths import parse_storage_options, redact
from atari_zarr.storage.remote import RemoteStore, open_zarr_store

pytestmark = pytest.mark.timeout(300)

BUCKET = "atari-remote"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeGCSServer]:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


@pytest.fixture(scope="module")
def proxy(server: FakeGCSServer) -> Iterator[CountingProxy]:
    with CountingProxy(server.endpoint_url) as prx:
        yield prx


@pytest.fixture(scope="module")
def remote_run(server: FakeGCSServer, proxy: CountingProxy) -> dict[str, Any]:
    """A fixture run written straight into the bucket, then converted gs:// -> gs://."""
    opts = server.storage_options(endpoint_url=proxy.endpoint_url)
    # written directly: the proxy does not carry resumable uploads of '$' names
    run = write_fixture_run(
        f"gs://{BUCKET}/dqn",
        "Pong",
        "1",
        capacity=200,
        steps=1500,
        seed=3,
        max_episode_length=40,
        storage_options=server.storage_options(),
    )
    fs = fsspec.filesystem("gs", **opts)
    source_bytes = sum(fs.du(f"{BUCKET}/dqn", total=False).values())
    tmp = tempfile.mkdtemp()
    before = set(os.listdir(tmp))
    proxy.reset()
    saved = tempfile.tempdir
    tempfile.tempdir = tmp  # anything spooled to local disk would land here
    try:
        [store] = convert(
            f"gs://{BUCKET}/dqn", f"gs://{BUCKET}/stores", progress=False, storage_options=opts
        )
    finally:
        tempfile.tempdir = saved
    return {
        "run": run,
        "truth": run.truth(),
        "store": store,
        "opts": opts,
        # bytes read from the source objects; the store's own work area (pieces of
        # shards shared by checkpoints, which tiny fixture buffers make frequent) is
        # traffic to the destination, counted apart
        "convert_download": sum(
            n for method, path, _, n in proxy.log if method == "GET" and "/dqn/" in unquote(path)
        ),
        "convert_download_total": proxy.bytes_received,
        "source_bytes": source_bytes,
        "local_files": set(os.listdir(tmp)) - before,
    }


def _check_batch(batch: Any, truth: Truth, rows: np.ndarray) -> None:
    np.testing.assert_array_equal(batch["observation"].numpy(), truth.observation[rows])
    nxt = batch["next", "observation"].numpy()
    np.testing.assert_array_equal(nxt, truth.next_observation[rows])
    np.testing.assert_array_equal(batch["action"].numpy(), truth.action[rows])
    np.testing.assert_array_equal(batch["next", "reward"].numpy()[:, 0], truth.reward[rows])
    np.testing.assert_array_equal(batch["next", "terminated"].numpy()[:, 0], truth.terminated[rows])
    np.testing.assert_array_equal(batch["next", "truncated"].numpy()[:, 0], truth.truncated[rows])
    np.testing.assert_array_equal(batch["episode"].numpy(), truth.episode[rows])


# --------------------------------------------------------------------------- #
# gs:// -> gs:// and lazy reading
# --------------------------------------------------------------------------- #


def test_convert_gs_to_gs_streams_sources(remote_run: dict[str, Any]) -> None:
    store, truth = remote_run["store"], remote_run["truth"]
    assert store.url == f"gs://{BUCKET}/stores/Pong/1.zarr"
    assert store.transitions == len(truth) > 500
    # source names carry '$'; they were listed and read through gcsfs as they are
    fs = fsspec.filesystem("gs", **remote_run["opts"])
    names = fs.ls(f"{BUCKET}/dqn/Pong/1/replay_logs", detail=False)
    assert any("$store$_observation_ckpt.0.gz" in n for n in names)
    # every source object streamed about once (plan reads the small arrays, write
    # reads everything): no copies, no re-downloads, nothing spooled to local disk
    assert remote_run["convert_download"] <= 1.5 * remote_run["source_bytes"]
    assert remote_run["local_files"] == set()


def test_lazy_read_matches_truth(remote_run: dict[str, Any]) -> None:
    truth = remote_run["truth"]
    ds = AtariZarrDataset(remote_run["store"].url, storage_options=remote_run["opts"])
    assert len(ds) == len(truth)
    rng = np.random.default_rng(0)
    for _ in range(5):
        rows = rng.integers(0, len(ds), 32)
        _check_batch(ds[rows], truth, rows)
    rows = np.arange(len(ds))
    _check_batch(ds[:], truth, rows)


def test_open_costs_a_handful_of_requests(remote_run: dict[str, Any], proxy: CountingProxy) -> None:
    proxy.reset()
    AtariZarrDataset(remote_run["store"].url, storage_options=remote_run["opts"])
    paths = [entry[1] for entry in proxy.log]
    # consolidated metadata: one zarr.json, then only the small per-step arrays
    assert sum("zarr.json" in p for p in paths) == 1, paths
    assert proxy.requests <= 7, paths
    assert not any("observation" in p for p in paths), paths


def test_sample_fetches_only_touched_chunks(
    remote_run: dict[str, Any], proxy: CountingProxy
) -> None:
    ds = AtariZarrDataset(remote_run["store"].url, storage_options=remote_run["opts"])
    proxy.reset()
    ds[[10]]
    frame_gets = [e for e in proxy.log if "observation" in e[1]]
    # one shard index range and one 16-frame chunk range, both partial (206)
    assert frame_gets and all(e[2] == 206 for e in frame_gets), proxy.log
    assert len(frame_gets) <= 3, proxy.log


def test_cache_serves_next_epoch_locally(
    remote_run: dict[str, Any], proxy: CountingProxy, tmp_path: Path
) -> None:
    truth, url, opts = remote_run["truth"], remote_run["store"].url, remote_run["opts"]
    rows = np.random.default_rng(1).integers(0, len(truth), 64)
    ds = AtariZarrDataset(url, storage_options=opts, cache=tmp_path / "cache")
    _check_batch(ds[rows], truth, rows)
    assert any((tmp_path / "cache").rglob("*@*"))

    proxy.reset()
    again = AtariZarrDataset(url, storage_options=opts, cache=tmp_path / "cache")
    _check_batch(again[rows], truth, rows)
    # only the root metadata, which decides whether the cache is still valid
    assert [e[1].rsplit("%2F", 1)[-1] for e in proxy.log] == ["zarr.json?alt=media"], proxy.log


def test_cache_is_emptied_when_the_store_changes(server: FakeGCSServer, tmp_path: Path) -> None:
    opts = server.storage_options()
    root = str(tmp_path / "src")
    run = write_fixture_run(root, "Pong", "1", capacity=64, steps=400, seed=5)
    dest = f"gs://{BUCKET}/recached"
    [store] = convert(root, dest, progress=False, storage_options=opts)
    cache = tmp_path / "cache"
    ds = AtariZarrDataset(store.url, storage_options=opts, cache=cache)
    ds[: len(ds)]
    # convert again from fewer checkpoints: same URL, different content
    [store2] = convert(
        root,
        dest,
        checkpoints="0-2",
        overwrite=True,
        progress=False,
        storage_options=opts,
        source_storage_options={},
    )
    truth = run.truth([0, 1, 2])
    assert store2.transitions == len(truth) != store.transitions
    ds2 = AtariZarrDataset(store.url, storage_options=opts, cache=cache)
    _check_batch(ds2[:], truth, np.arange(len(truth)))


def test_a_full_cache_is_skipped_with_one_warning(
    server: FakeGCSServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache= directory on a full disk (ENOSPC injected from the test): every read still
    works, from the bucket, after one warning. Before: every read failed."""
    import errno
    import tempfile
    import warnings

    opts = server.storage_options()
    root = str(tmp_path / "src")
    run = write_fixture_run(root, "Pong", "1", capacity=64, steps=300, seed=6)
    [store] = convert(root, f"gs://{BUCKET}/fullcache", progress=False, storage_options=opts)
    real = tempfile.mkstemp
    writes = []

    def full(*args, **kwargs):
        writes.append(1)
        if len(writes) > 2:  # the first objects fit, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = AtariZarrDataset(store.url, storage_options=opts, cache=tmp_path / "cache")
        truth = run.truth()
        _check_batch(ds[: len(ds)], truth, np.arange(len(ds)))
        rows = np.array([5, 77, 150])
        _check_batch(ds[rows], truth, rows)
    full_warnings = [w for w in caught if "cannot be written" in str(w.message)]
    assert len(full_warnings) == 1, [str(w.message) for w in caught]
    assert "No space left" in str(full_warnings[0].message)


def test_memory_url_and_pickle(tmp_path: Path) -> None:
    root = str(tmp_path / "src")
    run = write_fixture_run(root, "Pong", "1", capacity=64, steps=300, seed=2)
    [store] = convert(root, "memory://remote-test", progress=False)
    ds = AtariZarrDataset(store.url)
    _check_batch(ds[:], run.truth(), np.arange(len(ds)))
    raw = open_zarr_store(store.url, read_only=True, timeout=4)
    assert isinstance(raw, RemoteStore) and raw.timeout == 4


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def test_cli_convert_and_info_with_storage_options(
    server: FakeGCSServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = server.storage_options()
    write_fixture_run(
        f"gs://{BUCKET}/cli-src", "Pong", "2", capacity=64, steps=300, storage_options=opts
    )
    flags = [f"--storage-option={k}={v}" for k, v in opts.items()]
    assert parse_storage_options([f[len("--storage-option=") :] for f in flags]) == opts
    code = cli_main(
        [
            "convert",
            f"gs://{BUCKET}/cli-src",
            f"gs://{BUCKET}/cli-dest",
            "-q",
            "--timeout",
            "30",
            *flags,
        ]
    )
    assert code == 0
    code = cli_main(["info", f"gs://{BUCKET}/cli-dest/Pong/2.zarr", "--json", *flags])
    assert code == 0
    assert '"game": "Pong"' in capsys.readouterr().out


# --------------------------------------------------------------------------- #
# faults
# --------------------------------------------------------------------------- #


def test_transient_errors_are_retried(remote_run: dict[str, Any], proxy: CountingProxy) -> None:
    truth = remote_run["truth"]
    for status in (503, 429):
        # a fresh dataset: nothing of these rows is in its chunk cache
        ds = AtariZarrDataset(remote_run["store"].url, storage_options=remote_run["opts"])
        rows = np.array([3, 400, 900])
        proxy.reset()
        proxy.fail_next(2, status)
        _check_batch(ds[rows], truth, rows)
        statuses = [e[2] for e in proxy.log]
        assert statuses.count(status) == 2, proxy.log


def test_permanent_error_is_clear(remote_run: dict[str, Any], proxy: CountingProxy) -> None:
    ds = AtariZarrDataset(remote_run["store"].url, storage_options=remote_run["opts"])
    proxy.fail_next(1, 403)
    where = r"reading gs://atari-remote/stores/Pong/1\.zarr/observation"
    with pytest.raises(RemoteAccessError, match=where):
        ds[[1]]
    ds[[1]]  # the next read works again


def test_missing_store_is_clear(server: FakeGCSServer) -> None:
    url = f"gs://{BUCKET}/absent/Pong/1.zarr"
    with pytest.raises(FileNotFoundError, match=rf"{re.escape(url)} does not exist: expected a store"):
        AtariZarrDataset(url, storage_options=server.storage_options())


def _outcome(fn: Any) -> BaseException | None:
    """The exception ``fn`` raises, or None; the module's pytest timeout bounds the call."""
    try:
        fn()
    except Exception as exc:  # handed back to the test
        return exc
    return None


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_server_gone_mid_read_fails_within_the_bound(fault: str, tmp_path: Path) -> None:
    root = str(tmp_path / "src")
    write_fixture_run(root, "Pong", "1", capacity=64, steps=300, seed=1)
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        opts = srv.storage_options()
        [store] = convert(
            root,
            f"gs://{BUCKET}/fault",
            progress=False,
            storage_options=opts,
            source_storage_options={},
        )
        ds = AtariZarrDataset(store.url, storage_options=opts, timeout=3)
        ds[[0, 1]]  # warm connections
        getattr(srv, fault)()
        try:
            exc = _outcome(lambda: ds[[200]])
        finally:
            if fault == "pause":
                srv.resume()
        assert isinstance(exc, RemoteTimeoutError), repr(exc)
        assert isinstance(exc, TimeoutError)
        message = str(exc)
        assert "gs://atari-remote/fault/Pong/1.zarr/observation" in message
        # a timeout, not gcsfs's connection error after its ~32 s of retries: the
        # deadline ended the read (a hang would meet the module's pytest timeout)
        assert "within 3 s" in message and "timeout=" in message


def test_credentials_never_in_errors() -> None:
    secret = "hunter2-secret"
    opts = {"headers": {"Authorization": f"Bearer {secret}-token"}}
    # bound but never listening while the test connects: refused, and no other
    # process can take the port meanwhile
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        url = f"http://reader:{secret}@127.0.0.1:{port}/stores/Pong/1.zarr"
        exc = _outcome(lambda: AtariZarrDataset(url, storage_options=opts, timeout=5))
    assert isinstance(exc, RemoteAccessError | FileNotFoundError), repr(exc)
    assert secret not in str(exc) and "127.0.0.1" in str(exc)
    assert exc.__cause__ is None or secret not in str(exc.__cause__)
    assert secret not in repr(RemoteStore(url, opts, read_only=True))
    assert redact(url) == f"http://***@127.0.0.1:{port}/stores/Pong/1.zarr"


# --------------------------------------------------------------------------- #
# DataLoader workers
# --------------------------------------------------------------------------- #


def _identity(batch: Any) -> Any:
    return batch


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(remote_run: dict[str, Any], context: str) -> None:
    truth = remote_run["truth"]
    ds = AtariZarrDataset(remote_run["store"].url, storage_options=remote_run["opts"])
    ds[[0, 500]]  # the parent's file system is live (session, sockets) before forking
    order = np.random.default_rng(7).permutation(len(ds))[:256]
    batches = [order[i : i + 32].tolist() for i in range(0, len(order), 32)]
    loader = torch.utils.data.DataLoader(
        ds,
        sampler=batches,
        batch_size=None,
        collate_fn=_identity,
        num_workers=2,
        multiprocessing_context=context,
    )
    seen = 0
    for rows, batch in zip(batches, loader, strict=True):
        _check_batch(batch, truth, np.asarray(rows))
        seen += len(rows)
    assert seen == 256
    ds[[1, 2]]  # the parent still reads after its workers are gone


# --------------------------------------------------------------------------- #
# bytes fetched by random batches from a large store
# --------------------------------------------------------------------------- #


@pytest.mark.slow
def test_random_batches_fetch_a_small_fraction(tmp_path: Path) -> None:
    """10 random batches of 32 from a 100,000-transition store fetch < 15 % of its bytes.

    Each batch touches ~32 distinct 16-frame chunks (the next frame is almost always
    in the same chunk) plus one shard index (4 KiB) per touched shard; opening reads
    the per-step arrays and the shard indexes. With ~6,250 chunks the sum is about 14 %.
    """
    n = 100_000
    local_url = str(tmp_path / "big.zarr")
    # written directly (no source files, no conversion): the layout is what matters here
    rows = np.arange(n)
    ends = rows % 2000 == 1999
    rewards = (rows % 3 == 0).astype(np.float32)
    group = create_store(zarr.storage.LocalStore(local_url), n, {"kind": "test"})
    frames = np.stack([fixture_frame(row) for row in range(4096)])
    for start in range(0, n, 4096):
        stop = min(start + 4096, n)
        group[OBSERVATION][start:stop] = frames[: stop - start]
    group[ACTION][:] = rows % 6
    group[EPISODE][:] = rows // 2000
    group[SOURCE_ROW][:] = rows
    group[REWARD][:] = rewards
    group[TERMINATED][:] = ends
    group[TRUNCATED][:] = False
    ledger = EpisodeLedger()
    ledger.feed(rewards, terminated=ends)
    mark_complete(group, {"episodes": ledger.as_attributes()})
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        fs = fsspec.filesystem("gs", **srv.storage_options())
        fs.put(local_url, f"{BUCKET}/big/Pong/1.zarr", recursive=True)
        fs.invalidate_cache()
        stored = fs.du(f"{BUCKET}/big/Pong/1.zarr")
        with CountingProxy(srv.endpoint_url) as prx:
            opts = srv.storage_options(endpoint_url=prx.endpoint_url)
            ds = AtariZarrDataset(f"gs://{BUCKET}/big/Pong/1.zarr", storage_options=opts)
            reference = AtariZarrDataset(local_url)
            gen = torch.Generator().manual_seed(0)
            for _ in range(10):
                rows = torch.randint(0, len(ds), (32,), generator=gen)
                batch = ds[rows]
                want = reference[rows]
                assert (batch["observation"] == want["observation"]).all()
                assert (batch["next", "observation"] == want["next", "observation"]).all()
            fraction = prx.bytes_received / stored
    assert fraction <= 0.15, (prx.bytes_received, stored)


# --------------------------------------------------------------------------- #
# nothing printed at exit
# --------------------------------------------------------------------------- #


def test_gs_commands_print_nothing_at_exit(server: FakeGCSServer, tmp_path: Path) -> None:
    """The HTTP sessions are closed on their own loop at exit: a gs:// convert (in worker
    processes and in threads) and an info print no "Task pending" or traceback."""
    write_fixture_run(str(tmp_path / "src"), "Pong", "1", capacity=200, steps=400, seed=0)
    flags = [f"-s{k}={v}" for k, v in server.storage_options().items()]
    env = {**os.environ, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    runs = [
        ["convert", str(tmp_path / "src"), f"gs://{BUCKET}/quiet", "-q", *flags],
        ["convert", str(tmp_path / "src"), f"gs://{BUCKET}/quiet-t", "-q", "--scheduler",
         "threads", *flags],
        ["info", f"gs://{BUCKET}/quiet/Pong/1.zarr", *flags],
        ["verify", f"gs://{BUCKET}/quiet/Pong/1.zarr", "-q", *flags],
    ]
    for args in runs:
        done = subprocess.run(
            [sys.executable, "-m", "atari_zarr", *args], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", (args[0], done.stderr[-2000:])


# --------------------------------------------------------------------------- #
# importing changes nothing global
# --------------------------------------------------------------------------- #

_IMPORT_ALL = """
import importlib, json, os, pkgutil, sys
third_party = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
for name in third_party:  # what the dependencies do to the environment is theirs
    try:
        importlib.import_module(name)
    except Exception:
        pass
before = dict(os.environ)
import atari_zarr
import atari_zarr_testkit  # the test kit (tests/kit): its servers start only when asked
imported, skipped = [], []
infos = [
    *pkgutil.walk_packages(atari_zarr.__path__, "atari_zarr."),
    *pkgutil.walk_packages(atari_zarr_testkit.__path__, "atari_zarr_testkit."),
]
for info in infos:
    if info.name.endswith("__main__"):  # runs the CLI
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as exc:  # an optional extra that is not installed
        missing = getattr(exc, "name", None) or ""
        if missing.startswith("atari_zarr"):
            raise
        skipped.append(info.name)
    else:
        imported.append(info.name)
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
outside = sorted(
    {m.split(".")[0] for m in sys.modules}
    - set(sys.stdlib_module_names) - {"atari_zarr", "atari_zarr_testkit", "__main__"}
)
print(json.dumps({"changed": changed, "imported": imported, "third_party": outside}))
"""


def _import_everything(env: dict[str, str], *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, *args], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_importing_the_package_changes_no_environment() -> None:
    """``import atari_zarr`` (and every submodule, and the test kit's) leaves
    ``os.environ`` as it was.

    Some dependencies set variables when imported (tensordict, gymnasium); they are
    imported first, in a second run, so that only the package's own changes count.
    """
    env = {k: v for k, v in os.environ.items() if k != "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}
    first = _import_everything(env)
    assert "atari_zarr.storage.remote" in first["imported"]
    assert "atari_zarr_testkit.gcs" in first["imported"]
    second = _import_everything(env, json.dumps(first["third_party"]))
    assert second["imported"] == first["imported"]
    assert second["changed"] == [], "importing atari_zarr changed the environment"
