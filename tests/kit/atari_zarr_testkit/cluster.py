"""A dask.distributed cluster on this machine, as the tests and examples start it.

:func:`local_cluster` starts a ``LocalCluster`` of worker processes (one thread each)
with its dashboard off and the scheduler's HTTP server on a free port (8787, its
default, may be taken, and distributed's fallback warning fails a test run with
warnings as errors), and a ``Client`` on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["local_cluster"]


@contextlib.contextmanager
def local_cluster(n_workers: int = 2) -> Iterator[tuple[Any, Any]]:
    """``(cluster, client)``: ``n_workers`` worker processes on 127.0.0.1, closed after."""
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield cluster, client
