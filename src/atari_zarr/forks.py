"""What a process forked from this one makes anew: one hook, run by ``os.register_at_fork``.

A forked child (a DataLoader worker, a dask worker started by fork) inherits its
parent's memory but none of its other threads: a lock another thread held stays held,
a thread pool has no threads behind it, an HTTP session's sockets and event loop are
the parent's, and a cache sized for the parent's share of memory is not the child's.
Every object that holds such things registers a method with :func:`after_fork`, and
the child calls each one still alive, in the order registered, before it runs
anything else. Nothing else in the package asks which process it is in.

Examples
--------
>>> class Pool:
...     def __init__(self):
...         self.threads = ["t"]
...         after_fork(self.forget)
...     def forget(self):
...         self.threads = []
>>> pool = Pool()
>>> _after_fork_in_child()  # what a fork runs in the child
>>> pool.threads
[]
"""

from __future__ import annotations

import os
import threading
import types
import weakref
from collections.abc import Callable

__all__ = ["after_fork"]

_HOOKS: list[weakref.WeakMethod | Callable[[], None]] = []
_LOCK = threading.Lock()
_PRUNED = 64


def after_fork(hook: Callable[[], None]) -> None:
    """Call ``hook`` in every child forked from this process from now on.

    A method of an object is held weakly (the object may go; its hook goes with it);
    a function, or a method of a built-in (``a_list.clear``), for the life of the
    process. The hook runs in the child, with
    no other thread alive: it should only drop and replace what it holds (locks,
    pools, caches, sessions), never wait for anything.
    """
    global _PRUNED
    ref = weakref.WeakMethod(hook) if isinstance(hook, types.MethodType) else hook
    with _LOCK:
        if len(_HOOKS) >= 2 * _PRUNED:  # the hooks of objects gone, dropped now and then
            _HOOKS[:] = [h for h in _HOOKS if not isinstance(h, weakref.WeakMethod) or h()]
            _PRUNED = max(64, len(_HOOKS))
        _HOOKS.append(ref)


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # another thread of the parent may have held it
    alive = []
    for ref in _HOOKS:
        hook = ref() if isinstance(ref, weakref.WeakMethod) else ref
        if hook is not None:
            hook()
            alive.append(ref)
    _HOOKS[:] = alive


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
