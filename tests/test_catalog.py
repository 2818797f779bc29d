"""The one catalog of stores: states, listings, the stores datasets offer, and remote
failures that are never mistaken for "not a store".

Remote cases talk to fake-gcs-server on 127.0.0.1 only.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fsspec
import pytest
from atari_zarr_testkit import FixtureRun, write_fixture_run
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

from atari_zarr import convert
from atari_zarr.catalog import (
    complete_stores,
    list_stores,
    name_to_url,
    store_state,
    write_catalog,
)
from atari_zarr.cli import main as cli_main
from atari_zarr.errors import (
    InvalidArgumentError,
    RemoteAccessError,
    RemoteTimeoutError,
    StoreCorruptError,
    StoreFormatError,
    StoreNotFoundError,
)
from atari_zarr.layout import create_store
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.read.mixing import MultiGameDataset
from atari_zarr.storage.remote import open_zarr_store

BUCKET = "atari-catalog"
UNFINISHED_COMMAND = "atari-zarr convert SRC DEST --runs 2"


def _unfinished_store(url: str, rows: int = 10, **options: Any) -> None:
    """A conversion that created its arrays and stopped: never marked complete."""
    store = open_zarr_store(url, options or None, read_only=False)
    attrs = {"kind": "dqn-replay", "game": "Pong", "run": "2", "command": UNFINISHED_COMMAND}
    create_store(store, rows, attrs)


@pytest.fixture
def mixed_root(pong_run: FixtureRun, source_root: Path, dest_root: Path) -> Path:
    """One complete store, one unfinished one, and things that are not stores."""
    convert(str(source_root), str(dest_root), progress=False, scheduler="synchronous")
    _unfinished_store(str(dest_root / "Pong" / "2.zarr"))
    (dest_root / "Pong" / "3.zarr").mkdir()  # a crash before anything was written
    (dest_root / "Pong" / "4.zarr").mkdir()
    (dest_root / "Pong" / "4.zarr" / "notes.txt").write_text("someone else's")
    return dest_root


# --------------------------------------------------------------------------- #
# states
# --------------------------------------------------------------------------- #


def test_store_states(mixed_root: Path, tmp_path: Path) -> None:
    pong = mixed_root / "Pong"
    assert store_state(str(pong / "1.zarr")) == "complete"
    assert store_state(str(pong / "2.zarr")) == "incomplete"
    assert store_state(str(pong / "3.zarr")) == "absent"  # empty directory
    assert store_state(str(pong / "4.zarr")) == "foreign"
    assert store_state(str(pong / "9.zarr")) == "absent"
    (tmp_path / "plain.zarr").mkdir()
    (tmp_path / "plain.zarr" / "zarr.json").write_text(
        json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})
    )
    assert store_state(str(tmp_path / "plain.zarr")) == "foreign"  # Zarr, but not ours
    (tmp_path / "junk.zarr").mkdir()
    (tmp_path / "junk.zarr" / "zarr.json").write_bytes(b"\x00not json")
    assert store_state(str(tmp_path / "junk.zarr")) == "foreign"
    (tmp_path / "file.zarr").write_text("a file")
    assert store_state(str(tmp_path / "file.zarr")) == "foreign"


def test_list_stores_gives_each_a_status(mixed_root: Path, pong_run: FixtureRun) -> None:
    rows = list_stores(str(mixed_root), sizes=False)
    assert [(r["run"], r["status"], r["transitions"]) for r in rows] == [
        ("1", "complete", len(pong_run.truth())),
        ("2", "incomplete", 10),
        ("3", "not a store", None),
        ("4", "not a store", None),
    ]
    assert rows[0]["url"] == str(mixed_root / "Pong" / "1.zarr")
    with pytest.raises(StoreNotFoundError, match="missing does not exist"):
        list_stores(str(mixed_root / "missing"))


def test_ls_shows_complete_and_unfinished_stores(
    mixed_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["ls", str(mixed_root)]) == 0
    _, *lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(str(mixed_root / "Pong" / "1.zarr"))
    assert lines[0].endswith("complete") and lines[1].endswith("incomplete")


# --------------------------------------------------------------------------- #
# datasets offer complete stores only (defect 5)
# --------------------------------------------------------------------------- #


def test_datasets_offer_only_complete_stores(mixed_root: Path, pong_run: FixtureRun) -> None:
    root = str(mixed_root)
    assert complete_stores(root) == ["Pong/1"]
    mix = MultiGameDataset.from_root(root)
    assert mix.games == ["Pong/1"] and len(mix) == len(pong_run.truth())
    with pytest.raises(StoreFormatError, match=r"\['Pong/2'\] are unfinished"):
        MultiGameDataset.from_root(root, ["Pong/2"])
    with pytest.raises(StoreNotFoundError, match="atari-zarr convert"):
        complete_stores(str(mixed_root / "missing"))


def test_torchrl_lists_only_complete_stores(mixed_root: Path) -> None:
    pytest.importorskip("torchrl")
    from atari_zarr.compat.torchrl import AtariZarrExperienceReplay

    root = str(mixed_root)
    assert AtariZarrExperienceReplay.list_datasets(root) == ["Pong/1"]
    replay = AtariZarrExperienceReplay("Pong/1", batch_size=4, root=root)
    assert replay.available_datasets == ["Pong/1"]
    with pytest.raises(StoreNotFoundError, match=r"Pong/2 is not in .*\['Pong/1'\]"):
        AtariZarrExperienceReplay("Pong/2", batch_size=4, root=root, download=False)


def test_name_to_url() -> None:
    assert name_to_url("gs://b/atari/", "Breakout/12") == "gs://b/atari/Breakout/12.zarr"


# --------------------------------------------------------------------------- #
# remote failures are remote errors, never "foreign" (defect 3)
# --------------------------------------------------------------------------- #


class _FaultyProxy(ThreadingHTTPServer):
    """Forwards requests to a server, answering ``status`` to those ``fails(method, path)``.

    Unlike ``CountingProxy.fail_next``, which fails the next requests whatever they
    are, this fails exactly the requests named, so the test does not depend on how
    many requests come first.
    """

    daemon_threads = True

    def __init__(self, target: str, fails: Callable[[str, str], bool], status: int) -> None:
        parts = urllib.parse.urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.fails = fails
        self.status = status
        self.failed: list[str] = []
        super().__init__(("127.0.0.1", 0), _FaultyHandler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a connection is not the test's concern

    def __enter__(self) -> _FaultyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join()


class _FaultyHandler(BaseHTTPRequestHandler):
    server: _FaultyProxy
    _SKIP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if self.server.fails(self.command, urllib.parse.unquote(self.path)):
            self.server.failed.append(self.path)
            message = b"injected failure"
            self.send_response(self.server.status)
            self.send_header("Content-Length", str(len(message)))
            self.end_headers()
            self.wfile.write(message)
            return
        conn = http.client.HTTPConnection(*self.server.target, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in self._SKIP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in self._SKIP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


@pytest.fixture(scope="module")
def server() -> Iterator[FakeGCSServer]:
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        yield srv


@pytest.mark.timeout(300)
@pytest.mark.parametrize("status", [403, 505])
def test_converting_over_a_store_whose_metadata_fails_is_a_remote_error(
    server: FakeGCSServer, tmp_path: Path, status: int
) -> None:
    """403 and 505 are final for gcsfs (no retries), so the failure comes at once."""
    source = tmp_path / "src"
    write_fixture_run(str(source), "Pong", "1", capacity=64, steps=300, seed=4)
    opts = server.storage_options()
    dest = f"gs://{BUCKET}/blip-{status}"
    [done] = convert(
        str(source),
        dest,
        progress=False,
        storage_options=opts,
        source_storage_options={},
        scheduler="synchronous",
    )
    root_meta = f"/{BUCKET}/o/blip-{status}/Pong/1.zarr/zarr.json?alt=media"

    def reads_root_metadata(method: str, path: str) -> bool:
        return method == "GET" and path.endswith(root_meta)

    with _FaultyProxy(server.endpoint_url, reads_root_metadata, status) as proxy:
        faulty = server.storage_options(endpoint_url=proxy.endpoint_url)
        with pytest.raises(RemoteAccessError) as info:
            convert(
                str(source),
                dest,
                progress=False,
                storage_options=faulty,
                source_storage_options={},
                scheduler="synchronous",
            )
        assert proxy.failed  # the metadata read was the one that failed
    message = str(info.value)
    assert f"{dest}/Pong/1.zarr/zarr.json" in message
    assert "--overwrite" not in message and "not an atari_zarr store" not in message
    # the complete store is untouched and still reads
    assert store_state(done.url, opts) == "complete"
    assert len(AtariZarrDataset(done.url, storage_options=opts)) == done.transitions


@pytest.mark.timeout(300)
def test_cli_convert_into_a_stalled_bucket_ends_at_the_deadline(
    source_root: Path,
    pong_run: FixtureRun,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ATARI_ZARR_TIMEOUT", "60")  # --timeout wins over the environment
    with FakeGCSServer() as private:
        private.create_bucket(BUCKET)
        flags = [f"-s{k}={v}" for k, v in private.storage_options().items()]
        private.pause()
        try:
            code = cli_main(
                ["convert", str(source_root), f"gs://{BUCKET}/x", "--timeout", "3", "-q", *flags]
            )
        finally:
            private.resume()
    assert code == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("atari-zarr convert: error: ")
    assert f"gs://{BUCKET}/x/Pong/1.zarr" in line and "within 3 s" in line
    assert os.environ["ATARI_ZARR_TIMEOUT"] == "60"  # the CLI passes it down, writes nothing


@pytest.mark.timeout(300)
def test_convert_and_verify_take_their_deadline_as_an_argument(
    source_root: Path, pong_run: FixtureRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    from atari_zarr import convert, verify_store

    monkeypatch.setenv("ATARI_ZARR_TIMEOUT", "600")  # the library does not read it
    with FakeGCSServer() as private:
        private.create_bucket(BUCKET)
        opts = private.storage_options()
        [done] = convert(
            str(source_root),
            f"gs://{BUCKET}/t",
            storage_options=opts,
            progress=False,
            max_episodes=1,
            timeout=30,
        )
        private.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(RemoteTimeoutError, match="within 2 s"):
                convert(
                    str(source_root),
                    f"gs://{BUCKET}/u",
                    storage_options=opts,
                    progress=False,
                    timeout=2,
                )
            report = verify_store(done.url, storage_options=opts, timeout=2)
            assert not report.ok and "within 2 s" in report.format()
            assert time.monotonic() - t0 < 60
        finally:
            private.resume()


@pytest.mark.timeout(300)
def test_a_stalled_server_has_no_state(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeGCSServer() as private:
        private.create_bucket(BUCKET)
        opts = private.storage_options()
        _unfinished_store(f"gs://{BUCKET}/s/Pong/2.zarr", **opts)
        assert store_state(f"gs://{BUCKET}/s/Pong/2.zarr", opts) == "incomplete"
        private.pause()
        try:
            with pytest.raises(RemoteTimeoutError, match="within 2 s"):
                store_state(f"gs://{BUCKET}/s/Pong/2.zarr", opts, timeout=2)
            with pytest.raises(RemoteTimeoutError):
                complete_stores(f"gs://{BUCKET}/s", opts, timeout=2)
        finally:
            private.resume()


# --------------------------------------------------------------------------- #
# catalog.json: one request, stale entries, writers at the same time
# --------------------------------------------------------------------------- #

CATALOG_BUCKET = "atari-catalog"


@pytest.fixture(scope="module")
def indexed() -> Iterator[dict[str, Any]]:
    """Three copies of the session's Pong store in a bucket, behind a counting proxy."""
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket(CATALOG_BUCKET)
        yield {"server": server, "proxy": proxy}


