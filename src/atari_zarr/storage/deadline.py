"""The deadline of remote calls and the errors they raise: one mechanism for all I/O.

Transient failures (``5xx``, ``408``, ``429``, refused connections) are retried by the
file system itself (gcsfs: 6 attempts with exponential back-off, about 31 s in all);
fsspec's http file system does not retry, so its calls retry here (:func:`with_retries`,
the one retry of this package). A failure status stays named: every response with one
is logged (``atari_zarr`` at INFO, the CLI's ``-v``) and remembered by the call, whose
error names it (a deadline that passes during the retries of a ``500`` says so, not that
the server did not answer); a ``5xx`` hidden behind fsspec's "not found" of a web
server is never taken for an absent object. A server that stops answering would
otherwise hold a call for minutes, so every remote call, the file system's retries
included, gets ``timeout`` seconds (an argument of every function that reaches storage;
when not given, ``$ATARI_ZARR_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`; the CLI passes its
``--timeout``) and then raises :class:`~atari_zarr.errors.RemoteTimeoutError`. Any other
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
import contextvars
import http
import logging
import math
import os
from collections.abc import Awaitable, Callable
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
    "HTTP_ATTEMPTS",
    "TIMEOUT_ENV",
    "Timeout",
    "bounded",
    "remote_error",
    "resolve_timeout",
    "timeout_from_environment",
    "traced_options",
    "transient_http",
    "with_retries",
]

T = TypeVar("T")

log = logging.getLogger("atari_zarr")

#: Attempts of a call to an http(s):// server (fsspec's http file system does not retry).
HTTP_ATTEMPTS = 5
# Seconds before the second attempt; doubled for each next one.
_HTTP_BACKOFF = 0.1
#: Statuses worth another attempt; never an answer that an object is absent.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

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


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of a failed response behind ``exc`` (itself, or what it was
    raised from: fsspec's http ``info`` answers "not found" for any failure)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes, not a loop
        if seen is None:
            return None
        name = type(seen).__name__
        status = getattr(seen, "status" if name == "ClientResponseError" else "code", None)
        if name in ("ClientResponseError", "HttpError") and isinstance(status, int):
            return status  # aiohttp's (http), gcsfs's (gs)
        seen = seen.__cause__ or seen.__context__
    return None


def _status_text(status: int) -> str:
    """``503 Service Unavailable``: a status with its reason phrase."""
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def transient_http(exc: BaseException) -> bool:
    """True for a failure worth another attempt: a ``5xx``/``408``/``429`` answer (also
    behind fsspec's "not found"), a lost connection, a body cut short (the connection
    dropped mid-body: ``ClientPayloadError``).

    Examples
    --------
    >>> transient_http(ConnectionResetError()), transient_http(ValueError())
    (True, False)
    """
    status = _status_of(exc)
    if status is not None:
        return status in TRANSIENT_STATUSES
    if isinstance(exc, FileNotFoundError):
        return False
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - http:// needs aiohttp anyway
        return isinstance(exc, ConnectionError)
    return isinstance(
        exc,
        aiohttp.ClientConnectionError
        | aiohttp.ClientPayloadError
        | ConnectionError
        | asyncio.IncompleteReadError,
    )


async def with_retries(call: Callable[[], Awaitable[T]], attempts: int = HTTP_ATTEMPTS) -> T:
    """``await call()``, again after a transient failure (:func:`transient_http`), at most
    ``attempts`` times, waiting 0.1 s, then twice as long before each next attempt.

    Examples
    --------
    >>> tries = []
    >>> async def flaky() -> str:
    ...     tries.append(1)
    ...     if len(tries) < 3:
    ...         raise ConnectionResetError()
    ...     return "ok"
    >>> asyncio.run(with_retries(flaky)), len(tries)
    ('ok', 3)
    """
    for attempt in range(attempts):
        try:
            return await call()
        except Exception as exc:
            if attempt + 1 >= attempts or not transient_http(exc):
                raise
            log.debug("transient failure, attempt %d of %d: %r", attempt + 1, attempts, exc)
            await asyncio.sleep(_HTTP_BACKOFF * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


# the failure statuses the responses of the current call had (bounded sets a fresh list)
_answered: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "atari_zarr_answered", default=None
)


async def _on_request_end(session: Any, context: Any, params: Any) -> None:
    status = params.response.status
    if status < 400 or status == 404:  # an absent object is an answer, not a failure
        return
    log.info("%s %s answered %s", params.method, params.url, _status_text(status))
    answered = _answered.get()
    if answered is not None:
        answered.append(status)


_trace: Any = None


def _trace_config() -> Any:
    """The one aiohttp trace of the responses of this process's sessions."""
    global _trace
    if _trace is None:
        import aiohttp

        _trace = aiohttp.TraceConfig()
        _trace.on_request_end.append(_on_request_end)
    return _trace


