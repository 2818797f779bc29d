"""The Hugging Face Hub as a place stores are read from: ``hf://`` objects fetched whole.

The Hub counts every ``/resolve`` request against a rate limit (3,000 per 5 minutes
anonymously), and random access touches every frame shard of a store, each touch one
resolve. So a store on the Hub is read object by object: :class:`HubObjects` fetches
an object *whole*, once, with one ``/resolve``, and
:class:`~atari_zarr.storage.objects.ObjectCacheStore` keeps it on local disk, from where
every later byte range of it is read.

* **One commit.** The branch or tag a URL names (``hf://datasets/ORG/NAME@v1/...``; the
  default branch without ``@``) is resolved to its commit once per process, by the
  repo's info (``/api/datasets/ORG/NAME``, not a resolve). Every object is then asked
  for at that commit, so what is kept locally never goes stale: a new commit is a new
  place in the cache. (A server that resolves branches only is read by the branch.)
* **Checked.** An object is taken only when its length is the one announced and its
  checksum is the one the Hub gives for it: the sha256 of a large (LFS or Xet) file, from
  its ``X-Linked-Etag`` or ``ETag``, the git blob id of a small one.
* **Rate limits waited out, quietly.** A 429 waits as the Hub's ``Retry-After`` or
  ``RateLimit`` header says, logged at INFO (the command line's ``-v``), within the call's
  deadline. Past the deadline the error says it was a rate limit (never damage) and
  what to do.
* **Tokens.** A private repo is read with the user's token: ``storage_options["token"]``,
  else ``$HF_TOKEN`` or ``huggingface-cli login``'s (huggingface_hub's own lookup);
  ``token=False`` reads anonymously. The token is sent to the Hub's host only and removed
  from every message.

Examples
--------
>>> parse_hf_url("hf://datasets/org/atari@v1/Pong/1.zarr")
HubPath(repo_type='dataset', repo_id='org/atari', revision='v1', path='Pong/1.zarr')
>>> parse_hf_url("hf://datasets/org/atari").revision
'main'
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from atari_zarr.errors import InvalidArgumentError, RemoteAccessError, RemoteTimeoutError
from atari_zarr.forks import after_fork
from atari_zarr.storage.paths import redact
from atari_zarr.storage.sessions import watch_session

__all__ = ["HubObjects", "HubPath", "is_hub_url", "parse_hf_url", "retry_after"]

log = logging.getLogger("atari_zarr")

_REPO_TYPES = {"datasets": "dataset", "models": "model", "spaces": "space"}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
#: Attempts of one object after a transient failure (a 5xx, a dropped connection).
ATTEMPTS = 5
_BACKOFF = 0.2


@dataclass(frozen=True)
class HubPath:
    """Where an ``hf://`` URL points: a repo, a revision in it, a path in that."""

    repo_type: str
    repo_id: str
    revision: str
    path: str

    def url(self, revision: str | None = None) -> str:
        """The ``hf://`` URL, at ``revision`` (default: the one it names)."""
        rev = revision or self.revision
        at = "" if rev == "main" and revision is None else f"@{urllib.parse.quote(rev, safe='')}"
        tail = f"/{self.path}" if self.path else ""
        return f"hf://{self.repo_type}s/{self.repo_id}{at}{tail}"


def is_hub_url(location: str) -> bool:
    """True for an ``hf://`` URL.

    Examples
    --------
    >>> is_hub_url("hf://datasets/org/x"), is_hub_url("gs://b/x")
    (True, False)
    """
    return str(location).startswith("hf://")


def parse_hf_url(url: str) -> HubPath:
    """The repo, revision and path of ``hf://{datasets,models,spaces}/ORG/NAME[@REV][/PATH]``.

    Raises
    ------
    InvalidArgumentError
        If ``url`` is not such a URL.
    """
    rest = str(url)[len("hf://") :] if is_hub_url(url) else ""
    parts = rest.split("/")
    if len(parts) < 3 or parts[0] not in _REPO_TYPES or not parts[1] or not parts[2]:
        raise InvalidArgumentError(
            f"{url!r} is not a Hub dataset URL: expected hf://datasets/ORG/NAME[@REVISION]"
            f"[/PATH]. Write the repo as the Hub names it, e.g. hf://datasets/org/atari/Pong/1.zarr"
        )
    name, _, revision = parts[2].partition("@")
    return HubPath(
        _REPO_TYPES[parts[0]],
        f"{parts[1]}/{name}",
        urllib.parse.unquote(revision) or "main",
        "/".join(p for p in parts[3:] if p),
    )


