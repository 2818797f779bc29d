"""The deadline-bound file system: every remote call, listings included, honours the deadline;
remote failures surface as remote errors, a missing object stays FileNotFoundError.

Remote cases talk to fake-gcs-server on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import gzip
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer
from zarr.core.sync import sync

from atari_zarr.catalog import list_stores, store_state
from atari_zarr.errors import RemoteAccessError, RemoteTimeoutError
from atari_zarr.storage.filesystem import FileSystem, get_fs
from atari_zarr.storage.remote import open_zarr_store

BUCKET = "atari-fs"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeGCSServer]:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


@pytest.fixture
def private_server() -> Iterator[FakeGCSServer]:
    """A server of this test alone: it may be paused."""
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


# --------------------------------------------------------------------------- #
# local and in-memory file systems
# --------------------------------------------------------------------------- #


def test_local_paths_use_the_local_file_system(tmp_path: Path) -> None:
    fs, path = get_fs(str(tmp_path / "a"))
    assert type(fs.fs).__name__ == "LocalFileSystem" and not fs.bounded
    assert path == str(tmp_path / "a")
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/x.bin", b"abc")
    with fs.open(f"{path}/x.bin", "rb") as f:
        assert f.read() == b"abc"
    assert fs.exists(f"{path}/x.bin") and not fs.exists(f"{path}/y.bin")
    assert fs.ls(path) == [f"{path}/x.bin"]
    fs.rm(path, recursive=True)
    assert not fs.exists(path)


def test_memory_file_system_round_trip() -> None:
    fs, path = get_fs("memory://fs-test/round")
    with fs.open(f"{path}/a/b.bin", "wb") as f:
        f.write(b"0123456789")
    assert fs.cat_file(f"{path}/a/b.bin", 3, 6) == b"345"
    assert fs.find(path) == [f"{path}/a/b.bin"]
    assert fs.glob(f"{path}/*/*.bin") == [f"{path}/a/b.bin"]
    assert fs.du(path) == 10
    assert fs.isdir(f"{path}/a") and fs.isfile(f"{path}/a/b.bin")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{path}/missing")
    copy = pickle.loads(pickle.dumps(fs))
    assert isinstance(copy, FileSystem) and copy.timeout == fs.timeout
    assert copy.cat_file(f"{path}/a/b.bin") == b"0123456789"
    fs.rm(path, recursive=True)
    assert not fs.exists(path)


# --------------------------------------------------------------------------- #
# remote: answers, errors, request counts
# --------------------------------------------------------------------------- #


def test_remote_calls_and_missing_objects(server: FakeGCSServer) -> None:
    fs, path = get_fs(f"gs://{BUCKET}/calls", server.storage_options(), timeout=30)
    assert fs.bounded
    fs.pipe_file(f"{path}/g/1.bin", b"x" * 10)
    fs.pipe_file(f"{path}/g/2.bin", b"y" * 5)
    assert fs.ls(f"{path}/g") == [f"{path}/g/1.bin", f"{path}/g/2.bin"]
    assert fs.find(path) == [f"{path}/g/1.bin", f"{path}/g/2.bin"]
    assert fs.glob(f"{path}/*/2.bin") == [f"{path}/g/2.bin"]
    assert fs.du(path) == 15
    assert fs.exists(f"{path}/g") and fs.isdir(f"{path}/g") and fs.isfile(f"{path}/g/1.bin")
    assert not fs.exists(f"{path}/nothing") and not fs.isdir(f"{path}/nothing")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{path}/nothing")
    with pytest.raises(FileNotFoundError):
        fs.open(f"{path}/nothing", "rb")
    fs.rm(path, recursive=True)
    assert not fs.exists(f"{path}/g/1.bin")


def test_a_failing_server_is_never_an_absent_path(server: FakeGCSServer) -> None:
    """A refused request raises a remote error naming the URL; exists() never says False."""
    with CountingProxy(server.endpoint_url) as proxy:
        fs, path = get_fs(
            f"gs://{BUCKET}/refused", server.storage_options(endpoint_url=proxy.endpoint_url)
        )
        # (status, call): 505 is a 5xx that gcsfs does not retry, so the error comes at
        # once; a 403 on an object gcsfs itself answers by listing, so only where it is final
        calls: list[tuple[int, Callable[[], Any]]] = [
            (505, lambda: fs.exists(f"{path}/x")),
            (505, lambda: fs.isdir(f"{path}/x")),
            (505, lambda: fs.ls(f"{path}/x")),
            (403, lambda: fs.ls(f"{path}/x")),
            (505, lambda: fs.cat_file(f"{path}/x")),
            (403, lambda: fs.cat_file(f"{path}/x")),
        ]
        for status, call in calls:
            fs.invalidate_cache()  # gcsfs keeps listings: each call must ask the server
            proxy.fail_next(100, status)  # every request of the call, whatever their order
            with pytest.raises(RemoteAccessError, match=f"gs://{BUCKET}/refused/x") as info:
                call()
            proxy.reset()
            assert not isinstance(info.value, RemoteTimeoutError)
            assert "failed after the file system's retries" in str(info.value)
            assert f"{status}" in str(info.value) or "Forbidden" in str(info.value)


def test_reading_a_file_costs_one_request_per_block(server: FakeGCSServer) -> None:
    # under 1 MiB: gcsfs uploads a larger body as raw bytes, which aiohttp warns about
    data = np.random.default_rng(0).integers(0, 255, 900_000, dtype=np.uint8).tobytes()
    packed = gzip.compress(data, compresslevel=1)
    setup, path = get_fs(f"gs://{BUCKET}/blocks", server.storage_options())
    setup.pipe_file(f"{path}/f.gz", packed)
    block = 1 << 17
    with CountingProxy(server.endpoint_url) as proxy:
        fs, path = get_fs(
            f"gs://{BUCKET}/blocks", server.storage_options(endpoint_url=proxy.endpoint_url)
        )
        with fs.open(f"{path}/f.gz", "rb", block_size=block) as raw:
            with gzip.GzipFile(fileobj=raw) as f:  # reads of 8 KB..128 KB, as the sources do
                assert f.read() == data
        ranged = [e for e in proxy.log if e[0] == "GET" and "alt=media" in e[1]]
        assert len(ranged) == -(-len(packed) // block), proxy.log
        assert sum(e[3] for e in ranged) == len(packed)

        proxy.reset()
        with fs.open(f"{path}/f.gz", "rb") as f:
            f.seek(len(packed) - 10)
            assert f.read() == packed[-10:]
            f.seek(0)
            assert f.read() == packed  # the rest at once: one request
        assert len([e for e in proxy.log if "alt=media" in e[1]]) == 2, proxy.log


def test_write_mode_publishes_on_close(server: FakeGCSServer) -> None:
    fs, path = get_fs(f"gs://{BUCKET}/written", server.storage_options())
    with fs.open(f"{path}/a.bin", "wb") as f:
        f.write(b"abc")
        f.write(b"def")
        assert not fs.exists(f"{path}/a.bin")  # nothing half-written is ever visible
    assert fs.cat_file(f"{path}/a.bin") == b"abcdef"


# --------------------------------------------------------------------------- #
# a server that stops answering: every call ends at the deadline
# --------------------------------------------------------------------------- #


@pytest.mark.timeout(300)
def test_every_call_honours_the_deadline_on_a_stalled_server(
    private_server: FakeGCSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = private_server.storage_options()
    root = f"gs://{BUCKET}/stalled"
    # Set up under the default deadline: 1 s applies only once the server is stalled,
    # so a loaded machine cannot make a call to the healthy server miss it.
    fs, path = get_fs(root, opts)
    fs.pipe_file(f"{path}/Pong/1.zarr/zarr.json", b"{}")
    fs.pipe_file(f"{path}/f.bin", b"0123456789")
    reader = fs.open(f"{path}/f.bin", "rb", block_size=4)
    assert reader.read(2) == b"01"
    group = zarr.open_group(open_zarr_store(f"{root}/g.zarr", opts, read_only=False), mode="w")
    group.create_array("a", shape=(4,), dtype="int8")
    store = open_zarr_store(f"{root}/g.zarr", opts, read_only=True)
    fs.invalidate_cache()  # every answer below must come from the server
    store._store.fs.invalidate_cache()  # type: ignore[attr-defined]

    async def keys(listing: Any) -> list[str]:
        return [key async for key in listing]

    calls: dict[str, Callable[[], Any]] = {
        "ls": lambda: fs.ls(path),
        "find": lambda: fs.find(path),
        "glob": lambda: fs.glob(f"{path}/*/*.zarr"),
        "du": lambda: fs.du(path),
        "exists": lambda: fs.exists(f"{path}/f.bin"),
        "isdir": lambda: fs.isdir(f"{path}/Pong"),
        "info": lambda: fs.info(f"{path}/f.bin"),
        "cat_file": lambda: fs.cat_file(f"{path}/f.bin"),
        "read": lambda: reader.read(),
        "open": lambda: fs.open(f"{path}/f.bin", "rb"),
        "pipe_file": lambda: fs.pipe_file(f"{path}/new.bin", b"x"),
        "rm": lambda: fs.rm(f"{path}/Pong", recursive=True),
        "store_state": lambda: store_state(f"{root}/Pong/1.zarr", opts, timeout=1),
        "list_stores": lambda: list_stores(root, opts, timeout=1),
        "store.list_dir": lambda: sync(keys(store.list_dir(""))),
        "store.list_prefix": lambda: sync(keys(store.list_prefix("a"))),
        "store.list": lambda: sync(keys(store.list())),
        "store.getsize": lambda: sync(store.getsize("zarr.json")),
        "store.exists": lambda: sync(store.exists("a/zarr.json")),
    }
    fs.timeout = store.timeout = 1
    private_server.pause()
    try:
        for name, call in calls.items():
            with pytest.raises(RemoteTimeoutError, match="within 1 s") as info:
                call()
            assert f"gs://{BUCKET}/stalled" in str(info.value), name
    finally:
        private_server.resume()
    assert fs.cat_file(f"{path}/f.bin") == b"0123456789"  # the same objects work again


@pytest.mark.timeout(300)
def test_the_deadline_is_an_argument_whose_default_is_the_environments(
    private_server: FakeGCSServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``timeout="default"`` is ``$ATARI_ZARR_TIMEOUT`` (else 60 s) for every caller, the
    command line, the readers and the drop-ins alike; an argument given wins."""
    from atari_zarr.storage.deadline import DEFAULT_TIMEOUT, timeout_from_environment

    monkeypatch.delenv("ATARI_ZARR_TIMEOUT", raising=False)
    assert get_fs(f"gs://{BUCKET}/env", private_server.storage_options())[0].timeout == (
        DEFAULT_TIMEOUT
    )
    monkeypatch.setenv("ATARI_ZARR_TIMEOUT", "2")
    assert timeout_from_environment() == 2
    fs, path = get_fs(f"gs://{BUCKET}/env", private_server.storage_options())
    assert fs.timeout == 2
    assert get_fs(f"gs://{BUCKET}/env", private_server.storage_options(), timeout=5)[0].timeout == 5
    private_server.pause()
    try:
        with pytest.raises(RemoteTimeoutError, match=rf"listing gs://{BUCKET}/env .*within 2 s"):
            fs.ls(path)
    finally:
        private_server.resume()