#: The session option of each aiohttp-based file system, where its trace is added.
_SESSION_OPTION = {"gs": "session_kwargs", "gcs": "session_kwargs"} | dict.fromkeys(
    ("http", "https"), "client_kwargs"
)


def traced_options(location: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """``storage_options`` for fsspec, with the trace of failure statuses added to the
    aiohttp session of a gs:// or http(s):// file system (what it retries is logged and
    named; see the module's description). Other protocols' options are returned as given.

    Examples
    --------
    >>> traced_options("memory://x", {"a": 1})
    {'a': 1}
    >>> "trace_configs" in traced_options("https://h/x", {})["client_kwargs"]
    True
    """
    option = _SESSION_OPTION.get(str(location).split("://", 1)[0].lower())
    if option is None:
        return storage_options
    try:
        trace = _trace_config()
    except ImportError:  # pragma: no cover - these protocols need aiohttp anyway
        return storage_options
    session = dict(storage_options.get(option) or {})
    traces = list(session.get("trace_configs") or [])
    session["trace_configs"] = [*traces, trace] if trace not in traces else traces
    return {**storage_options, option: session}


def remote_error(
    exc: BaseException,
    what: str,
    where: str,
    timeout: float | None,
    storage_options: dict[str, Any] | None = None,
    answered: list[int] | None = None,
) -> AtariZarrError | None:
    """The error to raise for ``exc``, raised while ``what``-ing ``where``; None to re-raise.

    Examples
    --------
    >>> err = remote_error(TimeoutError(), "reading", "gs://b/x.zarr/zarr.json", 3)
    >>> type(err).__name__, "within 3 s" in str(err)
    ('RemoteTimeoutError', True)
    >>> remote_error(FileNotFoundError("x"), "reading", "gs://b/x", 3) is None
    True
    >>> str(remote_error(TimeoutError(), "listing", "gs://b/x", 3, answered=[500, 500]))[:92]
    'listing gs://b/x did not finish within 3 s: the server answered 500 Internal Server Error (2'
    """
    status = _status_of(exc)
    # fsspec's http "not found" for any failure: a 5xx, 408 or 429 is no absent object
    hidden = isinstance(exc, FileNotFoundError) and status in TRANSIENT_STATUSES
    if (isinstance(exc, _PASS_THROUGH) and not hidden) or not isinstance(exc, Exception):
        return None
    if isinstance(exc, TimeoutError):
        limit = f"within {timeout:g} s" if timeout is not None else "in time"
        if answered:
            times = "once" if len(answered) == 1 else f"{len(answered)} times"
            return RemoteTimeoutError(
                f"{what} {where} did not finish {limit}: the server answered "
                f"{_status_text(answered[-1])} ({times}, retried until the deadline). "
                f"Try again later; check the URL, endpoint and credentials, or allow more "
                f"time with timeout=... (CLI --timeout, environment {TIMEOUT_ENV})."
            )
        return RemoteTimeoutError(
            f"{what} {where} did not finish {limit}: the server did not answer in time "
            f"(it may be down, overloaded or unreachable; transient errors were retried). "
            f"Check the URL, endpoint and network, or allow more time with timeout=... "
            f"(CLI --timeout, environment {TIMEOUT_ENV})."
        )
    if status is not None and status >= 400:
        return RemoteAccessError(
            f"{what} {where} failed after the file system's retries: the server answered "
            f"{_status_text(status)}. {'Try again later, or check' if status >= 500 else 'Check'}"
            f" the URL, the storage options (credentials, endpoint_url) and that the server "
            f"is reachable."
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
    answered: list[int] = []
    token = _answered.set(answered)  # what this call's responses answered
    try:
        if timeout is None:
            return await awaitable
        return await asyncio.wait_for(awaitable, timeout)
    except Exception as exc:
        error = remote_error(exc, what, where, timeout, storage_options, answered)
        if error is None:
            raise
        # not chained: the original exception's text may carry credentials
        raise error from None
    finally:
        _answered.reset(token)
