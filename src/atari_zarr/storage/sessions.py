"""HTTP sessions closed at exit, on the loop that made them: :func:`watch_store`,
:func:`watch_session`, :func:`close_sessions`.

A file system made by zarr's ``FsspecStore`` opens its aiohttp session on zarr's event
loop; gcsfs's own finalizer closes it at exit from another loop, which prints "Task
pending ... attached to a different loop" after every ``gs://`` command. So the sessions
of this package's remote stores (their file systems', and the Hub objects' own) are
closed here, at exit, on zarr's loop, before the file systems' finalizers run.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any

from atari_zarr.forks import after_fork

__all__ = ["close_sessions", "watch_session", "watch_store"]

# The file systems outlive the stores (fsspec caches them): they are what is watched.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
after_fork(_LIVE.clear)  # a parent's file systems are not a forked child's to close
_CLOSER = threading.Lock()
_closer_registered = False


class _Holder:
    """An aiohttp session of this package's own (the Hub's objects), watched as a file
    system's is."""

    def __init__(self, session: Any) -> None:
        self._session = session


_HELD: list[_Holder] = []
after_fork(_HELD.clear)


def watch_session(session: Any) -> None:
    """Close ``session`` (an ``aiohttp.ClientSession`` made on zarr's loop) at exit."""
    holder = _Holder(session)
    with _CLOSER:
        _HELD[:] = [h for h in _HELD if not h._session.closed]
        _HELD.append(holder)
    _watch_fs(holder)


def watch_store(store: Any) -> None:
    """Close the session of ``store``'s file system at exit (registered after zarr's own
    exit hook, so it runs first, while zarr's loop still runs)."""
    fs = getattr(store, "fs", None)
    if fs is not None:
        _watch_fs(fs)


def _watch_fs(fs: Any) -> None:
    global _closer_registered
    with _CLOSER:
        try:
            _LIVE.add(fs)
        except TypeError:  # pragma: no cover - a file system that takes no weak reference
            return
        if not _closer_registered:
            # weakref's own exit hook (which runs the file systems' finalizers) is set up
            # by the first finalizer of the process; making one now puts it before ours,
            # and exit hooks run last-in first-out: the sessions are closed before it
            weakref.finalize(watch_store, lambda: None)
            atexit.register(close_sessions)
            _closer_registered = True


def close_sessions() -> None:
    """Close the HTTP sessions of this process's remote stores, each on zarr's loop."""
    from zarr.core.sync import sync

    for fs in list(_LIVE):  # a forked child's: its own (a parent's are forgotten)
        session = getattr(fs, "_session", None)
        if session is None or getattr(session, "closed", True):
            continue
        try:
            sync(session.close(), timeout=2)
        except Exception:  # the loop is gone: drop the connections without it
            connector = getattr(session, "_connector", None)
            if connector is not None:
                connector._close()
