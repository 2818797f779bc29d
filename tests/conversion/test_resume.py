"""Resume after kill -9, incomplete stores, and the lock against concurrent conversions."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zarr
from atari_zarr_testkit import store_files, write_fixture_run
from atari_zarr_testkit.pause import pause_command

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.conversion.workdir import LEASE_S, WorkDir, work_url
from atari_zarr.errors import StoreExistsError, StoreIncompleteError, StoreLockedError
from atari_zarr.layout import ATTRS_KEY, OBSERVATION
from atari_zarr.verify import verify_store


@pytest.fixture(scope="module")
def run5(tmp_path_factory):
    """Five checkpoints of 5000 rows: whole frame shards and shared ones."""
    root = tmp_path_factory.mktemp("src")
    run = write_fixture_run(
        str(root), "Pong", "1", capacity=5000, steps=22000, seed=4, max_episode_length=700
    )
    assert len(run.suffixes) >= 5
    return root


def start_paused(src: Path, dest: Path, after: int, *extra: str) -> subprocess.Popen:
    """Start a conversion that pauses once `after` checkpoints are written."""
    return subprocess.Popen(
        [
            *pause_command(dest.parent, "-lap-", after),
            "convert",
            str(src),
            str(dest),
            "--scheduler",
            "synchronous",
            "--no-progress",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for_pause(proc: subprocess.Popen, timeout: float = 120) -> None:
    """Block until the conversion says it paused (or fail after `timeout` seconds)."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError("the conversion never reached the pause")
    line = proc.stdout.readline()
    if line != b"paused\n":
        proc.wait(timeout=60)
        raise AssertionError(f"conversion ended early: {proc.stderr.read().decode()}")


def laps_done(dest: Path) -> int:
    done = Path(work_url(str(dest / "Pong" / "1.zarr"))) / "done"
    return len([p for p in done.iterdir() if p.name.startswith("lap-")])


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atari_zarr", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_killed_conversion_resumes_to_the_same_store(run5, tmp_path):
    dest = tmp_path / "out"
    store = dest / "Pong" / "1.zarr"
    proc = start_paused(run5, dest, 2)
    wait_for_pause(proc)
    assert laps_done(dest) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()

    # the half-written store refuses to open and names the command that finishes it
    with pytest.raises(StoreIncompleteError, match=r"is incomplete.*atari-zarr convert"):
        AtariZarrDataset(str(store))
    res = cli("verify", str(store), "--no-progress")
    assert res.returncode == 1 and "incomplete" in res.stderr
    before = {p: p.stat().st_mtime_ns for p in store.rglob("*") if "/c/" in str(p) and p.is_file()}
    assert before, "the killed run wrote some chunks"

    # the same command again finishes only the remaining work
    res = cli("-v", "convert", str(run5), str(dest), "--scheduler", "threads", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "resuming, 2 of" in res.stderr
    assert "stale lock" in res.stderr  # the killed run's lock was taken over
    untouched = [p for p, t in before.items() if p.stat().st_mtime_ns == t]
    assert untouched, "chunks written before the kill were written again"
    assert not Path(work_url(str(store))).exists()

    fresh = tmp_path / "fresh"
    convert(str(run5), str(fresh), scheduler="synchronous", progress=False)
    assert store_files(store, dest) == store_files(fresh / "Pong" / "1.zarr", fresh)
    assert verify_store(str(store), source=str(run5 / "Pong" / "1")).ok


@pytest.mark.slow
def test_concurrent_conversion_is_refused(run5, tmp_path):
    dest = tmp_path / "out"
    proc = start_paused(run5, dest, 1)
    try:
        wait_for_pause(proc)
        assert laps_done(dest) == 1
        held = rf"being written by another conversion \(pid {proc.pid} on host"
        with pytest.raises(StoreLockedError, match=held):
            convert(str(run5), str(dest), scheduler="synchronous", progress=False)
        res = cli("convert", str(run5), str(dest), "--no-progress")
        assert res.returncode == 1 and "being written by another conversion" in res.stderr
        # --overwrite does not break the lock either
        with pytest.raises(StoreLockedError):
            convert(str(run5), str(dest), overwrite=True, progress=False)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    # once its holder is dead, a different selection is refused, --overwrite starts over
    with pytest.raises(StoreIncompleteError, match="unfinished conversion of different input"):
        convert(str(run5), str(dest), checkpoints="0-2", progress=False)
    [store] = convert(str(run5), str(dest), checkpoints="0-2", overwrite=True, progress=False)
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    assert meta["complete"] and meta["source"]["checkpoints_selected"] == [0, 1, 2]
    assert verify_store(store.url, source=str(run5 / "Pong" / "1")).ok


def write_lock(store: Path, **owner) -> None:
    work = Path(work_url(str(store)))
    work.mkdir(parents=True)
    now = time.time()
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "token": "x",
        "started": now,
        "heartbeat": now,
        "command": "atari-zarr convert ...",
    }
    (work / "lock.json").write_text(json.dumps({**info, **owner}))