def test_a_destination_that_cannot_be_written_is_a_store_write_error(tmp_path: Path) -> None:
    from atari_zarr.errors import StoreWriteError

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    fs, path = get_fs(str(blocker / "store.zarr"))
    with pytest.raises(StoreWriteError, match=r"creating .*a-file/store\.zarr failed"):
        fs.makedirs(path, exist_ok=True)
    with pytest.raises(StoreWriteError, match=r"writing .*a-file/store\.zarr/x failed"):
        fs.pipe_file(f"{path}/x", b"1")
    with pytest.raises(FileNotFoundError):  # deleting what is not there is not a write failure
        fs.rm(str(tmp_path / "absent"))


def test_an_unknown_protocol_or_missing_backend_names_the_fix(monkeypatch) -> None:
    from atari_zarr.errors import InvalidArgumentError, MissingDependencyError

    with pytest.raises(InvalidArgumentError, match="the protocol 'nosuchproto' is not known"):
        get_fs("nosuchproto://bucket/x")
    with pytest.raises(InvalidArgumentError, match="not known"):
        open_zarr_store("nosuchproto://bucket/x.zarr", read_only=True)
    monkeypatch.setitem(__import__("sys").modules, "adlfs", None)
    with pytest.raises(MissingDependencyError, match=r"back end adlfs.*pip install adlfs"):
        get_fs("abfs://container/x")
    # gcsfs is in the base install: a damaged install is told the package, not an extra
    import importlib

    loaded = importlib.import_module("fsspec.registry")._registry  # back ends imported so far
    for protocol in ("gs", "gcs"):
        monkeypatch.delitem(loaded, protocol, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "gcsfs", None)
    with pytest.raises(MissingDependencyError, match=r"back end gcsfs.*pip install gcsfs$"):
        get_fs("gs://bucket/x")


