"""The deadline of remote calls and the errors they raise: one mechanism for all I/O.

Transient failures (``5xx``, ``429``, refused connections) are retried by the file
system itself (gcsfs: 6 attempts with exponential back-off, about 31 s in all). A
server that stops answering would otherwise hold a call for minutes, so every
remote call, the file system's retries included, gets ``timeout`` seconds (an
argument of every function that reaches storage; when not given,
``$ATARI_ZARR_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`; the CLI passes its ``--timeout``) and
then raises :class:`~atari_zarr.errors.RemoteTimeoutError`. Any other
failure becomes a :class:`~atari_zarr.errors.RemoteAccessError` naming the URL and
the object, with credentials redacted. A missing object stays a
``FileNotFoundError``: the caller decides what absence means.

:func:`bounded` is the one place that applies the deadline and translates the
errors; :class:`~atari_zarr.storage.remote.RemoteStore` (zarr's view of a remote
store) and :class:`~atari_zarr.storage.filesystem.FileSystem` (the package's file
system calls) both go through it.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable
from typing import Any, TypeVar

from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    RemoteAccessError,
    RemoteTimeoutError,
)
from atari_zarr.storage.paths import redact

__all__ = [
    "DEFAULT_TIMEOUT",
    "TIMEOUT_ENV",
    "Timeout",
    "bounded",
    "remote_error",
    "resolve_timeout",
    "timeout_from_environment",
]

T = TypeVar("T")

#: Seconds one remote call may take, the file system's own retries included.
#: Above gcsfs's full retry schedule (about 31 s), so transient errors are retried.
DEFAULT_TIMEOUT = 60.0
#: Environment variable holding the default deadline (seconds, or ``none``).
TIMEOUT_ENV = "ATARI_ZARR_TIMEOUT"
#: What a ``timeout=`` argument takes: seconds, None (no limit) or ``"default"``.
Timeout = float | str | None

# Errors that say something about the object, not about the connection: the caller
# handles them (absent key, wrong kind of path, an error of ours, the end of a listing).
_PASS_THROUGH: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
    AtariZarrError,
    StopAsyncIteration,
)


def timeout_from_environment() -> float | None:
    """The default deadline: ``$ATARI_ZARR_TIMEOUT`` if set (``none``: no limit), else 60 s.

    What ``timeout="default"`` means everywhere: the command line, the readers and the
    drop-ins alike.

    Examples
    --------
    >>> timeout_from_environment() > 0
    True
    """
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT
    if value.lower() in ("none", "inf", "0"):
        return None
    seconds = _seconds(value)
    if seconds is None:
        raise InvalidArgumentError(
            f"{TIMEOUT_ENV}={value!r} is not a number of seconds; set it to e.g. 60, or "
            f"'none' for no limit."
        )
    return seconds if seconds > 0 else None


def _seconds(value: Any) -> float | None:
    """``value`` as seconds, 0 or more; None for anything else (NaN, a negative, a bool)."""
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(seconds) or seconds < 0 else seconds


def resolve_timeout(timeout: Timeout) -> float | None:
    """``"default"`` becomes :func:`timeout_from_environment`; ``0`` or ``None``, no limit.

    Raises
    ------
    InvalidArgumentError
        A negative number, NaN, or anything but seconds, None and ``"default"``.

    Examples
    --------
    >>> resolve_timeout(5), resolve_timeout(None), resolve_timeout(0)
    (5.0, None, None)
    >>> resolve_timeout(-1)
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: timeout=-1: expected a number of seconds ...
    """
    if timeout is None:
        return None
    if isinstance(timeout, str) and timeout == "default":
        return timeout_from_environment()
    seconds = None if isinstance(timeout, str) else _seconds(timeout)
    if seconds is None:
        raise InvalidArgumentError(
            f"timeout={timeout!r}: expected a number of seconds (0 or None: no limit) or "
            f"'default' ({TIMEOUT_ENV}, else {DEFAULT_TIMEOUT:g} s); pass e.g. timeout=60"
        )
    return seconds if seconds > 0 else None


def remote_error(
    exc: BaseException,
    what: str,
    where: str,
    timeout: float | None,
    storage_options: dict[str, Any] | None = None,
) -> AtariZarrError | None:
    """The error to raise for ``exc``, raised while ``what``-ing ``where``; None to re-raise.

    Examples
    --------
    >>> err = remote_error(TimeoutError(), "reading", "gs://b/x.zarr/zarr.json", 3)
    >>> type(err).__name__, "within 3 s" in str(err)
    ('RemoteTimeoutError', True)
    >>> remote_error(FileNotFoundError("x"), "reading", "gs://b/x", 3) is None
    True
    """
    if isinstance(exc, _PASS_THROUGH) or not isinstance(exc, Exception):
        return None
    if isinstance(exc, TimeoutError):
        limit = f"within {timeout:g} s" if timeout is not None else "in time"
        return RemoteTimeoutError(
            f"{what} {where} did not finish {limit}: the server did not answer in time "
            f"(it may be down, overloaded or unreachable; transient errors were retried). "
            f"Check the URL, endpoint and network, or allow more time with timeout=... "
            f"(CLI --timeout, environment {TIMEOUT_ENV})."
        )
    detail = redact(f"{type(exc).__name__}: {exc}", storage_options)
    return RemoteAccessError(
        f"{what} {where} failed after the file system's retries ({detail}). Check the URL, "
        f"the storage options (credentials, endpoint_url) and that the server is reachable."
    )


async def bounded(
    what: str,
    where: str,
    awaitable: Awaitable[T],
    *,
    timeout: float | None,
    storage_options: dict[str, Any] | None = None,
) -> T:
    """Await ``awaitable`` for at most ``timeout`` seconds, translating its errors.

    Parameters
    ----------
    what : str
        The action, for messages (``"reading"``, ``"listing"``).
    where : str
        The URL of the object, already redacted.
    awaitable : awaitable
        The call; cancelled when the deadline passes.
    timeout : float or None
        Seconds; ``None`` for no limit.
    storage_options : dict, optional
        Their secret values are removed from messages.

    Raises
    ------
    RemoteTimeoutError
        The deadline passed (retries included).
    RemoteAccessError
        Any other failure than a missing object, a wrong kind of path or an
        :class:`~atari_zarr.errors.AtariZarrError`, which pass through.

    Examples
    --------
    >>> async def stalls() -> None:
    ...     await asyncio.sleep(60)
    >>> asyncio.run(bounded("reading", "memory://x", stalls(), timeout=0.01))
    Traceback (most recent call last):
        ...
    atari_zarr.errors.RemoteTimeoutError: reading memory://x did not finish within 0.01 s: ...
    """
    try:
        if timeout is None:
            return await awaitable
        return await asyncio.wait_for(awaitable, timeout)
    except Exception as exc:
        error = remote_error(exc, what, where, timeout, storage_options)
        if error is None:
            raise
        # not chained: the original exception's text may carry credentials
        raise error from None
