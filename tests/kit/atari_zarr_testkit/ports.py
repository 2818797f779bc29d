"""Loopback ports for the local servers of the test harness, never one used twice.

fsspec caches a file system instance per set of options, and the options of a local
server name its port. A server on a port that an earlier server of the same process
had would therefore be handed that server's instance, with its listing cache and its
pooled connections. :func:`fresh_port` and :func:`claim_port` keep the ports handed
out in this process apart, so every server gets its own instance. See
``docs/gcs-emulator.md``.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["LOOPBACK", "claim_port", "fresh_port"]

#: The only interface the harness binds or talks to.
LOOPBACK = "127.0.0.1"

_ATTEMPTS = 1000
_claimed: set[int] = set()
_lock = threading.Lock()


def claim_port(port: int) -> bool:
    """Record ``port`` as used by this process; ``False`` if it was handed out before.

    Parameters
    ----------
    port : int
        A port a server of this process is bound to.

    Returns
    -------
    bool
        Whether the port is new to this process.

    Examples
    --------
    >>> port = fresh_port()
    >>> claim_port(port)
    False
    """
    with _lock:
        if port in _claimed:
            return False
        _claimed.add(port)
        return True


def fresh_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` that no server of this process has had before.

    Parameters
    ----------
    host : str, default "127.0.0.1"
        Interface to probe.

    Returns
    -------
    int
        The port, already recorded by :func:`claim_port`. Another process can still
        take it before it is bound: a caller that binds it later retries on
        "address already in use".

    Examples
    --------
    >>> fresh_port() != fresh_port()
    True
    """
    held: list[socket.socket] = []
    try:
        for _ in range(_ATTEMPTS):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # Kept bound until a new port is found, so the next bind cannot return it.
            held.append(sock)
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            if claim_port(port):
                return port
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    raise RuntimeError(
        f"no port on {host} that this process has not used before in {_ATTEMPTS} tries"
    )