def test_a_whole_file_write_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    """``write_whole`` (the catalog, the card, its picture): a disk that fills up is one
    line and leaves neither a half-written file nor its temporary."""
    import errno

    from atari_zarr.errors import StoreWriteError
    from atari_zarr.storage import filesystem

    fs, path = get_fs(str(tmp_path))
    fs.write_whole(f"{path}/catalog.json", b"{}")
    assert (tmp_path / "catalog.json").read_bytes() == b"{}"

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", dst)

    monkeypatch.setattr(filesystem.os, "replace", full)
    with pytest.raises(StoreWriteError, match="the disk is full") as info:
        fs.write_whole(f"{path}/learning_curves.png", b"\x89PNG" * 1000)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalog.json"]


def test_a_web_servers_listing_is_decoded_and_converts(pong_source, tmp_path: Path) -> None:
    """``python -m http.server`` lists ``$store$_action_ckpt.0.gz`` as
    ``%24store%24_action_ckpt.0.gz``: names are decoded, so a DQN Replay run served by a
    plain web server converts (it reported every file of checkpoint 0 as missing)."""
    import shutil

    from atari_zarr_testkit.web import DirectoryServer

    from atari_zarr import AtariZarrDataset, convert

    served = tmp_path / "served"
    shutil.copytree(Path(pong_source.url).parents[1], served)

    with DirectoryServer(served) as server:
        url = f"http://{server.host}:{server.port}/Pong/1/replay_logs/"
        names = FileSystem(url).ls(url)
        assert any(name.endswith("/$store$_action_ckpt.0.gz") for name in names)
        assert not any("%24" in name for name in names)
        [store] = convert(
            f"http://{server.host}:{server.port}/", str(tmp_path / "out"), progress=False
        )
    local = convert(str(served), str(tmp_path / "local"), progress=False)[0]
    got, want = AtariZarrDataset(store.url), AtariZarrDataset(local.url)
    assert len(got) == len(want) == len(pong_source.truth().action)
    rows = np.arange(len(got))
    assert (got[rows]["observation"] == want[rows]["observation"]).all()