def _upload(server: FakeGCSServer, local: str, *names: str) -> None:
    fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
    for name in names:
        fs.put(local, f"{CATALOG_BUCKET}/{name}", recursive=True)


def test_a_catalog_is_read_with_one_request(indexed, pong_store, tmp_path) -> None:
    server, proxy = indexed["server"], indexed["proxy"]
    root = f"gs://{CATALOG_BUCKET}/one"
    _upload(server, pong_store.url, "one/Pong/1.zarr", "one/Pong/2.zarr", "one/Breakout/1.zarr")
    opts = server.storage_options(endpoint_url=proxy.endpoint_url)
    listed = list_stores(root, opts)
    proxy.reset()
    list_stores(root, opts, sizes=False)
    without = proxy.requests
    doc = write_catalog(root, opts)
    assert [e["path"] for e in doc["stores"]] == ["Breakout/1.zarr", "Pong/1.zarr", "Pong/2.zarr"]
    proxy.reset()
    assert list_stores(root, opts) == listed  # the same rows, sizes included
    assert proxy.requests == 1, proxy.log
    proxy.reset()
    assert complete_stores(root, opts) == ["Breakout/1", "Pong/1", "Pong/2"]
    assert proxy.requests == 1
    from atari_zarr.torchrl import AtariZarrExperienceReplay

    proxy.reset()
    assert AtariZarrExperienceReplay.list_datasets(root, opts) == ["Breakout/1", "Pong/1", "Pong/2"]
    assert proxy.requests == 1 < without
    # the CLI reads it too, and --no-index lists the root
    code = cli_main(["ls", root, "-q", *[f"-s{k}={v}" for k, v in opts.items()]])
    assert code == 0