def test_lock_of_a_live_process_is_respected(tmp_path):
    store = tmp_path / "Pong" / "1.zarr"
    write_lock(store)  # held by this very (live) process
    with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
        WorkDir(str(store)).acquire("cmd")


def test_lease_decides_for_other_hosts(tmp_path):
    store = tmp_path / "Pong" / "1.zarr"
    write_lock(store, host="elsewhere.example", pid=1, heartbeat=time.time() - 5)
    with pytest.raises(StoreLockedError, match=r"host elsewhere\.example"):
        WorkDir(str(store)).acquire("cmd")
    (Path(work_url(str(store))) / "lock.json").unlink()
    write_lock(
        tmp_path / "b.zarr", host="elsewhere.example", pid=1, heartbeat=time.time() - LEASE_S - 1
    )
    work = WorkDir(str(tmp_path / "b.zarr"))
    work.acquire("cmd")  # the lease ran out: taken over
    owner = json.loads((Path(work.url) / "lock.json").read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    work.release(remove_all=True)
    assert not Path(work.url).exists()


def test_dead_local_pid_is_stale(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    store = tmp_path / "Pong" / "1.zarr"
    write_lock(store, pid=int(dead.stdout))
    work = WorkDir(str(store))
    work.acquire("cmd")
    work.release(remove_all=False)
    assert not (Path(work.url) / "lock.json").exists()


def test_leftovers_of_a_finished_conversion_are_cleaned(tmp_path, source_root, pong_run):
    """Killed after the completion marker but before the work area was removed."""
    dest = tmp_path / "out"
    [store] = convert(str(source_root), str(dest), progress=False)
    work = Path(work_url(store.url))
    (work / "done").mkdir(parents=True)
    (work / "done" / "lap-0").write_bytes(b"")
    write_lock_file = work / "lock.json"
    write_lock_file.write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "pid": 2**22 + 7,
                "token": "t",
                "started": 0,
                "heartbeat": 0,
            }
        )
    )
    with pytest.raises(StoreExistsError, match="already holds a complete store"):
        convert(str(source_root), str(dest), progress=False)
    assert not work.exists()


def test_killed_while_creating_the_arrays(tmp_path, source_root, pong_run):
    """The group's attributes exist but an array does not: the store is created again."""
    dest = tmp_path / "out"
    [store] = convert(str(source_root), str(dest), progress=False)
    expected = store_files(Path(store.url), dest)
    doc = json.loads((Path(store.url) / "zarr.json").read_text())
    meta = doc["attributes"][ATTRS_KEY]
    meta["complete"] = False
    doc.pop("consolidated_metadata", None)
    (Path(store.url) / "zarr.json").write_text(json.dumps(doc))
    shutil.rmtree(Path(store.url) / OBSERVATION)
    convert(str(source_root), str(dest), progress=False)
    assert store_files(Path(store.url), dest) == expected


