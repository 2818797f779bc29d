"""What this machine gives this process: cores and memory.

Container limits count: a job pinned to 2 of 64 cores, or given 8 GB of a 256 GB
machine, sizes its threads, workers and caches by what it was given, not by the host.

Examples
--------
>>> cpu_count() >= 1, memory_bytes() > 0
(True, True)
"""

from __future__ import annotations

import os

from atari_zarr.forks import after_fork

__all__ = ["cpu_count", "memory_bytes", "process_memory"]


def cpu_count() -> int:
    """Cores this process may run on (its CPU affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def memory_bytes() -> int:
    """The memory this process may use, in bytes: the machine's physical memory, or less
    where a container's memory limit (cgroup v2 or v1) or an address-space limit
    (``ulimit -v``) says so (0 where the system does not tell)."""
    try:
        found = [int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))]
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0
    for limit_file in (
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ):
        try:
            with open(limit_file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            found.append(int(text))
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY and soft > 0:
            found.append(int(soft))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
        pass
    return min(found)


_MEMORY: list[int] = []
after_fork(_MEMORY.clear)  # a forked child may be given other limits: it reads them again


def process_memory() -> int:
    """:func:`memory_bytes`, read once per process (a forked child reads it again).

    Readers ask on every store they open and every batch they size; the cgroup's files
    need not be read each time.
    """
    if not _MEMORY:
        _MEMORY.append(memory_bytes())
    return _MEMORY[0]