def retry_after(headers: Any) -> float:
    """Seconds a 429 asks to wait: ``Retry-After``, else the ``RateLimit`` header's ``t=``,
    else 1.

    Examples
    --------
    >>> retry_after({"Retry-After": "3"}), retry_after({"RateLimit": '"api";r=0;t=7'})
    (3.0, 7.0)
    """
    value = headers.get("Retry-After")
    if value is not None and str(value).strip().isdigit():
        return float(value)
    found = re.search(r"(?:^|;)\s*t=(\d+)", str(headers.get("RateLimit") or ""))
    return float(found.group(1)) if found else 1.0


def _blob_id(data: bytes) -> str:
    """git's id of a blob: what the Hub gives as the checksum of a small file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubObjects:
    """Whole objects of one Hub folder, at one commit, each fetched with one ``/resolve``.

    Parameters
    ----------
    url : str
        ``hf://`` URL of the folder (a store, a root).
    storage_options : dict, optional
        ``endpoint`` (default huggingface_hub's, ``$HF_ENDPOINT``) and ``token`` (default the
        user's; ``False`` for none).
    timeout : float or None
        Seconds one object may take, waits for the rate limit included.

    Attributes
    ----------
    resolves : int
        ``/resolve`` requests this process made (429s included).
    """

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None, timeout: float | None
    ) -> None:
        from huggingface_hub import constants

        self.where = parse_hf_url(url)
        self.storage_options = dict(storage_options or {})
        self.endpoint = str(self.storage_options.get("endpoint") or constants.ENDPOINT).rstrip("/")
        self.timeout = timeout
        self.commit: str | None = None
        self.resolves = 0
        # whether the server resolves by commit (the Hub does); None until a read says
        self._by_commit: bool | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.where.url(),
            "storage_options": self.storage_options,
            "timeout": self.timeout,
            "commit": self.commit,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"], state["timeout"])  # type: ignore[misc]
        self.commit = state["commit"]

    # -- credentials ----------------------------------------------------------------------
    def _token(self) -> str | None:
        given = self.storage_options.get("token")
        if given is False or given == "anon":
            return None
        if isinstance(given, str) and given:
            return given
        from huggingface_hub import get_token

        return get_token()

    def _secrets(self) -> dict[str, Any]:
        return {**self.storage_options, "token": self._token() or ""}

    def _headers(self, *, with_token: bool) -> dict[str, str]:
        from atari_zarr._version import __version__

        headers = {"User-Agent": f"atari_zarr/{__version__}"}
        token = self._token() if with_token else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def name(self, key: str) -> str:
        """``key`` of the folder as a safe URL, for messages."""
        return redact(f"{self.where.url()}/{key}", self._secrets())

    # -- requests -------------------------------------------------------------------------
    async def _request(
        self, url: str, what: str, deadline: float | None, hops: int = 0
    ) -> tuple[int, Any, bytes]:
        """``GET url``: (status, headers, body), a 429 waited out and transient failures
        retried, within ``deadline`` (a ``time.monotonic`` instant, or None)."""
        import aiohttp

        host = urllib.parse.urlsplit(self.endpoint).netloc
        attempt = 0
        while True:
            # the token goes to the Hub's host only, never to a redirect's CDN
            session = _session()
            headers = self._headers(with_token=urllib.parse.urlsplit(url).netloc == host)
            try:
                async with session.get(url, headers=headers, allow_redirects=False) as answer:
                    if "/resolve/" in url:
                        self.resolves += 1
                    redirect = answer.status in (301, 302, 303, 307, 308)
                    if redirect and "Location" in answer.headers and hops < 5:
                        linked = {
                            k: v for k, v in answer.headers.items() if k.lower().startswith("x-")
                        }
                        target = urllib.parse.urljoin(url, answer.headers["Location"])
                        status, got, body = await self._request(target, what, deadline, hops + 1)
                        return status, {**linked, **dict(got)}, body
                    if answer.status == 429:
                        wait = retry_after(answer.headers)
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and wait > left:
                            raise RemoteTimeoutError(
                                f"{what}: the Hub rate-limits this client and asked to wait "
                                f"{wait:g} s, past the deadline of {self.timeout:g} s; nothing "
                                f"is damaged. Log in (HF_TOKEN, `huggingface-cli login`) for a "
                                f"higher limit, or give reads more time (ATARI_ZARR_TIMEOUT)"
                            )
                        log.info("%s: rate limited by the Hub (429), waiting %g s", what, wait)
                        await asyncio.sleep(wait)
                        continue
                    body = await answer.read()
                    if answer.status >= 500 and attempt + 1 < ATTEMPTS:
                        raise aiohttp.ClientResponseError(
                            answer.request_info, (), status=answer.status
                        )
                    return answer.status, answer.headers, body
            except (aiohttp.ClientError, ConnectionError, asyncio.IncompleteReadError) as exc:
                attempt += 1
                if attempt >= ATTEMPTS:
                    raise RemoteAccessError(
                        redact(
                            f"{what}: the Hub at {self.endpoint} failed {ATTEMPTS} times "
                            f"({type(exc).__name__}: {exc}). Check the connection and the "
                            f"endpoint (HF_ENDPOINT), then read again",
                            self._secrets(),
                        )
                    ) from None
                log.debug("%s: transient failure %d of %d: %r", what, attempt, ATTEMPTS, exc)
                await asyncio.sleep(_BACKOFF * 2**attempt)

    async def _bounded(self, what: str, call: Any) -> Any:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            return await asyncio.wait_for(call(deadline), self.timeout)
        except TimeoutError as exc:
            if isinstance(exc, RemoteTimeoutError):
                raise
            raise RemoteTimeoutError(
                f"{what}: no answer from the Hub at {self.endpoint} within {self.timeout:g} s; "
                f"nothing is damaged. Check the connection, or give reads more time "
                f"(ATARI_ZARR_TIMEOUT)"
            ) from None

    def _refused(self, what: str, status: int, body: bytes) -> RemoteAccessError:
        if status in (401, 403):
            advice = (
                "the repo is private or gated, or the token is wrong: log in "
                "(HF_TOKEN, `huggingface-cli login`) with a token that may read it"
            )
        else:
            advice = "check the repo's name and revision on the Hub"
        detail = " ".join(body[:200].decode(errors="replace").split())  # one line
        return RemoteAccessError(
            redact(f"{what}: the Hub answered {status} ({detail}); {advice}", self._secrets())
        )

    async def resolve_commit(self) -> str:
        """The commit the URL's revision names: one request to the repo's info
        (``/api/datasets/ORG/NAME``, ``.../revision/REV`` for a named one), once."""
        if self.commit is not None:
            return self.commit
        where = self.where
        if _HEX40.match(where.revision):
            self.commit = where.revision
            return self.commit
        # once per repo and revision in a process: a mixture of its stores reads one commit
        known = (self.endpoint, where.repo_type, where.repo_id, where.revision)
        if known in _COMMITS:
            self.commit = _COMMITS[known]
            return self.commit
        loop = asyncio.get_running_loop()
        asking = _ASKING.get(known)
        if asking is not None and asking.get_loop() is loop:  # another store asks already
            self.commit = await asyncio.shield(asking)
            return self.commit
        mine: asyncio.Future[str] = loop.create_future()
        _ASKING[known] = mine
        try:
            self.commit = await self._ask_commit(known)
        except BaseException as exc:
            mine.set_exception(exc)
            mine.exception()  # retrieved, whether or not another store waits on it
            raise
        else:
            mine.set_result(self.commit)
            return self.commit
        finally:
            if _ASKING.get(known) is mine:
                del _ASKING[known]

    async def _ask_commit(self, known: tuple[str, str, str, str]) -> str:
        where = self.where
        url = f"{self.endpoint}/api/{where.repo_type}s/{where.repo_id}"
        if where.revision != "main":  # the default branch: the repo's own info (its sha)
            url += f"/revision/{urllib.parse.quote(where.revision, safe='')}"
        what = redact(where.url(), self._secrets())
        status, _, body = await self._bounded(what, lambda d: self._request(url, what, d))
        if status != 200:
            raise self._refused(what, status, body)
        try:
            sha = json.loads(body)["sha"]
        except (ValueError, KeyError, TypeError):
            raise RemoteAccessError(
                f"{what}: the Hub's repo info gave no commit (expected JSON with 'sha'); "
                f"check the endpoint (HF_ENDPOINT) is a Hub"
            ) from None
        return _COMMITS.setdefault(known, str(sha))

    async def folder(self) -> str:
        """The folder's place in a local cache: host, repo, commit and path.

        The host is the endpoint's name and port alone: user info in the endpoint
        (``http://user:password@host``) is a credential, never a folder's name."""
        host = _host_folder(self.endpoint)
        where = self.where
        tail = f"/{where.path}" if where.path else ""
        return f"{host}/{where.repo_type}s/{where.repo_id}/{await self.resolve_commit()}{tail}"

    def _resolve_url(self, revision: str, key: str) -> str:
        where = self.where
        in_repo = f"{where.path}/{key}" if where.path else key
        return (
            f"{self.endpoint}/{'' if where.repo_type == 'model' else where.repo_type + 's/'}"
            f"{where.repo_id}/resolve/{urllib.parse.quote(revision, safe='')}/"
            f"{urllib.parse.quote(in_repo)}"
        )

    async def fetch(self, key: str) -> bytes | None:
        """The whole object ``key`` of the folder, checked; None where there is none."""
        commit = await self.resolve_commit()
        what = self.name(key)

        async def attempt(deadline: float | None) -> bytes | None:
            by_commit = self._by_commit is not False
            url = self._resolve_url(commit if by_commit else self.where.revision, key)
            for _ in range(2):  # a body spoiled in transit is fetched once more
                status, headers, body = await self._request(url, what, deadline)
                if status == 404 and self._by_commit is None and commit != self.where.revision:
                    # a server that resolves branches only (not commits): asked by the
                    # branch once, and from then on if it answers
                    branch = self._resolve_url(self.where.revision, key)
                    status, headers, body = await self._request(branch, what, deadline)
                    if status == 200:
                        log.info("%s: resolved by branch, not by commit", self.where.url())
                        self._by_commit, url = False, branch
                if status == 404:
                    return None
                if status != 200:
                    raise self._refused(what, status, body)
                problem = _check(body, headers)
                if problem is None:
                    if self._by_commit is None:
                        self._by_commit = True
                    return body
                log.debug("%s: %s; fetching it again", what, problem)
            raise RemoteAccessError(
                f"{what}: {problem}, twice: the Hub's copy or the connection spoils it. "
                f"Read again later; if it persists, report it to the repo's owners"
            )

        return await self._bounded(what, attempt)  # type: ignore[no-any-return]


#: The commit each (endpoint, repo type, repo, revision) named when this process first
#: asked: every store of a repo is read at one commit, whatever is pushed meanwhile.
_COMMITS: dict[tuple[str, str, str, str], str] = {}
# the request for one under way, that the stores asking at the same time wait for
_ASKING: dict[tuple[str, str, str, str], asyncio.Future[str]] = {}
after_fork(_ASKING.clear)  # a parent's requests are not a forked child's to wait for

# -- one HTTP session per event loop, shared by every folder; a forked child's anew -----
_SESSIONS: dict[Any, Any] = {}
_SESSIONS_LOCK = threading.Lock()


def _session() -> Any:
    """The process's session on the running loop (closed at exit, on that loop)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
            )
            _SESSIONS[loop] = session
            watch_session(session)
    return session


# a forked child's inheritance: the parent's sessions, held (never used, never closed:
# their connections are the parent's) so that dropping them warns of nothing
_INHERITED: list[Any] = []


def _forget_sessions() -> None:
    """In a forked child: the parent's sessions are not its own to use or to close."""
    global _SESSIONS_LOCK
    _INHERITED.extend(_SESSIONS.values())
    _SESSIONS.clear()
    _SESSIONS_LOCK = threading.Lock()


after_fork(_forget_sessions)


def _host_folder(endpoint: str) -> str:
    """The folder of an endpoint's objects in a local cache: its host and port, never
    its user info.

    Examples
    --------
    >>> _host_folder("http://me:pw@127.0.0.1:8080"), _host_folder("https://huggingface.co")
    ('127.0.0.1_8080', 'huggingface.co')
    """
    parts = urllib.parse.urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:  # not a number: the name alone
        port = None
    host = (parts.hostname or "").replace(":", "_")  # an IPv6 address's colons
    return (f"{host}_{port}" if port is not None else host) or "hub"


def _check(body: bytes, headers: Any) -> str | None:
    """What is wrong with ``body`` by the length and checksum the Hub announced, or None."""
    length = headers.get("Content-Length")
    if length is not None and str(length).isdigit() and int(length) != len(body):
        return f"{len(body):,} bytes arrived where {int(length):,} were announced"
    tag = str(headers.get("X-Linked-Etag") or headers.get("ETag") or "").strip().strip('"')
    tag = tag.removeprefix("W/").strip('"')
    if _HEX64.match(tag):
        found = hashlib.sha256(body).hexdigest()
    elif _HEX40.match(tag):
        found = _blob_id(body)
    else:
        return None  # a CDN's own tag: the length is all there is to check
    if found != tag:
        return f"its checksum is {found[:12]}..., where the Hub gives {tag[:12]}..."
    return None