def test_a_catalogued_bucket_root_opens_with_one_request_and_stale_entries_stop_their_reads(
    indexed, pong_store, source_root, pong_run, tmp_path
) -> None:
    server, proxy = indexed["server"], indexed["proxy"]
    opts = server.storage_options(endpoint_url=proxy.endpoint_url)
    root = f"gs://{CATALOG_BUCKET}/stale"
    _upload(server, pong_store.url, "stale/Pong/1.zarr", "stale/Pong/2.zarr", "stale/Pong/3.zarr")
    write_catalog(root, opts)
    proxy.reset()
    fresh = MultiGameDataset.from_root(root, storage_options=opts)
    assert proxy.requests == 1, proxy.log  # the catalog; no store is opened yet
    assert len(fresh) == 3 * pong_store.transitions
    # Pong/1 converted again with another selection; Pong/2 deleted
    [other] = convert(str(source_root), str(tmp_path / "other"), max_episodes=2, progress=False)
    fs = fsspec.filesystem("gs", skip_instance_cache=True, **opts)
    fs.rm(f"{CATALOG_BUCKET}/stale/Pong/1.zarr", recursive=True)
    fs.put(other.url, f"{CATALOG_BUCKET}/stale/Pong/1.zarr", recursive=True)
    fs.rm(f"{CATALOG_BUCKET}/stale/Pong/2.zarr", recursive=True)
    mixed = MultiGameDataset.from_root(root, storage_options=opts)
    last = mixed[len(mixed) - 1]  # Pong/3, as indexed
    assert last["row"].item() == pong_store.transitions - 1
    with pytest.warns(UserWarning, match="changed since its root's catalog.json was written"):
        with pytest.raises(
            StoreFormatError,
            match=r"stale/Pong/1.zarr holds .* `atari-zarr index gs://atari-catalog/stale`",
        ):
            mixed[0]  # never the old data, nor rows numbered by the old length
    with pytest.raises(
        StoreNotFoundError, match=r"stale/Pong/2.zarr, listed in .*atari-zarr index"
    ):
        mixed[pong_store.transitions]