def test_a_full_disk_is_one_line_and_the_same_command_resumes(tmp_path, source_root, pong_run):
    """ENOSPC while a shard is written (injected from the test, as the disk would raise it):
    one line naming DEST, the object and the space left; nothing is marked complete; the
    same command then finishes a store equal to one written in one go."""
    from atari_zarr_testkit.faults import full_disk_after

    from atari_zarr.errors import StoreWriteError

    dest = tmp_path / "out"
    with full_disk_after(3), pytest.raises(StoreWriteError) as info:
        convert(str(source_root), str(dest), progress=False, scheduler="synchronous")
    text = str(info.value)
    assert "\n" not in text and "the disk is full" in text and "MB free" in text
    assert "Pong/1.zarr" in text and "/c/" in text and "run the same command again" in text
    assert not zarr.open_group(str(dest / "Pong" / "1.zarr"), mode="r").attrs[ATTRS_KEY].get(
        "complete"
    )
    [store] = convert(str(source_root), str(dest), progress=False, scheduler="synchronous")
    [clean] = convert(
        str(source_root), str(tmp_path / "clean"), progress=False, scheduler="synchronous"
    )
    assert store_files(store.url, dest) == store_files(clean.url, tmp_path / "clean")


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out |= {int(p) for p in text}
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_workers_exit_when_convert_is_killed(run5, tmp_path):
    """kill -9 of convert's main process: its worker processes exit too (before, they
    lived on, blocked on a pipe, and could finish old tasks into a new store)."""
    dest = tmp_path / "out"
    # start_paused passes --scheduler synchronous first; the last --scheduler wins
    proc = start_paused(run5, dest, 1, "--scheduler", "processes", "--workers", "2")
    wait_for_pause(proc)
    workers = [p for p in _children(proc.pid) if "python" in Path(f"/proc/{p}/cmdline").read_text()]
    assert workers, "the conversion runs in worker processes"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in workers if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"orphaned workers {left}"


