"""The host a URL's requests go to, and whether its name resolves: offline fails at once.

A file system retries a connection that fails (gcsfs six times, about 31 s, logging a
traceback each round), which is right for a server that is down for a moment and wrong
for a machine without network: a host name that does not resolve will not resolve on
the next try either. :func:`check_resolves` asks the resolver once per host and
process before the first request, and a name that does not resolve is one
:class:`~atari_zarr.errors.RemoteAccessError` at once, naming the URL and the host.

The host is the one the file system will connect to: a ``gs://`` URL's is
``$STORAGE_EMULATOR_HOST`` or ``endpoint_url`` when set (as gcsfs decides), else
``storage.googleapis.com``; an ``s3://`` URL's its ``endpoint_url`` (also under
``client_kwargs``) or ``$AWS_ENDPOINT_URL``, else ``s3.amazonaws.com``; an
``http(s)://`` URL's its own. Other protocols are not checked.

Examples
--------
>>> endpoint_host("gs://bucket/x", {"endpoint_url": "http://127.0.0.1:4443"})
'127.0.0.1'
>>> endpoint_host("https://example.org/atari/Pong/1.zarr", {})
'example.org'
>>> endpoint_host("memory://x", {}) is None
True
>>> check_resolves("https://localhost:1/x.zarr", {}, timeout=5)  # resolves: nothing raised
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from atari_zarr.errors import InvalidArgumentError, RemoteAccessError
from atari_zarr.storage.paths import redact

__all__ = ["check_resolves", "endpoint_host"]

# Hosts that resolved in this process (a failure is never kept: the network may come back).
_RESOLVED: set[str] = set()
_LOCK = threading.Lock()
# Seconds a look-up may take before the request itself is left to find out (and its deadline).
_LOOKUP_S = 10.0


def _host_of(url: str | None) -> str | None:
    if not url:
        return None
    try:
        found = urlsplit(url if "://" in url else f"http://{url}").hostname
    except ValueError as exc:  # an unclosed "[" (IPv6): Python's parser refuses the URL
        raise InvalidArgumentError(
            f"{redact(url)} is not a URL ({exc}); expected scheme://host[:port]/path, an "
            f"IPv6 host in brackets. Check the spelling of the URL."
        ) from None
    return found or None


def endpoint_host(location: str, storage_options: dict[str, Any]) -> str | None:
    """The host name the requests for ``location`` go to (None: not a network URL)."""
    protocol = location.split("://", 1)[0].lower() if "://" in location else ""
    options = storage_options or {}
    if protocol in ("gs", "gcs"):
        return (
            _host_of(options.get("endpoint_url"))
            or _host_of(os.environ.get("STORAGE_EMULATOR_HOST"))
            or "storage.googleapis.com"
        )
    if protocol in ("s3", "s3a"):
        client = options.get("client_kwargs") or {}
        return (
            _host_of(options.get("endpoint_url"))
            or _host_of(client.get("endpoint_url") if isinstance(client, dict) else None)
            or _host_of(os.environ.get("AWS_ENDPOINT_URL_S3"))
            or _host_of(os.environ.get("AWS_ENDPOINT_URL"))
            or "s3.amazonaws.com"
        )
    if protocol in ("http", "https"):
        return _host_of(location)
    return None


def check_resolves(
    location: str, storage_options: dict[str, Any], *, timeout: float | None
) -> None:
    """Raise :class:`~atari_zarr.errors.RemoteAccessError` at once when the host that
    ``location``'s requests go to does not resolve (no network, a wrong name).

    A look-up that takes longer than ``timeout`` (or 10 s) is not an answer: the request
    then goes ahead, under its own deadline.
    """
    host = endpoint_host(location, storage_options)
    if host is None or host in _RESOLVED:
        return
    wait = _LOOKUP_S if timeout is None else min(_LOOKUP_S, timeout)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="atari-zarr-resolve")
    try:
        future = pool.submit(socket.getaddrinfo, host, None)
        future.result(timeout=wait)
    except socket.gaierror as exc:
        raise RemoteAccessError(
            f"{redact(location, storage_options)}: the host name {host} does not resolve "
            f"({exc.strerror or exc}); expected a name this machine can look up. The machine "
            f"may be offline, or the URL or endpoint is wrong: check the network and the "
            f"address, or read from a local copy (root=, mirrors=)."
        ) from None
    except (concurrent.futures.TimeoutError, OSError):
        return  # no answer in time: the request finds out, within its deadline
    finally:
        pool.shutdown(wait=False)
    with _LOCK:
        _RESOLVED.add(host)
