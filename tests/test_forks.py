"""One fork hook (forks.py): what a forked child makes anew, and nothing else asks which
process it is in."""

from __future__ import annotations

import gc
import os
import re
from pathlib import Path

import pytest

import atari_zarr
from atari_zarr import forks


class _Held:
    def __init__(self) -> None:
        self.renewed = 0
        forks.after_fork(self.renew)

    def renew(self) -> None:
        self.renewed += 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_hooks_run_in_the_child_and_an_objects_hook_goes_with_it() -> None:
    """Run in a forked child (every hook of the process runs, this process's sessions
    and pools are not to be dropped here): the hook of an object gone is gone too."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        kept, gone = _Held(), _Held()
        before = len(forks._HOOKS)
        del gone
        gc.collect()
        forks._after_fork_in_child()  # what os.register_at_fork runs (once more) in a child
        ok = kept.renewed == 1 and len(forks._HOOKS) < before
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"1"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_real_fork_runs_the_hooks_in_the_child_only() -> None:
    held = _Held()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, bytes([held.renewed]))
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"\x01" and held.renewed == 0


def test_no_module_compares_process_ids() -> None:
    """Fork safety is handled in one place: a pid is data (a lock's owner, a worker's
    parent), never compared to tell a forked child."""
    root = Path(atari_zarr.__file__).parent
    compared = re.compile(r"getpid\(\)\s*[!=]=|[!=]=\s*os\.getpid\(\)|_pid\s*[!=]=")
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert not found, found


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_reading_threads_hold_locks_reads(pong_store) -> None:
    """Every lock a reading thread takes (the engine's, the encoded bytes', the batch
    memory's, a column's, the store's, a mixture's episode index's) is new in a forked
    child: held in the parent at the fork, it would stay held in the child for ever."""
    import numpy as np

    from atari_zarr import MultiGameDataset

    mix = MultiGameDataset([pong_store.url, pong_store.url])
    mix[np.arange(8)]
    store = mix.members[0].store
    held = [
        store._lock,
        store._open_lock,
        store.pool._lock,
        store.action._lock,
        store.frames.engine._index_lock,
        store.frames.engine._stats_lock,
        store.columns["action"].reader.engine.kept._lock,
        mix._episode_index._lock,
    ]
    for lock in held:
        assert lock.acquire(timeout=5)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            import signal

            signal.alarm(60)  # a lock kept from the parent would hang the child: end it
            code = 1
            try:
                batch = mix[np.arange(len(mix) - 40, len(mix))]
                code = 0 if batch.batch_size == (40,) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        for lock in held:
            lock.release()
