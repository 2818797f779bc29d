"""Credentials removed from text: the one redaction of every message this package prints.

URL user info (also percent-encoded, as a client spells a bucket name), secret
parameters of a URL's query (signed URLs), bearer tokens, and the values of
secret-looking storage options. Every :class:`~atari_zarr.errors.AtariZarrError` message
goes through it when the error is made; everything written into a store, a catalog or a
card goes through :func:`redact_tree`; the command line passes all it prints through it
with the storage options given; and the log records of the storage libraries (fsspec's
DEBUG lines name every URL) go through :class:`RedactRecords` once a URL is opened
(:func:`redact_library_logs`), as this package's own records always do. Nothing here does I/O.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any

__all__ = ["RedactRecords", "redact", "redact_library_logs", "redact_tree"]

# what follows a scheme's "://" up to the end of the URL in the text (or the next URL's
# "://", when two are joined without a space)
_AFTER_SCHEME_RE = re.compile(r"(?<=://)(?:(?!://)[^\s'\"<>])+")
# "user:pw@bucket" spelled into a request path by a client: user%3Apw%40bucket; the
# greedy middle reaches the last %40 of the path segment (a password may hold an @)
_ENCODED_USERINFO_RE = re.compile(r"(?i)(?<=[/=])[^/@\s?&=]*%3A[^/@\s?&]*%40")
# a secret parameter of a URL's query (after ? or &), not any "key=" in prose
_QUERY_SECRET_RE = re.compile(
    r"(?i)([?&](?:access_token|token|signature|sig|key|secret|password|credential|"
    r"x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential|"
    r"x-amz-security-token)=)[^&\s'\"]+"
)
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s'\",]+")
_SECRET_KEY_RE = re.compile(r"(?i)token|secret|password|passwd|credential|auth|key|session")


def _secret_values(options: Any, key: str = "") -> list[str]:
    """String values of storage options whose key sounds secret (nested dicts too)."""
    if isinstance(options, dict):
        out: list[str] = []
        for k, v in options.items():
            out += _secret_values(v, str(k))
        return out
    if isinstance(options, str) and len(options) >= 4 and _SECRET_KEY_RE.search(key):
        return [] if options in ("anon", "google_default", "cloud", "browser") else [options]
    return []


def _userinfo_end(rest: str) -> int:
    """Where the user info of ``rest`` (a URL after its ``scheme://``) ends: the index of
    its last ``@`` before the host, or -1 when it has none.

    Clients (urllib, yarl, fsspec) take the user info up to the LAST ``@`` of the
    authority, so a password may hold raw ``@`` and ``:``. A password typed with a raw
    ``/``, ``?`` or ``#`` ends the authority early (such a URL opens nowhere, but its
    error names it): the user info here reaches the last ``@`` before the first ``/``,
    and where ``user:pass`` stands before that ``/`` with no port (digits) after its
    colon, the last ``@`` of the URL.
    """
    before_path = rest.split("/", 1)[0]
    if "@" in before_path:
        return before_path.rindex("@")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    _, colon, port = authority.rpartition(":")
    if colon and not port.isdigit() and not authority.endswith("]") and "@" in rest:
        return rest.rindex("@")
    return -1


def _redact_userinfo(match: re.Match[str]) -> str:
    rest = match.group(0)
    end = _userinfo_end(rest)
    return rest if end < 0 else "***" + rest[end:]


def redact(text: str, storage_options: dict[str, Any] | None = None) -> str:
    """Remove credentials from ``text``: URL user info, secret query parameters, bearer
    tokens, and the values of secret-looking storage options.

    Examples
    --------
    >>> redact("https://me:hunter2@host/x?X-Goog-Signature=abc&a=1")
    'https://***@host/x?X-Goog-Signature=***&a=1'
    >>> redact("http://alice:S3c@retPw@127.0.0.1:8080/x")
    'http://***@127.0.0.1:8080/x'
    >>> redact("token s3cr3t-value refused", {"token": "s3cr3t-value"})
    'token *** refused'
    """
    text = _AFTER_SCHEME_RE.sub(_redact_userinfo, str(text))
    text = _ENCODED_USERINFO_RE.sub("***%40", text)
    text = _QUERY_SECRET_RE.sub(r"\1***", text)
    text = _BEARER_RE.sub(r"\1***", text)
    for secret in sorted(_secret_values(storage_options or {}), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def redact_tree(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists and
    tuples are walked; keys are kept): what is written into a store's attributes, a
    catalog or a card.

    Examples
    --------
    >>> redact_tree({"command": "atari-zarr convert https://me:pw@host/x out", "n": [1]})
    {'command': 'atari-zarr convert https://***@host/x out', 'n': [1]}
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_tree(v) for v in value)
    return value


class RedactRecords(logging.Filter):
    """A log filter that redacts each record's message and traceback in place.

    Examples
    --------
    >>> record = logging.LogRecord("fsspec.http", 10, "", 0, "GET %s", ("https://u:pw@h/x",), None)
    >>> RedactRecords().filter(record), record.getMessage()
    (True, 'GET https://***@h/x')
    """

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._options = options

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage(), self._options)
        record.args = None
        if record.exc_info:
            record.exc_text = redact(
                "".join(traceback.format_exception(*record.exc_info)), self._options
            )
            record.exc_info = None
        return True


# the loggers that name URLs (a logger's filters see only the records made on it)
_LIBRARY_LOGGERS = (
    "atari_zarr",
    "fsspec",
    "fsspec.http",
    "fsspec.cached",
    "fsspec.reference",
    "gcsfs",
    "gcsfs.credentials",
    "s3fs",
    "aiobotocore",
    "botocore",
    "huggingface_hub",
    "zarr",
)
_library_filter = RedactRecords()


def redact_library_logs() -> None:
    """Redact the records of the storage libraries' loggers, for an application that
    logs at DEBUG (fsspec names every URL it fetches, user info included). Idempotent.

    Examples
    --------
    >>> redact_library_logs(); redact_library_logs()
    >>> sum(isinstance(f, RedactRecords) for f in logging.getLogger("fsspec.http").filters)
    1
    """
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if _library_filter not in logger.filters:
            logger.addFilter(_library_filter)


# this package's own records are redacted from the start, whoever configures logging
logging.getLogger("atari_zarr").addFilter(_library_filter)