def test_huggingface_hubs_retries_reach_only_the_applications_logging(capsys, caplog) -> None:
    """huggingface_hub prints its 429 retries on stderr by a handler of its own, during a
    read: once an hf:// location is opened, they reach the application's logging only."""
    import logging

    pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import logging as hub_logging

    from atari_zarr.errors import AtariZarrError

    retries = hub_logging.get_logger("huggingface_hub.utils._http")
    with contextlib.suppress(AtariZarrError):  # offline here: only the opening matters
        FileSystem("hf://datasets/org/name", timeout=5)
    with caplog.at_level(logging.WARNING):
        retries.warning("Rate limited. Waiting 2s before retry [Retry 1/5].")
    assert capsys.readouterr().err == ""
    assert any("Rate limited" in r.getMessage() for r in caplog.records)


def test_a_server_that_ignores_range_is_read_from_the_whole_body(tmp_path: Path) -> None:
    """``python -m http.server`` answers a ranged GET with 200 and the whole object: a
    read of a block ended in ``ValueError: memoryview assignment``. The body is kept and
    every read takes its own bytes from it."""
    from atari_zarr_testkit.web import DirectoryServer

    blob = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(blob)
    with DirectoryServer(tmp_path) as server:
        fs, path = get_fs(f"{server.endpoint_url}/blob", {}, timeout=30)
        with fs.open(path, block_size=1000) as f:
            f.seek(5000)
            assert f.read(3000) == blob[5000:8000]
            f.seek(299_990)
            assert f.read(100) == blob[299_990:]
            f.seek(0)
            assert f.read() == blob


