"""The conversion lock (conversion/workdir.py) is held by one writer at a time, also
when two take it at the same moment: delays are injected from the test, around the
steps of taking it, never by the code under test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from atari_zarr.conversion import workdir as workdir_module
from atari_zarr.conversion.workdir import WorkDir, work_url
from atari_zarr.errors import StoreLockedError


def _race(store: Path, n: int = 2) -> tuple[list[WorkDir], list[BaseException]]:
    """``n`` threads take the lock of ``store`` at once; who got it, who was refused."""
    holders: list[WorkDir] = []
    refused: list[BaseException] = []
    start = threading.Barrier(n)

    def take() -> None:
        work = WorkDir(str(store))
        start.wait()
        try:
            work.acquire("cmd")
            holders.append(work)
        except StoreLockedError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=take) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return holders, refused


def test_a_lock_being_written_is_never_read_empty(tmp_path, monkeypatch):
    """Before: the lock file was created, then written; a reader in between found it
    empty, called it stale, and deleted it: both conversions held the lock."""
    real_fdopen, real_link = os.fdopen, os.link

    def slow_fdopen(*args, **kwargs):
        time.sleep(0.5)  # the writer is slow between creating its lock file and writing it
        return real_fdopen(*args, **kwargs)

    def slow_link(*args, **kwargs):
        time.sleep(0.5)  # likewise, just before its lock appears
        return real_link(*args, **kwargs)

    monkeypatch.setattr(workdir_module.os, "fdopen", slow_fdopen)
    monkeypatch.setattr(workdir_module.os, "link", slow_link)
    holders, refused = _race(tmp_path / "Pong" / "1.zarr")
    assert len(holders) == 1 and len(refused) == 1, (holders, refused)
    holders[0].release(remove_all=True)


def test_taking_over_a_stale_lock_is_one_takeover(tmp_path, monkeypatch):
    """Before: two takers both read the dead owner's lock, one took it over, then the
    other deleted that new lock and took it too."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True, text=True, check=True,
    )
    store = tmp_path / "Pong" / "1.zarr"
    work = Path(work_url(str(store)))
    work.mkdir(parents=True)
    stale = {
        "host": socket.gethostname(), "pid": int(dead.stdout), "token": "dead",
        "started": 0, "heartbeat": 0, "command": "atari-zarr convert ...",
    }
    (work / "lock.json").write_text(json.dumps(stale))
    real_stale = WorkDir._stale
    calls = []

    def slow_to_decide(self, owner):
        verdict = real_stale(self, owner)
        calls.append(owner.get("token"))
        if owner.get("token") == "dead" and len(calls) == 1:
            time.sleep(0.5)  # the first taker dawdles after judging the lock stale
        return verdict

    monkeypatch.setattr(WorkDir, "_stale", slow_to_decide)
    holders, refused = _race(store)
    assert len(holders) == 1 and len(refused) == 1, (holders, refused, calls)
    owner = json.loads((work / "lock.json").read_text())
    assert owner["token"] == holders[0]._token
    holders[0].release(remove_all=True)


def test_many_takers_one_holder(tmp_path):
    holders, refused = _race(tmp_path / "Pong" / "1.zarr", n=6)
    assert len(holders) == 1 and len(refused) == 5
    assert os.path.exists(work_url(str(tmp_path / "Pong" / "1.zarr")) + "/lock.json")
    holders[0].release(remove_all=True)


@pytest.mark.parametrize("backend", ["gs", "s3"])
def test_a_bucket_lock_is_created_with_one_conditional_request(backend, monkeypatch):
    """On a bucket the lock is created only if absent, by the server (GCS
    ifGenerationMatch=0, S3 If-None-Match): a taker that saw no lock, because another
    created it right after it looked, still cannot overwrite it."""
    from atari_zarr_testkit.gcs import FakeGCSServer
    from atari_zarr_testkit.s3 import MotoS3Server

    from atari_zarr.storage.filesystem import FileSystem

    server = FakeGCSServer() if backend == "gs" else MotoS3Server()
    with server:
        server.create_bucket("locks")
        url = f"{backend}://locks/Pong/1.zarr"
        first = WorkDir(url, server.storage_options())
        first.acquire("first")
        try:
            # the second taker looks before the first lock exists, then writes after it
            monkeypatch.setattr(FileSystem, "exists", lambda self, path: False)
            second = WorkDir(url, server.storage_options())
            with pytest.raises(StoreLockedError, match="being written by another conversion"):
                second.acquire("second")
            assert first._read_lock()["command"] == "first"
        finally:
            monkeypatch.undo()
            first.release(remove_all=True)


_OTHER_PROCESS = """
import json, sys
from atari_zarr.conversion.workdir import WorkDir
work = WorkDir(sys.argv[1], json.loads(sys.argv[2]))
work.mark("shard-1")
work.mark_scan(1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gs", "s3"])
def test_markers_other_processes_write_in_a_bucket_are_listed(backend):
    """A conversion's worker processes write its markers and scans; the process that
    plans lists them. Its listings came from the process's cache of earlier listings
    (gcsfs, s3fs), so markers written since by other processes were never seen: the
    first resume rescanned the same shards for ever, or ended in "work never recorded
    as done". Every listing of the work area is the server's."""
    from atari_zarr_testkit.gcs import FakeGCSServer
    from atari_zarr_testkit.s3 import MotoS3Server

    server = FakeGCSServer() if backend == "gs" else MotoS3Server()
    with server:
        server.create_bucket("work")
        url, options = f"{backend}://work/Pong/1.zarr", server.storage_options()
        work = WorkDir(url, options)
        work.mark("shard-0")
        work.mark_scan(0)
        assert (work.done(), work.scans_done()) == ({"shard-0"}, {0})  # listed once
        subprocess.run(
            [sys.executable, "-c", _OTHER_PROCESS, url, json.dumps(options)],
            check=True,
            timeout=120,
        )
        assert work.done() == {"shard-0", "shard-1"}
        assert work.scans_done() == {0, 1}
