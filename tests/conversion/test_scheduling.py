"""The store is byte-identical whatever the scheduler and worker count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from atari_zarr_testkit import store_files, write_fixture_run

from atari_zarr import convert
from atari_zarr.conversion.scheduling import run_graph
from atari_zarr.conversion.workdir import work_url
from atari_zarr.layout import OBSERVATION
from atari_zarr.verify import verify_store


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    """Checkpoints larger than a frame shard, so whole shards and shared ones both occur."""
    root = tmp_path_factory.mktemp("src")
    run = write_fixture_run(
        str(root), "Pong", "1", capacity=5000, steps=13000, seed=3, max_episode_length=900
    )
    return root, run


@pytest.fixture(scope="module")
def reference(big_run, tmp_path_factory):
    root, _ = big_run
    dest = tmp_path_factory.mktemp("ref")
    [store] = convert(str(root), str(dest), scheduler="synchronous", progress=False)
    return store, store_files(store.url, dest)


def test_reference_is_sound(big_run, reference):
    root, run = big_run
    store, files = reference
    assert store.transitions == len(run.truth())
    # every frame shard is there, including those written whole by one checkpoint
    shards = [k for k in files if k.startswith(f"{OBSERVATION}/c/")]
    assert len(shards) == -(-store.transitions // 4096) >= 3
    assert not Path(work_url(store.url)).exists()  # the work area is gone
    assert verify_store(store.url, source=str(root / "Pong" / "1")).ok


@pytest.mark.parametrize(
    ("scheduler", "workers"), [("threads", 1), ("threads", 3), ("processes", 2)]
)
@pytest.mark.slow
def test_local_schedulers_write_the_same_bytes(big_run, reference, tmp_path, scheduler, workers):
    root, _ = big_run
    [store] = convert(
        str(root), str(tmp_path), scheduler=scheduler, workers=workers, progress=False
    )
    assert store_files(store.url, tmp_path) == reference[1]


@pytest.mark.slow
def test_distributed_local_cluster_writes_the_same_bytes(big_run, reference, tmp_path, capsys):
    pytest.importorskip("distributed")
    from atari_zarr_testkit.cluster import local_cluster

    root, _ = big_run
    with local_cluster(2) as (cluster, client):
        [store] = convert(str(root), str(tmp_path / "a"), scheduler=client, progress=True)
        assert store_files(store.url, tmp_path / "a") == reference[1]
        # the bar advanced as futures completed
        assert "write Pong/1: 100%" in capsys.readouterr().err
        # the same cluster by address
        [store] = convert(
            str(root), str(tmp_path / "b"), scheduler=cluster.scheduler_address, progress=False
        )
        assert store_files(store.url, tmp_path / "b") == reference[1]
        # tasks ran in the workers, not here
        pids = client.run(os.getpid)
        assert os.getpid() not in pids.values() and len(pids) == 2


def test_direct_shard_writes_equal_zarr_writes(big_run, reference, tmp_path, monkeypatch):
    """Whole frame shards are encoded without zarr (shards.py): the bytes are zarr's."""
    from atari_zarr.conversion import graph

    root, _ = big_run
    calls = []
    real = graph.shard_encoder
    monkeypatch.setattr(graph, "shard_encoder", lambda arr: calls.append(real(arr)) or None)
    [store] = convert(str(root), str(tmp_path), scheduler="synchronous", progress=False)
    assert calls and all(c is not None for c in calls)  # the fast path exists, was bypassed
    assert store_files(store.url, tmp_path) == reference[1]


def test_cli_progress_bar_and_workers(pong_run, source_root, tmp_path):
    import subprocess
    import sys

    def run(*extra):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "atari_zarr",
                "convert",
                str(source_root),
                str(tmp_path / "o"),
                "--scheduler",
                "threads",
                "--workers",
                "2",
                "--overwrite",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )

    res = run()
    assert res.returncode == 0, res.stderr
    n = len(pong_run.suffixes)
    assert "write Pong/1: 100%" in res.stderr and f"{n}/{n}" in res.stderr
    res = run("--no-progress")
    assert res.returncode == 0 and "100%" not in res.stderr
    res = run("--scheduler", "bogus")
    assert res.returncode == 1 and "scheduler 'bogus' is not known" in res.stderr
    assert not (tmp_path / "o" / "Pong" / "1.zarr.converting").exists()  # refused up front