# --------------------------------------------------------------------------- #
# failure statuses: retried where transient, always named, never "absent"
# --------------------------------------------------------------------------- #


def test_a_web_servers_transient_5xx_is_retried_and_a_lasting_one_named(tmp_path: Path) -> None:
    """Three 503s on an http listing gave "not found" at once (fsspec's http file system
    answers any failure of ``info`` so, and does not retry); a lasting 500 did too. The
    transient ones are retried; a lasting one names its status, never absence."""
    from atari_zarr_testkit.web import DirectoryServer

    (tmp_path / "Asterix").mkdir()
    (tmp_path / "Asterix" / "run_1-00000-of-00050").write_bytes(b"x" * 10)
    with DirectoryServer(tmp_path) as web, CountingProxy(web.endpoint_url) as proxy:
        fs, path = get_fs(f"{proxy.endpoint_url}/Asterix", timeout=60)
        for status in (503, 500, 502, 429):
            proxy.fail_next(3, status)
            assert fs.exists(path), status
            assert [e[2] for e in proxy.log].count(status) == 3, proxy.log
            proxy.reset()
            fs.invalidate_cache()
            proxy.fail_next(3, status)
            assert [n.rsplit("/", 1)[-1] for n in fs.ls(path)] == ["run_1-00000-of-00050"]
            proxy.reset()
        for status, reason in ((500, "Internal Server Error"), (503, "Service Unavailable")):
            fs.invalidate_cache()
            proxy.fail_next(1000, status)
            for call in (lambda: fs.exists(path), lambda: fs.ls(path)):
                with pytest.raises(RemoteAccessError) as info:
                    call()
                text = str(info.value)
                assert not isinstance(info.value, FileNotFoundError), text
                assert f"{path}" in text and f"answered {status} {reason}" in text, text
            proxy.reset()
        # an absent object is still absent, at once
        assert not fs.exists(f"{path}/run_1-00001-of-00050")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "reason"), [(500, "Internal Server Error"), (429, "Too Many Requests")]
)
def test_a_lasting_failure_status_over_gs_is_named_and_shown_with_v(
    server: FakeGCSServer, status: int, reason: str
) -> None:
    """gcsfs retries a 500 or a 429 for about 31 s: with a shorter deadline the error
    said the server "did not answer in time", and ``-v`` showed none of the answers.
    The error names the status, and ``-v`` shows each response that had it."""
    import os
    import subprocess
    import sys

    with CountingProxy(server.endpoint_url) as proxy:
        options = server.storage_options(endpoint_url=proxy.endpoint_url)
        fs, path = get_fs(f"gs://{BUCKET}/failing", options, timeout=4)
        proxy.fail_next(100_000, status)
        with pytest.raises(RemoteTimeoutError) as info:
            fs.ls(path)
        text = str(info.value)
        assert f"gs://{BUCKET}/failing" in text and "did not answer" not in text, text
        assert f"the server answered {status} {reason}" in text, text
        args = ["ls", f"gs://{BUCKET}/failing", "--timeout", "4", "--no-index"]
        args += ["-s", f"endpoint_url={proxy.endpoint_url}", "-s", "token=anon"]
        done = subprocess.run(
            [sys.executable, "-m", "atari_zarr", "-v", *args],
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"},
            stdin=subprocess.DEVNULL,
        )
        proxy.reset()
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    shown = [line for line in lines if f"answered {status} {reason}" in line]
    assert len(shown) >= 2 and shown[0].startswith("INFO atari_zarr: GET "), done.stderr
    assert lines[-1].startswith("atari-zarr ls: error: ") and f"{status} {reason}" in lines[-1]


