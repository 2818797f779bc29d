"""What a process is given: cores by its affinity, memory by its limits."""

import os
import subprocess
import sys

import pytest

from atari_zarr.resources import cpu_count, memory_bytes


def _in_child(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_cores_are_those_the_process_may_run_on():
    assert cpu_count() == len(os.sched_getaffinity(0))
    one = sorted(os.sched_getaffinity(0))[0]
    got = _in_child(
        f"import os; os.sched_setaffinity(0, {{{one}}}); "
        "from atari_zarr.resources import cpu_count; print(cpu_count())"
    )
    assert got == "1"


def test_memory_is_bounded_by_an_address_space_limit():
    total = memory_bytes()
    assert total > 0
    limit = 3 << 30
    got = _in_child(
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
        "from atari_zarr.resources import memory_bytes; print(memory_bytes())"
    )
    assert int(got) == min(total, limit)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_conversion_workers_default_to_the_cores_given():
    one = sorted(os.sched_getaffinity(0))[0]
    got = _in_child(
        f"import os; os.sched_setaffinity(0, {{{one}}}); "
        "from atari_zarr.conversion.scheduling import describe_scheduler; "
        "print(describe_scheduler('processes', None))"
    )
    assert got == "processes (1 workers)"