def _sigint_handler(queue) -> None:
    import signal

    queue.put(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)


def test_pool_workers_ignore_ctrl_c_from_their_first_instruction():
    """A worker spawned for the pool starts with SIGINT ignored (so Ctrl-C while it is
    still importing prints no traceback of its own); the main process's handler is back
    once the worker is started."""
    import multiprocessing
    import signal

    from atari_zarr.conversion.scheduling import _QuietContext

    context = _QuietContext(multiprocessing.get_context("spawn"))
    queue = context.Queue()
    before = signal.getsignal(signal.SIGINT)
    worker = context.Process(target=_sigint_handler, args=(queue,))
    worker.start()
    try:
        assert queue.get(timeout=60) is True
    finally:
        worker.join(timeout=60)
    assert signal.getsignal(signal.SIGINT) is before
    plain = multiprocessing.get_context("spawn")
    queue = plain.Queue()
    worker = plain.Process(target=_sigint_handler, args=(queue,))
    # a process started in the background (`cmd &`) has SIGINT ignored, and children
    # inherit that: the plain worker is started from a parent that handles Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        worker.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert queue.get(timeout=60) is False  # what the quiet context changes
    finally:
        worker.join(timeout=60)


def test_an_unreachable_scheduler_is_one_line_within_the_timeout() -> None:
    """``--scheduler tcp://HOST:PORT`` with nothing listening ended in distributed's
    traceback after its own 30 s: one line, within the caller's timeout."""
    from operator import add

    from atari_zarr_testkit.ports import fresh_port

    from atari_zarr.errors import RemoteAccessError

    address = f"tcp://127.0.0.1:{fresh_port()}"
    with pytest.raises(RemoteAccessError) as info:
        run_graph({"a": (add, 1, 2)}, ["a"], scheduler=address, timeout=2)
    text = str(info.value)
    assert "\n" not in text and address in text and "within 2 s" in text
    assert "leave out --scheduler" in text


def test_a_memory_destination_converts_with_the_default_scheduler(pong_run, source_root, capsys):
    """``convert SRC memory://x`` ran its workers as processes, each writing a
    ``memory://`` of its own, and ended in zarr's ``GroupNotFoundError`` traceback: the
    workers run as threads of the process that holds the memory, and the store is there."""
    from atari_zarr import AtariZarrDataset
    from atari_zarr.cli import main

    dest = f"memory://cli-{os.getpid()}-{id(pong_run)}"
    code = main(["convert", str(source_root), dest, "--no-progress", "--timeout", "10"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"-> {dest}/Pong/1.zarr" in out
    ds = AtariZarrDataset(f"{dest}/Pong/1.zarr")
    assert len(ds) == len(pong_run.truth())
    assert verify_store(f"{dest}/Pong/1.zarr", source=str(source_root / "Pong" / "1")).ok


def test_a_memory_location_is_refused_for_a_cluster_in_one_line(pong_run, source_root) -> None:
    """The workers of a dask cluster cannot reach this process's memory: refused before
    the cluster is asked (nothing listens at the address) and before any work."""
    from atari_zarr_testkit.ports import fresh_port

    from atari_zarr.errors import InvalidArgumentError

    address = f"tcp://127.0.0.1:{fresh_port()}"
    dest = f"memory://cluster-{os.getpid()}"
    with pytest.raises(InvalidArgumentError) as info:
        convert(str(source_root), dest, scheduler=address, progress=False, timeout=5)
    text = str(info.value)
    assert "\n" not in text and dest in text and address in text
    assert "leave out --scheduler" in text


def test_processes_asked_for_by_name_with_a_memory_location_are_told(pong_run, source_root, caplog):
    """``--scheduler processes`` with a ``memory://`` destination ran as threads with
    nothing said but an INFO line (``-v``), as the default did. Asked for by name, the
    switch is one warning naming the location; the default (threads there) says nothing."""
    import logging

    from atari_zarr.cli import main

    def warnings(args: list[str]) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="atari_zarr"):
            assert main(["convert", str(source_root), *args, "--no-progress"]) == 0
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    base = f"memory://told-{os.getpid()}-{id(pong_run)}"
    assert warnings([f"{base}/default"]) == []
    [told] = warnings([f"{base}/named", "--scheduler", "processes"])
    assert f"{base}/named" in told and "threads" in told and "\n" not in told
    assert warnings([f"{base}/threads", "--scheduler", "threads"]) == []
