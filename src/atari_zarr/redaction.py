"""Credentials removed from text: the one redaction of every message this package prints.

URL user info, secret parameters of a URL's query (signed URLs), bearer tokens, and
the values of secret-looking storage options. Every :class:`~atari_zarr.errors.AtariZarrError`
message goes through it when the error is made, and the command line passes all it
prints through it with the storage options given. Nothing here does I/O.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["redact"]

_USERINFO_RE = re.compile(r"(?<=://)[^/@\s]+@")
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


def redact(text: str, storage_options: dict[str, Any] | None = None) -> str:
    """Remove credentials from ``text``: URL user info, secret query parameters, bearer
    tokens, and the values of secret-looking storage options.

    Examples
    --------
    >>> redact("https://me:hunter2@host/x?X-Goog-Signature=abc&a=1")
    'https://***@host/x?X-Goog-Signature=***&a=1'
    >>> redact("token s3cr3t-value refused", {"token": "s3cr3t-value"})
    'token *** refused'
    """
    text = _USERINFO_RE.sub("***@", str(text))
    text = _QUERY_SECRET_RE.sub(r"\1***", text)
    text = _BEARER_RE.sub(r"\1***", text)
    for secret in sorted(_secret_values(storage_options or {}), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
