"""The gathering thread: the rows ``np.take`` gives, off the caller's thread; one named
thread, stopped when closed; left alone in a forked child, which gathers again what the
parent had queued."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest

from atari_zarr.storage import row_gather
from atari_zarr.storage.row_gather import gatherer

TASKS = Path("/proc/self/task")
needs_tasks = pytest.mark.skipif(not TASKS.is_dir(), reason="threads' names from /proc")


def _rows_threads() -> int:
    """This process's threads named as the gathering thread is."""
    count = 0
    for task in TASKS.iterdir():
        try:
            count += (task / "comm").read_text().strip() == "atari_zarr-rows"
        except OSError:  # a thread that ended while listed
            pass
    return count


def _frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 7, 5), dtype=np.uint8)


def test_rows_gathered_on_the_thread_are_the_rows_np_take_gives() -> None:
    """Twenty gathers queued at once (more than the thread queues: submit waits), one of
    them empty, rows out of range clipped, waited for in reverse order (the waiter
    copies rows too): each is ``np.take``'s."""
    src = _frames(1000)
    rng = np.random.default_rng(1)
    indexes = [rng.integers(-5, 1010, int(rng.integers(1, 600))) for _ in range(20)]
    indexes[7] = np.zeros(0, dtype=np.int64)
    outs = [np.zeros((len(i), 7, 5), dtype=np.uint8) for i in indexes]
    with gatherer() as rows:
        assert rows.threaded
        pending = [rows.submit(src, i, o) for i, o in zip(indexes, outs, strict=True)]
        for p in reversed(pending):
            p.wait()
            p.wait()  # at once the second time
    for index, out in zip(indexes, outs, strict=True):
        np.testing.assert_array_equal(out, np.take(src, index, axis=0, mode="clip"))


def test_a_pending_gather_holds_the_arrays_its_thread_reads() -> None:
    """The caller may drop its own references: the source and index live until the wait."""
    out = np.zeros((300, 7, 5), dtype=np.uint8)
    with gatherer() as rows:
        pending = rows.submit(_frames(5000, seed=2), np.arange(4999, 4699, -1), out)
        gc.collect()
        pending.wait()
    np.testing.assert_array_equal(out, _frames(5000, seed=2)[4999:4699:-1])


@needs_tasks
def test_one_named_thread_per_gatherer_stopped_when_it_closes() -> None:
    before = _rows_threads()
    first, second = gatherer(), gatherer()
    assert _rows_threads() == before + 2
    out = np.zeros((10, 7, 5), dtype=np.uint8)
    first.submit(_frames(10), np.arange(10), out)  # queued, not waited for: close finishes it
    first.close()
    np.testing.assert_array_equal(out, _frames(10))
    assert _rows_threads() == before + 1
    with second:
        pass
    assert _rows_threads() == before
    first.close()  # a second time: nothing
    assert not first.threaded  # closed, it gathers with numpy
    first.submit(_frames(10), [3], out[:1]).wait()
    np.testing.assert_array_equal(out[:1], _frames(10)[3:4])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@needs_tasks
def test_a_forked_child_leaves_the_parents_thread_alone_and_gathers_on_its_own() -> None:
    """The child has none of the parent's threads: its copy of the gatherer forgets the
    parent's (never waited for) and starts its own at its next gather, stopped when
    closed; a new one starts a thread too."""
    src, index = _frames(800), np.arange(799, -1, -3)
    want = np.take(src, index, axis=0)
    rows = gatherer()
    out = np.zeros_like(want)
    rows.submit(src, index, out).wait()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            alone = _rows_threads() == 0 and not rows.threaded
            mine = np.zeros_like(want)
            rows.submit(src, index, mine).wait()
            alone = alone and rows.threaded and _rows_threads() == 1  # the child's own
            rows.close()  # the child's thread; the parent's would be waited for for ever
            with gatherer() as own:
                started = own.threaded and _rows_threads() == 1
                again = np.zeros_like(want)
                own.submit(src, index, again).wait()
            code = 0 if alone and started and (mine == want).all() and (again == want).all() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child did not finish within 120 s")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    again = np.zeros_like(want)
    rows.submit(src, index, again).wait()  # the parent's thread still works
    rows.close()
    np.testing.assert_array_equal(again, want)


def test_a_gather_queued_before_a_fork_is_gathered_whole_in_the_child() -> None:
    """A gather queued on the parent's thread behind six large ones, the process forked
    at once: the thread had copied none of its rows, or some, and it does not exist in
    the child. The child's wait gathers them again: its rows are ``np.take``'s."""
    src = np.random.default_rng(1).integers(0, 256, (2048, 84, 84), dtype=np.uint8)
    index = np.random.default_rng(2).integers(0, len(src), 1000)
    want = np.take(src, index, axis=0)
    ahead = np.empty((6000, 84, 84), dtype=np.uint8)  # 42 MB a gather, the thread busy
    rows = gatherer()
    for trial in range(3):
        busy = [rows.submit(src, np.arange(6000) % len(src), ahead) for _ in range(6)]
        out = np.zeros_like(want)
        pending = rows.submit(src, index, out)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                pending.wait()
                code = 0 if np.array_equal(out, want) else 2
            finally:
                os._exit(code)
        pending.wait()
        del busy
        deadline = time.monotonic() + 120  # a hang guard
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not finish within 120 s")
        assert os.waitstatus_to_exitcode(done[1]) == 0, trial
        np.testing.assert_array_equal(out, want)
    rows.close()


def test_without_the_compiled_loop_numpy_gathers_the_same_rows(monkeypatch) -> None:
    monkeypatch.setattr(row_gather, "_calls", lambda: None)
    src, index = _frames(100), np.array([99, 0, 150, -1, 42])
    out = np.zeros((5, 7, 5), dtype=np.uint8)
    with gatherer() as rows:
        assert not rows.threaded
        rows.submit(src, index, out).wait()
    np.testing.assert_array_equal(out, np.take(src, index, axis=0, mode="clip"))


def test_arrays_the_thread_cannot_take_are_gathered_at_once_by_numpy() -> None:
    """A strided destination: gathered before submit returns."""
    src = _frames(50)
    wide = np.zeros((6, 14, 5), dtype=np.uint8)
    with gatherer() as rows:
        rows.submit(src, [4, 8, 15, 16, 23, 42], wide[:, ::2])  # not contiguous
        np.testing.assert_array_equal(wide[:, ::2], src[[4, 8, 15, 16, 23, 42]])
        assert not wide[:, 1::2].any()
