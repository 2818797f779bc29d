"""Run a Dask task graph on any scheduler and report each finished task.

Conversion builds a plain Dask graph (a dict of ``key -> (function, *args)``)
and hands it here. The same graph runs on dask's local schedulers
(``"synchronous"``, ``"threads"``, ``"processes"``) and on a
``dask.distributed`` cluster (a ``Client`` or a scheduler address), and
``on_done(key)`` is called in the calling process as each task finishes, which
drives the progress bar: through a local-scheduler callback, or as futures
complete on a cluster.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from atari_zarr.errors import InvalidArgumentError, RemoteAccessError, import_optional
from atari_zarr.redaction import redact
from atari_zarr.resources import cpu_count
from atari_zarr.storage.paths import is_process_local

__all__ = [
    "LOCAL_SCHEDULERS",
    "check_scheduler",
    "default_scheduler",
    "describe_scheduler",
    "process_pool",
    "run_graph",
    "scheduler_for",
    "worker_processes",
]

log = logging.getLogger("atari_zarr")

LOCAL_SCHEDULERS = ("synchronous", "threads", "processes")

#: The process pool that graphs run on inside :func:`process_pool` (None: one per graph).
_POOL: contextvars.ContextVar[Any] = contextvars.ContextVar("atari_zarr_pool", default=None)


#: Seconds between a worker's checks that the process that started it is alive.
PARENT_CHECK_S = 0.5


def _init_worker(parent: int) -> None:
    """Set up a conversion worker process: dask's set-up, and an exit with its parent.

    The worker exits when the process that started it is gone (a ``kill -9`` of
    ``convert``): a watchdog thread sees the parent change. An orphan would otherwise
    live on, blocked on a pipe, and could finish an old task into a store written
    since (its unfinished task has no marker, so the next run redoes it).
    """
    import dask.multiprocessing

    dask.multiprocessing.initialize_worker_process(user_initializer=None)
    # Ctrl-C reaches every process of the terminal's group: the main process reports
    # it, in one line, and stops the workers; a worker printing its own traceback
    # would bury that line
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_S)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="atari-zarr-parent-watch", daemon=True).start()


class _QuietStart:
    """Started with Ctrl-C ignored (see :class:`_QuietContext`)."""

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            super().start()  # type: ignore[misc]  # pragma: no cover - pools start from main
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            super().start()  # type: ignore[misc]
        finally:
            signal.signal(signal.SIGINT, previous)


# module-level classes: a spawned worker's process object is pickled by reference
class _QuietSpawnProcess(_QuietStart, multiprocessing.context.SpawnProcess):
    pass


class _QuietForkServerProcess(_QuietStart, multiprocessing.context.ForkServerProcess):
    pass


class _QuietForkProcess(_QuietStart, multiprocessing.context.ForkProcess):
    pass


_QUIET = {
    "spawn": _QuietSpawnProcess,
    "forkserver": _QuietForkServerProcess,
    "fork": _QuietForkProcess,
}


class _QuietContext:
    """A multiprocessing context whose processes start with Ctrl-C ignored.

    A worker that receives SIGINT while it is still starting (a spawned worker imports
    the package first, about a second) would print its own ``KeyboardInterrupt``
    traceback under the main process's one line: :func:`_init_worker` runs too late
    to prevent it. A signal ignored when a process is started stays ignored in it, and
    Python then installs no ``KeyboardInterrupt`` handler, so the worker is quiet from
    its first instruction. The main process ignores Ctrl-C only while it starts one.
    """

    def __init__(self, context: Any) -> None:
        self._context = context
        self.Process = _QUIET.get(context.get_start_method(), context.Process)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def worker_processes(workers: int | None = None) -> Any:
    """A pool of ``workers`` processes (default: the cores given) as conversions use
    them: started with Ctrl-C ignored, dask's worker set-up, and each gone with its
    parent. A ``concurrent.futures.ProcessPoolExecutor``; ``verify`` reads with one too.
    """
    import functools
    from concurrent.futures import ProcessPoolExecutor

    import dask.multiprocessing

    if os.environ.get("PYTHONHASHSEED") in (None, "0"):
        os.environ["PYTHONHASHSEED"] = "6640"  # as dask.multiprocessing.get does
    context: Any = _QuietContext(dask.multiprocessing.get_context())
    return ProcessPoolExecutor(
        workers or cpu_count(),
        mp_context=context,
        initializer=functools.partial(_init_worker, os.getpid()),
    )


@contextlib.contextmanager
def process_pool(scheduler: Any, workers: int | None) -> Iterator[None]:
    """Run every graph inside on one process pool, when ``scheduler`` is ``"processes"``.

    Dask's ``"processes"`` scheduler otherwise starts a pool per graph, and each of
    its (spawned) workers imports the package again, about a second of CPU each. A
    conversion runs two graphs per run (scan, write): without one pool for all, a
    run of small shards spends more time starting workers than converting. Other
    schedulers: nothing changes.

    Examples
    --------
    >>> from operator import add
    >>> with process_pool("threads", 2):
    ...     run_graph({"a": (add, 1, 2)}, ["a"], scheduler="threads")
    """
    if _resolve(scheduler) != "processes" or _POOL.get() is not None:
        yield
        return
    pool = worker_processes(workers)
    token = _POOL.set(pool)
    finished = False
    try:
        yield
        finished = True
    finally:
        _POOL.reset(token)
        # interrupted or failed: no wait for the tasks still running; their workers
        # see this process gone and exit (_init_worker), and the next run redoes them
        pool.shutdown(wait=finished, cancel_futures=True)


def _default_client() -> Any:
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


def _resolve(scheduler: Any) -> Any:
    if scheduler is None:
        # a Client made active by the user wins, as in dask itself
        return _default_client() or "threads"
    if isinstance(scheduler, str) and scheduler in ("sync", "single-threaded"):
        return "synchronous"
    return scheduler


def describe_scheduler(scheduler: Any, workers: int | None) -> str:
    """Human-readable description, for logs.

    Examples
    --------
    >>> describe_scheduler("processes", 2)
    'processes (2 workers)'
    """
    scheduler = _resolve(scheduler)
    if isinstance(scheduler, str):
        if scheduler == "synchronous":
            return scheduler
        if scheduler in LOCAL_SCHEDULERS:
            return f"{scheduler} ({workers or cpu_count()} workers)"
        return f"dask.distributed at {scheduler}"
    return f"dask.distributed client {scheduler!r}"


def run_graph(
    graph: Mapping[Any, Any],
    keys: Sequence[Any],
    *,
    scheduler: Any = None,
    workers: int | None = None,
    on_done: Callable[[Any], None] | None = None,
    timeout: float | None = None,
) -> None:
    """Compute ``keys`` of ``graph``; call ``on_done(key)`` as each task finishes.

    Parameters
    ----------
    graph : mapping
        A Dask graph: ``key -> (callable, *args)``; args that are keys are replaced
        by those tasks' results.
    keys : sequence
        Keys to compute (their results are discarded).
    scheduler : None, str or distributed.Client
        ``"synchronous"``, ``"threads"``, ``"processes"``, a scheduler address
        (``"tcp://host:8786"``) or a ``Client``. ``None``: the active
        ``Client`` if there is one, else ``"threads"``.
    workers : int, optional
        Workers of a local scheduler (default: one per core). Ignored for a
        cluster, whose size is the cluster's.
    on_done : callable, optional
        Called with each finished task's key, in the calling process.
    timeout : float, optional
        Seconds to wait for a scheduler address to answer (at most dask's own
        ``distributed.comm.timeouts.connect``); an address that does not is
        :class:`~atari_zarr.errors.RemoteAccessError`.

    Examples
    --------
    >>> from operator import add
    >>> seen = []
    >>> run_graph({"a": (add, 1, 2), "b": (add, "a", 1)}, ["b"], scheduler="synchronous",
    ...           on_done=seen.append)
    >>> seen
    ['a', 'b']
    """
    scheduler = check_scheduler(scheduler, workers)
    done = on_done or (lambda key: None)
    if isinstance(scheduler, str) and scheduler in LOCAL_SCHEDULERS:
        _run_local(graph, keys, scheduler, workers, done)
    else:
        _run_distributed(graph, keys, scheduler, workers, done, timeout)


def check_scheduler(scheduler: Any, workers: int | None = None) -> Any:
    """Validate a scheduler choice (before any work starts); return it resolved.

    Examples
    --------
    >>> check_scheduler("sync")
    'synchronous'
    >>> check_scheduler("bogus")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: scheduler 'bogus' is not known: ...
    """
    if workers is not None and workers < 1:
        raise InvalidArgumentError(f"--workers {workers}: expected a number of workers >= 1.")
    scheduler = _resolve(scheduler)
    if isinstance(scheduler, str) and scheduler not in LOCAL_SCHEDULERS and "://" not in scheduler:
        raise InvalidArgumentError(
            f"scheduler {scheduler!r} is not known: expected one of {', '.join(LOCAL_SCHEDULERS)}, "
            f"a dask.distributed scheduler address (tcp://host:8786) or a Client."
        )
    return scheduler


def scheduler_for(scheduler: Any, workers: int | None, locations: Sequence[str]) -> Any:
    """The scheduler that runs tasks reading or writing ``locations``: ``scheduler``
    checked (:func:`check_scheduler`), unless one of them lives in this process's memory.

    A ``memory://`` location is a file system of each process's own: worker processes
    would write where this process never looks (and plan from scans it never sees).
    With one, the ``"processes"`` scheduler, asked for by name, runs its workers as
    threads of this process (with a warning: the CLI's default is threads there, see
    :func:`default_scheduler`), and a ``dask.distributed`` cluster is refused.

    Raises
    ------
    InvalidArgumentError
        A cluster's workers cannot reach a ``memory://`` location.

    Examples
    --------
    >>> scheduler_for("processes", 2, ["/data/src", "memory://out"])
    'threads'
    >>> scheduler_for("processes", 2, ["/data/src", "gs://b/out"])
    'processes'
    """
    resolved = check_scheduler(scheduler, workers)
    local = [str(where) for where in locations if is_process_local(str(where))]
    if not local:
        return resolved
    if isinstance(resolved, str) and resolved in LOCAL_SCHEDULERS:
        if resolved == "processes":
            # asked for by name (the CLI's default is threads here: default_scheduler)
            log.warning(
                "%s lives in this process's memory, which worker processes cannot reach: "
                "the workers of --scheduler processes run as threads of this process",
                redact(local[0]),
            )
            return "threads"
        return resolved
    raise InvalidArgumentError(
        f"{redact(local[0])} lives in the memory of this process, which the workers of "
        f"{describe_scheduler(resolved, workers)} cannot reach; "
        f"expected a location every worker reaches (a shared path, gs://, s3://). Choose "
        f"such a location, or leave out --scheduler to convert in this process."
    )


def default_scheduler(locations: Sequence[str]) -> str:
    """The CLI's scheduler when ``--scheduler`` is not given: worker processes, or
    threads of this process when one of ``locations`` lives in its memory
    (``memory://``), which worker processes cannot reach.

    Examples
    --------
    >>> default_scheduler(["/data/src", "gs://b/out"])
    'processes'
    >>> default_scheduler(["/data/src", "memory://out"])
    'threads'
    """
    if any(is_process_local(str(where)) for where in locations):
        return "threads"
    return "processes"


def _run_local(
    graph: Mapping[Any, Any],
    keys: Sequence[Any],
    scheduler: str,
    workers: int | None,
    done: Callable[[Any], None],
) -> None:
    import dask.local
    import dask.multiprocessing
    import dask.threaded
    from dask.callbacks import Callback

    class _Report(Callback):
        # dask calls this in the scheduling thread of this process, for every scheduler
        def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
            done(key)

    kwargs: dict[str, Any] = {}
    if scheduler == "synchronous":
        get = dask.local.get_sync
    else:
        get = dask.threaded.get if scheduler == "threads" else dask.multiprocessing.get
        kwargs["num_workers"] = workers or cpu_count()
        # One task per submission: dask's process pool otherwise batches up to 6 ready
        # tasks into one worker, and a task here is a whole checkpoint.
        kwargs["chunksize"] = 1
        if scheduler == "processes" and _POOL.get() is not None:
            kwargs["pool"] = _POOL.get()
    with _Report():
        get(dict(graph), list(keys), **kwargs)


def _run_distributed(
    graph: Mapping[Any, Any],
    keys: Sequence[Any],
    scheduler: Any,
    workers: int | None,
    done: Callable[[Any], None],
    timeout: float | None,
) -> None:
    distributed = import_optional(
        "distributed", extra="distributed", purpose=f"the scheduler {scheduler!r}"
    )
    own = isinstance(scheduler, str)
    client = _connect(distributed, scheduler, timeout) if own else scheduler
    if workers is not None:
        log.info("--workers %d ignored: the cluster decides how many workers run", workers)
    futures = client.get(dict(graph), list(keys), sync=False)
    try:
        for future in distributed.as_completed(futures):
            future.result()  # re-raises the task's exception here
            done(future.key)
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        if own:
            client.close()


def _connect(distributed: Any, address: str, timeout: float | None) -> Any:
    """A ``Client`` of the scheduler at ``address``, or one line when it does not answer."""
    import dask.config
    import dask.utils

    configured = dask.config.get("distributed.comm.timeouts.connect")
    seconds = float(dask.utils.parse_timedelta(configured, default="seconds") or 30)
    if timeout is not None:
        seconds = min(seconds, float(timeout))
    try:
        return distributed.Client(address, timeout=seconds)
    except (OSError, TimeoutError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise RemoteAccessError(
            f"the dask.distributed scheduler {redact(address)} did not answer within "
            f"{seconds:g} s ({reason}); expected a running scheduler at that address. "
            f"Start it (`dask scheduler`), check the address and port, or leave out "
            f"--scheduler to convert on this machine."
        ) from None