def test_a_server_that_ignores_range_is_streamed_never_held_whole(tmp_path: Path) -> None:
    """The whole body a server that ignores ``Range`` sends was read into memory before
    the first block was given (a shard of RL Unplugged: hundreds of MB a worker, and the
    whole transfer under one call's deadline): it is read on as a stream, a block at a
    time, so a prefix costs its blocks and memory holds a few of them."""
    import tracemalloc

    from atari_zarr_testkit.web import DirectoryServer

    size, block = 48 << 20, 1 << 20
    blob = np.random.default_rng(4).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "shard").write_bytes(blob)
    with DirectoryServer(tmp_path) as server:
        fs, path = get_fs(f"{server.endpoint_url}/shard", {}, timeout=60)
        with fs.open(path, block_size=block) as f:
            tracemalloc.start()
            try:
                first = f.read(block)
                second = f.read(3 * block)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert first == blob[:block] and second == blob[block : 4 * block]
            assert peak < size // 4, f"{peak:,} bytes held to read 4 MB of {size:,}"
            f.seek(block // 2)  # back: read again from the start, as a new stream
            assert f.read(block) == blob[block // 2 : block // 2 + block]
            f.seek(size - 10)
            assert f.read() == blob[-10:]


class _WrongServer:
    """A loopback server whose ranged GETs answer wrongly, as ``mode`` says."""

    def __init__(self, body: bytes, mode: str) -> None:
        import http.server
        import threading

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()

            def do_GET(self) -> None:
                spec = self.headers.get("Range", "bytes=0-").split("=", 1)[1]
                a, b = (int(x) if x else None for x in spec.split("-"))
                b = len(body) - 1 if b is None else b
                if outer.mode == "wrong-range":  # the right length, but from elsewhere
                    data, first = body[: b - a + 1], 0
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {first}-{b - a}/{len(body)}")
                elif outer.mode == "short":  # a 200 whose body ends early
                    data = body[: len(body) // 2]
                    self.send_response(200)
                else:  # "long": a 206 that sends more than the range
                    data = body[a:]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {a}-{b}/{len(body)}")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.mode = mode
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> _WrongServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode", ["wrong-range", "short", "long"])
def test_a_range_answered_wrongly_is_one_line_never_wrong_bytes(mode: str) -> None:
    """A 206 whose Content-Range is not the range asked gave its bytes as the range's;
    a body shorter than the object, or a 206 longer than the range, is named too."""
    body = bytes(range(256)) * 4096
    with _WrongServer(body, mode) as server:
        fs, path = get_fs(f"{server.url}/shard", {}, timeout=30)
        with fs.open(path, block_size=1000) as f, pytest.raises(RemoteAccessError) as info:
            f.seek(300_000)
            f.read(5000)
    text = str(info.value)
    assert "\n" not in text and f"{server.url}/shard" in text, text