@pytest.mark.slow
def test_ctrl_c_is_one_line(run5, tmp_path):
    """SIGINT to the whole command (a terminal's Ctrl-C reaches every process of the
    group): one line, exit 130, no traceback from any worker."""
    dest = tmp_path / "out"
    proc = subprocess.Popen(
        [*pause_command(dest.parent, "-lap-", 1), "convert", str(run5), str(dest),
         "--no-progress", "--scheduler", "processes", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        # as from a terminal: a suite started in the background (`cmd &`) has SIGINT
        # ignored, which its children would inherit
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for_pause(proc)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()  # reaped, its pipes closed, whatever happened
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert text.strip().splitlines()[-1] == "atari-zarr convert: interrupted", text


# --------------------------------------------------------------------------- #
# a task of a conversion started over writes nothing
# --------------------------------------------------------------------------- #


def _snapshot(root: str) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()
    }


def test_a_stale_task_of_another_conversion_writes_nothing(source_root, pong_run, dest_root):
    """An orphaned write task of an earlier plan, run after `convert --overwrite` made
    another store, finds the store owned by no conversion of its own: it writes nothing."""
    from atari_zarr.conversion import converter, graph
    from atari_zarr.sources.registry import Selection, get_kind, plan_run

    [done] = convert(
        str(source_root), str(dest_root), checkpoints="0", max_transitions=20, progress=False
    )
    before = _snapshot(done.url)
    kind = get_kind("dqn-replay")
    [run] = kind.find_runs(str(source_root), ["Pong"], ["1"])
    # the plan of an earlier `convert` of another checkpoint, with as many rows
    options = converter.ConvertOptions(Selection("1", max_transitions=20), progress=False)
    plan = plan_run(kind, run, options.selection)
    stale = converter._job(kind, run, done.url, options, plan)
    part = plan.parts[0]
    with pytest.raises(StoreLockedError, match="writes nothing"):
        graph._part_task(dataclasses.replace(stale, conversion="c0ffee"), part)
    assert _snapshot(done.url) == before
    assert verify_store(done.url).ok
    # what the check prevents: the same task unchecked writes its old plan's frames
    # into the finished store
    graph._part_task(stale, part)
    after = _snapshot(done.url)
    assert after != before and after["observation/c/0/0/0"] != before["observation/c/0/0/0"]


def test_a_conversion_started_over_has_a_new_id(tmp_path):
    work = WorkDir(str(tmp_path / "Pong" / "1.zarr"))
    work.reset("plan-a")
    first = work.conversion_id()
    work.check_owner(first)
    work.reset("plan-a")  # --overwrite: the same plan, another conversion
    assert work.conversion_id() not in (None, first)
    with pytest.raises(StoreLockedError, match=f"conversion {first} found the store owned by"):
        work.check_owner(first)


def test_plain_verify_notices_a_step_shard_of_another_conversion(source_root, pong_run, tmp_path):
    """Where the store can tell: per-step data of another conversion disagrees with the
    episode table the store's own conversion recorded (frames and actions need
    ``verify --source``)."""
    [mine] = convert(
        str(source_root), str(tmp_path / "a"), checkpoints="0", max_transitions=40, progress=False
    )
    [other] = convert(
        str(source_root), str(tmp_path / "b"), checkpoints="1", max_transitions=40, progress=False
    )
    assert verify_store(mine.url).ok
    reward = Path(mine.url) / "next" / "reward" / "c" / "0"
    theirs = (Path(other.url) / "next" / "reward" / "c" / "0").read_bytes()
    assert theirs != reward.read_bytes()
    reward.write_bytes(theirs)
    report = verify_store(mine.url)
    assert not report.ok and "return" in report.format()


def _bucket_files(fs, root: str) -> dict[str, bytes]:
    """Every object below ``root`` in a bucket (its metadata, which names the place, out)."""
    return {
        p[len(root) :]: fs.cat_file(p)
        for p in fs.find(root)
        if not p.endswith("zarr.json") and ".converting" not in p
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fragment", "after"),
    [("-scan-", 1), ("-shard-", 1)],  # the scans' listing, the markers' listing
    ids=["some-scans-kept", "a-shard-written"],
)
def test_a_pull_into_a_bucket_killed_then_resumed_on_processes(
    public_copy, tmp_path, fragment, after
):
    """kill -9 of a pull into a gs:// home, then the same pull on worker processes: the
    first resume ended in "work never recorded as done" (a traceback) or ran on past
    ``--timeout``, scanning the same shards again and again. The process that plans read
    the work area's listings (``scans/done``, ``done``) from gcsfs's listing cache,
    filled at the start of the resume, while its worker processes wrote the markers:
    it never saw them. The resume finishes and gives the store a clean pull gives."""
    import gcsfs

    server = public_copy.server
    server.create_bucket("kill-home")
    home = f"gs://kill-home/{tmp_path.name}"
    args = ["pull", "Asterix/1", "--checkpoints", "0-3", "--home", home, "-s", "token=anon"]
    args += ["--workers", "2", "--no-progress", "--timeout", "10"]
    proc = subprocess.Popen(
        pause_command(tmp_path, fragment, after, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_pause(proc, timeout=240)
        workers = _children(proc.pid)  # the pool's workers (and the resource tracker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)
    deadline = time.monotonic() + 60  # the killed pull's workers exit with it
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in workers if _alive(p)]

    resumed = subprocess.Popen(
        [sys.executable, "-m", "atari_zarr", "-v", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = resumed.communicate(timeout=300)  # a hang guard: it takes seconds
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "stale lock" in err
    url = f"{home}/subsets/"
    assert f"-> {url}" in out

    from atari_zarr.pull import Request, pull

    clean = pull(
        Request.parse("Asterix/1", checkpoints=[0, 1, 2, 3]),
        home=tmp_path / "clean",
        scheduler="synchronous",
        progress=False,
    )
    fs = gcsfs.GCSFileSystem(**server.storage_options(), skip_instance_cache=True)
    found = out.split(" -> ", 1)[1].split()[0][len("gs://") :]
    assert not fs.exists(found + ".converting")  # the work area went with the finish
    local = {
        p.relative_to(clean.url).as_posix(): p.read_bytes()
        for p in Path(clean.url).rglob("*")
        if p.is_file() and p.name != "zarr.json"
    }
    assert _bucket_files(fs, found + "/") == local