def test_writers_finishing_at_once_lose_no_entry(indexed, pong_store, monkeypatch) -> None:
    """Writer A lists the root before B's store is complete, and its write lands after
    B's: A lists again after writing, sees B's store, and writes again."""
    from atari_zarr import catalog as catalog_module

    server = indexed["server"]
    opts = server.storage_options()
    root = f"gs://{CATALOG_BUCKET}/race"
    _upload(server, pong_store.url, "race/Pong/1.zarr")
    b_wrote = threading.Event()
    a_listed = threading.Event()
    real_write = catalog_module._write_json
    writes: list[tuple[str, list[str]]] = []

    def write(fs: Any, target: str, doc: dict[str, Any]) -> None:
        who = threading.current_thread().name
        if who == "A" and not writes:
            a_listed.set()
            assert b_wrote.wait(60)  # A's first (stale) write lands after B's
        real_write(fs, target, doc)
        writes.append((who, [e["path"] for e in doc["stores"]]))
        if who == "B":
            b_wrote.set()

    monkeypatch.setattr(catalog_module, "_write_json", write)

    def a() -> None:
        write_catalog(root, opts, sizes=False)

    def b() -> None:
        assert a_listed.wait(60)  # B's store completes after A listed the root
        _upload(server, pong_store.url, "race/Pong/2.zarr")
        write_catalog(root, opts, sizes=False)

    threads = [threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert writes[0] == ("B", ["Pong/1.zarr", "Pong/2.zarr"])
    assert writes[1] == ("A", ["Pong/1.zarr"])  # the stale write...
    assert writes[-1] == ("A", ["Pong/1.zarr", "Pong/2.zarr"])  # ...made good
    monkeypatch.undo()
    assert complete_stores(root, opts) == ["Pong/1", "Pong/2"]


def test_a_root_over_https_is_listed_from_its_catalog(indexed, pong_store) -> None:
    server, proxy = indexed["server"], indexed["proxy"]
    _upload(server, pong_store.url, "web/Pong/1.zarr")
    root = f"gs://{CATALOG_BUCKET}/web"
    https_root = f"{proxy.endpoint_url}/{CATALOG_BUCKET}/web"
    with pytest.raises(InvalidArgumentError, match="no catalog.json"):
        list_stores(https_root)
    write_catalog(root, server.storage_options())
    [row] = list_stores(https_root)
    assert row["url"] == f"{https_root}/Pong/1.zarr" and row["status"] == "complete"
    assert len(AtariZarrDataset(row["url"])) == pong_store.transitions


def test_index_and_convert_index_from_the_command_line(
    source_root, pong_run, tmp_path, capsys
) -> None:
    dest = tmp_path / "dest"
    assert cli_main(["convert", str(source_root), str(dest), "-q", "--no-progress", "--index"]) == 0
    doc = json.loads((dest / "catalog.json").read_text())
    assert [e["path"] for e in doc["stores"]] == ["Pong/1.zarr"]
    entry = doc["stores"][0]
    ds = AtariZarrDataset(str(dest / "Pong" / "1.zarr"))
    assert entry["transitions"] == len(ds) and entry["episodes"] == ds.num_episodes
    assert entry["return_mean"] == pytest.approx(float(ds.episode_table["return"].mean()))
    (dest / "catalog.json").unlink()
    assert cli_main(["index", str(dest)]) == 0
    assert "1 complete stores -> " in capsys.readouterr().out
    assert json.loads((dest / "catalog.json").read_text())["stores"] == doc["stores"]


def test_the_torchrl_drop_in_checks_its_catalog_entry(source_root, pong_run, tmp_path) -> None:
    from atari_zarr.torchrl import AtariZarrExperienceReplay

    dest = tmp_path / "dest"
    convert(str(source_root), str(dest), max_episodes=2, progress=False)
    write_catalog(str(dest))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh catalog: no warning
        AtariZarrExperienceReplay("Pong/1", batch_size=4, root=str(dest))
    [again] = convert(str(source_root), str(dest), max_episodes=3, overwrite=True, progress=False)
    with pytest.warns(UserWarning, match=r"Pong/1.zarr changed since .*atari-zarr index"):
        replay = AtariZarrExperienceReplay("Pong/1", batch_size=4, root=str(dest))
    assert len(replay) == again.transitions  # the store as it is, not as indexed


@pytest.mark.filterwarnings("always::UserWarning")  # the command line prints it, one line
@pytest.mark.parametrize(
    "spoil",
    [
        "deep",  # JSON nested beyond reason: a RecursionError in json
        "transitions",  # "transitions": "lots"
        "fields",  # entries with only path and content
        "escape",  # a path that leaves the root, listed as complete
    ],
)
def test_a_catalog_that_is_not_what_index_writes_is_not_read(
    pong_store_copy, spoil, capsys
) -> None:
    """Each used to be a traceback (or, for the path, a store outside the root listed as
    complete): the catalog is not used, with one warning, and the root is listed."""
    import json

    root = Path(pong_store_copy.url).parents[1]
    assert cli_main(["index", str(root), "-q"]) == 0
    catalog = root / "catalog.json"
    doc = json.loads(catalog.read_text())
    if spoil == "deep":
        catalog.write_text('{"format": 1, "stores": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        entry = doc["stores"][0]
        if spoil == "transitions":
            entry["transitions"] = "lots"
        elif spoil == "fields":
            doc["stores"][0] = {"path": entry["path"], "content": entry["content"]}
        else:
            doc["stores"].append({**entry, "path": "../../../../etc/passwd.zarr"})
        catalog.write_text(json.dumps(doc))
    assert cli_main(["ls", str(root)]) == 0
    out, err = capsys.readouterr()
    assert "passwd" not in out and "Pong/1.zarr" in out
    [warning] = err.strip().splitlines()
    assert warning.startswith("atari-zarr ls: warning: ") and "catalog.json" in warning
    assert "UserWarning" not in err


def test_a_card_of_a_catalog_listing_a_deleted_store_is_one_line(pong_store_copy, capsys):
    import shutil

    root = Path(pong_store_copy.url).parents[1]
    assert cli_main(["index", str(root), "-q"]) == 0
    shutil.rmtree(pong_store_copy.url)
    assert cli_main(["card", str(root)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "lists Pong/1.zarr, which is absent" in err
    assert "atari-zarr index" in err


@pytest.mark.parametrize(
    ("where", "what"), [("catalog.json", "fifo"), ("Pong/1.zarr/zarr.json", "dev-zero")]
)
def test_a_fifo_or_dev_zero_as_metadata_hangs_nothing(pong_store_copy, tmp_path, where, what):
    """In place of a root's catalog.json or a store's zarr.json: ls, index, card,
    from_root and list_datasets end (each in a process of its own, with a deadline), never
    read it: a bad catalog is not used, a bad store is not a store of ours."""
    import os
    import subprocess
    import sys

    root = Path(pong_store_copy.url).parents[1]
    # a second store, whole, so that the root still has one to list
    import shutil

    shutil.copytree(pong_store_copy.url, root / "Pong" / "2.zarr")
    target = root / where
    target.unlink(missing_ok=True)
    if what == "fifo":
        os.mkfifo(target)
    else:
        os.symlink("/dev/zero", target)
    code = (
        "import warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from atari_zarr import MultiGameDataset\n"
        "from atari_zarr.cli import main\n"
        "from atari_zarr.compat.torchrl import AtariZarrExperienceReplay\n"
        f"root = {str(root)!r}\n"
        "print(sorted(MultiGameDataset.from_root(root).games))\n"
        "print(AtariZarrExperienceReplay.list_datasets(root))\n"
        "for verb in ('ls', 'card', 'index'):\n"
        "    assert main([verb, root, '-q']) == 0, verb\n"
    )
    # one process of its own, with a deadline: a read of the FIFO would never end
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    games = done.stdout.splitlines()[0]  # the whole stores are still found
    assert games == ("['Pong/1']" if "zarr.json" in where else "['Pong/1', 'Pong/1']")


def test_a_relative_root_is_advised_relative(pong_store, tmp_path, monkeypatch):
    """`atari-zarr index` on a game directory or a store, given relative: the root to
    pass instead is the right parent, as the user would type it."""
    import shutil

    from atari_zarr.catalog import check_root
    from atari_zarr.errors import InvalidArgumentError

    shutil.copytree(pong_store.url, tmp_path / "gdir" / "Pong" / "1.zarr")
    monkeypatch.chdir(tmp_path / "gdir" / "Pong")
    for given, advised in (("1.zarr", r"Pass \.\., two levels up\.$"), (".", r"Pass \.\.$")):
        with pytest.raises(InvalidArgumentError, match=advised):
            check_root(given)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"Pass gdir$"):
        check_root("gdir/Pong")
    monkeypatch.chdir(tmp_path / "gdir")
    with pytest.raises(InvalidArgumentError, match=r"Pass \.$"):
        check_root("Pong")


def test_ls_of_a_cache_shows_its_subsets_and_the_stores_as_they_are(pong_store, tmp_path) -> None:
    """`ls CACHE` left out ``subsets/…`` stores, and with a ``catalog.json`` called a store
    complete that was since started over: a local root is listed, subsets included, and
    each store's own zarr.json gives its state; work areas are not stores."""
    import json
    import shutil

    home = tmp_path / "home"
    shutil.copytree(pong_store.url, home / "Pong" / "1.zarr")
    shutil.copytree(pong_store.url, home / "subsets" / "checkpoints-0" / "Pong" / "1.zarr")
    (home / "Pong" / "2.zarr.converting" / "done").mkdir(parents=True)
    write_catalog(str(home))
    meta = home / "Pong" / "1.zarr" / "zarr.json"  # started over since the catalog
    doc = json.loads(meta.read_text())
    doc["attributes"]["atari_zarr"]["complete"] = False
    meta.write_text(json.dumps(doc))
    rows = {r["url"][len(str(home)) + 1 :]: r["status"] for r in list_stores(str(home))}
    assert rows == {"Pong/1.zarr": "incomplete", "subsets/checkpoints-0/Pong/1.zarr": "complete"}


def test_a_store_converted_again_with_other_frames_has_another_content_id(tmp_path) -> None:
    """The same per-step data with other frames, converted again to the same place: the
    content id stayed the same, so a stream's state and a pickled dataset of the old
    store were taken by the new one (and a catalog entry still held)."""
    import pickle
    import shutil

    import numpy as np
    from atari_zarr_testkit import fixture_frame

    from atari_zarr import AtariZarrDataset
    from atari_zarr.catalog import check_entry, content_id
    from atari_zarr.errors import StoreChangedError

    def converted(frames: Callable[[int], np.ndarray] | None) -> str:
        shutil.rmtree(tmp_path / "src", ignore_errors=True)
        shutil.rmtree(tmp_path / "dst", ignore_errors=True)
        write_fixture_run(
            str(tmp_path / "src"), "Pong", "1", capacity=400, steps=600, seed=3, frames=frames
        )
        [store] = convert(str(tmp_path / "src"), str(tmp_path / "dst"), progress=False)
        return str(store.url)

    url = converted(None)
    old = AtariZarrDataset(url)
    stream = old.stream(64, seed=0, unit_rows=256)
    next(iter(stream))
    state, handed, was = stream.state_dict(), pickle.dumps(old), dict(old.metadata)
    assert converted(lambda k: 255 - fixture_frame(k)) == url
    new = AtariZarrDataset(url)
    assert not np.array_equal(new[5]["observation"], old[5]["observation"])
    for same in ("counts", "episodes", "conversion", "source", "plan_digest", "command"):
        assert new.metadata[same] == was[same]
    assert content_id(new.metadata) != content_id(was)
    with pytest.raises(InvalidArgumentError, match="store 0's content") as err:
        new.stream(64, seed=0, unit_rows=256).load_state_dict(state)
    assert "\n" not in str(err.value)
    with pytest.raises(StoreChangedError, match="was replaced since"):
        pickle.loads(handed)
    with pytest.warns(UserWarning, match="changed since its root's catalog.json"):
        assert not check_entry({"content": content_id(was)}, new.metadata, url)  # type: ignore[typeddict-item]


def test_index_and_card_leave_out_a_store_with_a_link_or_a_missing_object(
    pong_store_copy, tmp_path
) -> None:
    """``index`` (and ``card`` without a catalog) list only the stores whose every
    object named by their metadata is there and no link is inside: a cheap look (one
    listing a store); ``verify`` reads the chunks. A catalog that lists a store damaged
    since is refused by ``card`` in one line."""
    import shutil

    from atari_zarr.explore.card import card_text

    store = Path(pong_store_copy.url)
    root = store.parents[1]
    for run in ("2", "3"):
        shutil.copytree(store, root / "Pong" / f"{run}.zarr")
    private = tmp_path / "passwd"
    private.write_text("root:x:0:0:root:/root:/bin/bash\n")
    linked = root / "Pong" / "2.zarr" / "action" / "c" / "0"
    linked.unlink()
    linked.symlink_to(private)
    (root / "Pong" / "3.zarr" / "observation" / "c" / "0" / "0" / "0").unlink()
    with pytest.warns(UserWarning) as caught:
        doc = write_catalog(str(root))
        card = card_text(str(root))
    assert [e["path"] for e in doc["stores"]] == ["Pong/1.zarr"]
    said = " ".join(str(w.message) for w in caught)
    assert "2.zarr is left out: action/c/0 is a symbolic link" in said
    assert "3.zarr is left out: observation/c/0/0/0" in said and "is missing" in said
    assert "atari-zarr verify" in said
    assert [line for line in card.splitlines() if line.startswith("| Pong/")] == [
        line for line in card.splitlines() if line.startswith("| Pong/1 ")
    ]
    assert "Pong/2" not in card and "Pong/3" not in card
    # indexed clean, damaged since: card refuses the catalog's store in one line
    shutil.rmtree(root / "Pong" / "2.zarr")
    shutil.rmtree(root / "Pong" / "3.zarr")
    write_catalog(str(root))
    (store / "action" / "c" / "0").unlink()
    (store / "action" / "c" / "0").symlink_to(private)
    with pytest.raises(StoreCorruptError) as err:
        card_text(str(root))
    assert "action/c/0 is a symbolic link" in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- #
# folders that cannot be read
# --------------------------------------------------------------------------- #


def _without_read_override() -> None:
    """In the child, before exec: root's permission to read any folder (the capabilities
    DAC_OVERRIDE and DAC_READ_SEARCH) is dropped from its bounding set, so the command
    meets a folder of mode 000 as any other user does."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _cli_unprivileged(*args: str) -> tuple[int, str, str]:
    """``atari-zarr ARGS`` in a process that cannot read a folder of mode 000."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "atari_zarr", *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        preexec_fn=_without_read_override if os.geteuid() == 0 else None,
    )
    return done.returncode, done.stdout, done.stderr


def test_a_folder_that_cannot_be_read_is_skipped_with_one_warning(
    mixed_root: Path,
) -> None:
    """``ls /proc`` and ``index /proc`` ended in fsspec's PermissionError traceback: a
    folder under the root that cannot be read is skipped, named in one warning; the
    root itself unreadable is one line."""
    locked = [mixed_root / "Locked", mixed_root / "Pong" / "7.zarr"]
    for folder in locked:
        folder.mkdir()
        folder.chmod(0)
    try:
        code, out, err = _cli_unprivileged("ls", str(mixed_root), "--json")
        assert code == 0 and "Traceback" not in err, err
        assert [row["run"] for row in json.loads(out)] == ["1", "2", "3", "4"]
        assert err.count("\n") == 1, err
        warning = err.strip()
        assert "ls: warning: skipped 2 folders" in warning, warning
        assert all(str(folder) in warning for folder in locked), warning

        code, out, err = _cli_unprivileged("index", str(mixed_root))
        assert code == 0 and "Traceback" not in err, err
        assert "index: warning: skipped" in err and str(locked[0]) in err, err
        catalog = json.loads((mixed_root / "catalog.json").read_text())
        assert [entry["path"] for entry in catalog["stores"]] == ["Pong/1.zarr"]

        code, out, err = _cli_unprivileged("ls", str(locked[0]))
        assert code == 1 and err.count("\n") == 1, err
        assert f"error: {locked[0]} cannot be listed (Permission denied)" in err, err
    finally:
        for folder in locked:
            folder.chmod(0o755)
