"""An emulator of the Hugging Face Hub's read API on 127.0.0.1, for ``hf://`` tests.

:class:`HubEmulator` serves dataset repositories from local directories, each at one
commit, through the endpoints ``huggingface_hub`` (``HfApi``, ``HfFileSystem``) reads
with:

* ``GET /api/datasets/{repo}`` and ``/api/datasets/{repo}/revision/{rev}``: the repo's
  ``id`` and ``sha``;
* ``GET /api/datasets/{repo}/tree/{rev}[/{path}]``: a folder's entries (files with their
  ``size``, ``oid`` and, as the Hub gives large files, ``lfs`` with the ``sha256``),
  ``recursive=true`` for the whole subtree;
* ``POST /api/datasets/{repo}/paths-info/{rev}`` (form ``paths=...``): those entries;
* ``GET`` and ``HEAD /datasets/{repo}/resolve/{rev}/{path}``: the file, a ``Range`` of
  it answered 206, with ``ETag`` (its sha256), ``X-Repo-Commit`` and ``Content-Length``.

Each ``/resolve`` counts against a rate limit as the Hub's does, scaled down
(``limit`` requests per ``window`` seconds; the Hub allows 3,000 per 5 minutes
anonymously): past it the answer is 429 with ``Retry-After`` and the IETF draft's
``RateLimit`` and ``RateLimit-Policy`` headers, until the window turns. Every request is
logged (:attr:`HubEmulator.log`: method, path, status).

Examples
--------
>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> _ = (root / "a.txt").write_text("hello")
>>> with HubEmulator({"org/data": root}) as hub:
...     import urllib.request
...     url = f"{hub.endpoint}/datasets/org/data/resolve/main/a.txt"
...     request = urllib.request.Request(url, headers={"Range": "bytes=1-3"})
...     with urllib.request.urlopen(request) as answer:
...         answer.read()
b'ell'
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from atari_zarr_testkit.ports import LOOPBACK

__all__ = ["HubEmulator"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], hub: HubEmulator) -> None:
        super().__init__(address, _Handler)
        self.hub = hub


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_POST(self) -> None:
        self._answer(head=False, sent=self._body())

    def do_PUT(self) -> None:
        self._answer(head=False, sent=self._body())

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(self, *, head: bool, sent: bytes | None = None) -> None:
        hub = self.server.hub
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
        if sent is not None and "json" not in self.headers.get("Content-Type", ""):
            form = urllib.parse.parse_qs(sent.decode(errors="replace"))
        else:
            form = None
        with hub._lock:
            hub.in_flight += 1
        status = 500  # what the log says of a route that raised
        try:
            status, headers, body = hub._route(
                self.command, parts, query, form, self.headers, sent or b""
            )
        finally:
            hub._note(self.command, url.path, status)
            with hub._lock:
                hub.in_flight -= 1
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if hub.cors:  # the Hub's own: any page may read a public file
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Access-Control-Expose-Headers", "Content-Range, Retry-After, ETag")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(hub._spoiled(url.path, body) if status in (200, 206) else body)


# what the Hub's card validation knows, of what a card here may say
_LICENSES = {"cc-by-4.0", "cc-by-sa-4.0", "cc0-1.0", "mit", "apache-2.0", "other"}
_TASKS = {"reinforcement-learning", "robotics", "other"}
_SIZES = {
    "n<1K",
    "1K<n<10K",
    "10K<n<100K",
    "100K<n<1M",
    "1M<n<10M",
    "10M<n<100M",
    "100M<n<1B",
    "1B<n<10B",
    "10B<n<100B",
    "100B<n<1T",
    "n>1T",
}


def _is_write(parts: list[str]) -> bool:
    """The upload endpoints: create a repo, pre-upload, LFS batch and upload, commit."""
    return (
        parts in (["api", "repos", "create"], ["api", "validate-yaml"])
        or parts[:1] == ["lfs-upload"]
        or (parts[:1] == ["datasets"] and len(parts) >= 3 and parts[2].endswith(".git"))
        or (
            parts[:2] == ["api", "datasets"]
            and len(parts) >= 5
            and parts[4] in ("preupload", "commit")
        )
    )


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> tuple:
    return status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(doc).encode()


class HubEmulator:
    """The Hub's read API over local directories, one per dataset repo, on loopback.

    Parameters
    ----------
    repos : mapping of str to path
        ``{"org/name": directory}``: each repo's files, at one commit.
    limit, window : int, float
        Resolves allowed per window of seconds (None: no limit).
    lfs_from : int
        Files of this many bytes or more are listed with ``lfs`` (the Hub's large files).
    private : mapping of str to str, optional
        ``{"org/name": token}``: private repos, answered 401 without that bearer token.
    delay : float
        Seconds each ``/resolve`` waits before its answer (a slow link; a download to kill).
    refuse_every : int, optional
        Every this-many-th ``/resolve`` answers 429 with ``Retry-After: 1``, however
        slowly they come: a rate limit a test meets on a loaded machine too.
    branches_only : bool
        ``/resolve`` answers the branch ``main`` only, 404 for a commit (a server simpler
        than the Hub).
    new_repos : path, optional
        Where repos created through the API are written (None: no repo is created).
    write_token : str, optional
        The bearer token every write must carry.
    cors : bool
        Every answer lets a page of any origin read it (``Access-Control-Allow-Origin:
        *``), as the Hub's ``/resolve`` answers do: for pages that read the Hub.
    redirect : bool
        Large files' ``/resolve`` answers 302 to ``/cdn/...`` with ``X-Linked-Etag`` (the
        sha256) and ``X-Linked-Size``, as the Hub's do.
    """

    def __init__(
        self,
        repos: Mapping[str, str | Path],
        *,
        limit: int | None = None,
        window: float = 1.0,
        lfs_from: int = 1024,
        private: Mapping[str, str] | None = None,
        delay: float = 0.0,
        redirect: bool = False,
        refuse_every: int | None = None,
        branches_only: bool = False,
        new_repos: str | Path | None = None,
        write_token: str | None = None,
        cors: bool = False,
    ) -> None:
        self.repos = {name: Path(path) for name, path in repos.items()}
        #: ``{repo: token}``: repos read only with ``Authorization: Bearer {token}``.
        self.private = dict(private or {})
        #: Seconds each ``/resolve`` is held before it is answered.
        self.delay = float(delay)
        #: Large files resolve as the Hub's do: a 302 to a CDN path, with ``X-Linked-Etag``.
        self.redirect = redirect
        #: Every this-many-th resolve is a 429 (Retry-After 1), whatever the time: a rate
        #: limit met however slowly the client asks (None: the window's limit only).
        self.refuse_every = refuse_every
        #: ``/resolve`` by the branch ``main`` only, not by a commit (a simpler server).
        self.branches_only = branches_only
        self._counted = 0
        #: Where repos created through ``/api/repos/create`` live (None: none are).
        self.new_repos = None if new_repos is None else Path(new_repos)
        #: The token every write must carry (None: any).
        self.write_token = write_token
        #: Answers carry the Hub's CORS headers (a page of any origin may read them).
        self.cors = cors
        #: LFS objects uploaded, by sha256; commits made: ``(repo, [paths])``.
        self.lfs: dict[str, bytes] = {}
        self.commits: list[tuple[str, list[str]]] = []
        #: Every request's ``Authorization`` header, in order (None where absent).
        self.authorizations: list[tuple[str, str | None]] = []
        self.sha = {name: hashlib.sha1(name.encode()).hexdigest() for name in self.repos}
        self.limit, self.window, self.lfs_from = limit, float(window), int(lfs_from)
        #: Requests being answered now (a killed client's included, until answered).
        self.in_flight = 0
        #: Every request: ``(method, path, status)``, logged when answered.
        self.log: list[tuple[str, str, int]] = []
        self._spoil: list[list[Any]] = []
        self._lock = threading.Lock()
        self._window_start = time.monotonic()
        self._used = 0
        self._server: _Server | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> HubEmulator:
        self._server = _Server((LOOPBACK, 0), self)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def endpoint(self) -> str:
        """The Hub's URL, for ``HF_ENDPOINT`` or ``HfFileSystem(endpoint=...)``."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def storage_options(self) -> dict[str, Any]:
        """fsspec options of ``hf://`` paths served here (anonymous)."""
        return {"endpoint": self.endpoint, "token": False}

    @property
    def resolves(self) -> int:
        """``/resolve`` requests answered so far (429s included)."""
        return sum(1 for _, path, _ in self.log if "/resolve/" in path)

    def spoil(self, path_contains: str, times: int = 1) -> None:
        """Flip one byte of the next ``times`` bodies served of a path containing
        ``path_contains`` (headers unchanged: a body spoiled in transit)."""
        with self._lock:
            self._spoil.append([path_contains, int(times)])

    def _spoiled(self, path: str, body: bytes) -> bytes:
        with self._lock:
            for rule in self._spoil:
                if rule[0] in path and rule[1] > 0 and body:
                    rule[1] -= 1
                    return bytes([body[0] ^ 0xFF]) + body[1:]
        return body

    def _note(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.log.append((method, path, status))

    # -- routes ---------------------------------------------------------------------------
    def _denied(self, repo: str, headers: Any) -> tuple | None:
        """The 401 of a private repo asked without its token, else None."""
        token = self.private.get(repo)
        if token is None or headers.get("Authorization") == f"Bearer {token}":
            return None
        return _json(
            401,
            {"error": "Invalid username or password."},
            {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Invalid username or password."},
        )

    def _route(
        self,
        method: str,
        parts: list[str],
        query: dict,
        form: dict | None,
        headers: Any,
        sent: bytes = b"",
    ) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.authorizations.append(("/".join(parts), headers.get("Authorization")))
        if method in ("POST", "PUT") and _is_write(parts):
            return self._write(method, parts, headers, sent)
        if parts[:1] == ["cdn"] and len(parts) >= 3:
            return self._cdn("/".join(parts[1:3]), "/".join(parts[3:]), headers)
        if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
            repo, rest = "/".join(parts[2:4]), parts[4:]
            denied = self._denied(repo, headers)
            if denied is not None:
                return denied
            if repo not in self.repos:
                return _json(
                    404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
                )
            if not rest or rest[0] == "revision":
                return _json(200, {"id": repo, "sha": self.sha[repo], "private": False})
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo, "/".join(rest[2:]), query.get("recursive") == ["true"])
            if rest[0] == "paths-info" and form is not None:
                return self._paths_info(repo, form.get("paths", []))
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            repo = "/".join(parts[1:3])
            denied = self._denied(repo, headers)
            if denied is not None:
                self._spend()
                return denied
            if self.branches_only and parts[4] != "main":
                self._spend()
                return _json(
                    404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}
                )
            return self._resolve(method, repo, "/".join(parts[5:]), headers)
        return _json(404, {"error": f"no route for {method} /{'/'.join(parts)}"})

    # -- the upload endpoints huggingface_hub's commits use (LFS; not Xet) ----------------
    def _write(self, method: str, parts: list[str], headers: Any, sent: bytes) -> tuple:
        signed = parts[:1] == ["lfs-upload"]  # a presigned URL, as a bucket's: no token
        if (
            self.write_token is not None
            and not signed
            and headers.get("Authorization") != f"Bearer {self.write_token}"
        ):
            return _json(401, {"error": "Invalid credentials in Authorization header"})
        if parts == ["api", "validate-yaml"]:
            return self._validate_yaml(json.loads(sent).get("content", ""))
        if parts == ["api", "repos", "create"]:
            doc = json.loads(sent)
            repo = f"{doc.get('organization') or 'user'}/{doc['name']}"
            if repo in self.repos:
                return _json(
                    409,
                    {
                        "error": "You already created this dataset repo",
                        "url": f"{self.endpoint}/datasets/{repo}",
                    },
                )
            if self.new_repos is None:
                return _json(403, {"error": "this emulator creates no repos"})
            folder = self.new_repos / repo
            folder.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self.repos[repo] = folder
                self.sha[repo] = hashlib.sha1(repo.encode()).hexdigest()
                if doc.get("visibility") == "private" or doc.get("private"):
                    self.private[repo] = self.write_token or ""
            return _json(200, {"url": f"{self.endpoint}/datasets/{repo}"})
        if parts[:1] == ["lfs-upload"] and len(parts) == 2 and method == "PUT":
            oid = parts[1]
            if hashlib.sha256(sent).hexdigest() != oid:
                return _json(400, {"error": "the object's sha256 is not its oid"})
            with self._lock:
                self.lfs[oid] = sent
            return 200, {}, b""
        if parts[:1] == ["datasets"] and len(parts) >= 3 and parts[2].endswith(".git"):
            return self._lfs_batch(json.loads(sent))
        repo, rest = "/".join(parts[2:4]), parts[4:]
        if repo not in self.repos:
            return _json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        if rest[:1] == ["preupload"]:
            return self._preupload(repo, json.loads(sent))
        if rest[:1] == ["commit"]:
            return self._commit(repo, sent)
        return _json(404, {"error": f"no route for {method} /{'/'.join(parts)}"})

    def _validate_yaml(self, content: str) -> tuple:
        """The card's front matter checked as the Hub renders it: YAML between ``---``
        lines, a known license, task categories and size category, tags as a list."""
        import yaml

        errors: list[str] = []
        if not content.startswith("---\n") or "\n---" not in content[4:]:
            return _json(200, {"errors": [], "warnings": [{"message": "empty metadata"}]})
        try:
            meta = yaml.safe_load(content[4 : content.index("\n---", 4)]) or {}
        except yaml.YAMLError as exc:
            meta, errors = {}, [f"YAML: {exc}"]
        if not isinstance(meta, dict):
            meta, errors = {}, [*errors, "the front matter is not a mapping"]
        if meta.get("license") not in _LICENSES:
            errors.append(f"license {meta.get('license')!r} is not one the Hub knows")
        for key, known in (("task_categories", _TASKS), ("size_categories", _SIZES)):
            values = meta.get(key, [])
            if not isinstance(values, list) or not set(values) <= known:
                errors.append(f"{key} {values!r}: expected a list of {sorted(known)}")
        if not isinstance(meta.get("tags", []), list):
            errors.append("tags: expected a list")
        if errors:
            return _json(400, {"errors": [{"message": e} for e in errors], "warnings": []})
        return _json(200, {"errors": [], "warnings": []})

    def _preupload(self, repo: str, doc: dict[str, Any]) -> tuple:
        files = []
        for entry in doc.get("files", []):
            sample = base64.b64decode(entry.get("sample", ""))
            lfs = int(entry["size"]) >= self.lfs_from or b"\0" in sample
            found = self.repos[repo] / entry["path"]
            oid = None
            if found.is_file():
                data = found.read_bytes()
                oid = hashlib.sha256(data).hexdigest() if lfs else _blob_id(data)
            files.append(
                {
                    "path": entry["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": False,
                    "oid": oid,
                }
            )
        return _json(200, {"files": files, "commitOid": self.sha[repo]})

    def _lfs_batch(self, doc: dict[str, Any]) -> tuple:
        objects = []
        for obj in doc.get("objects", []):
            entry: dict[str, Any] = {"oid": obj["oid"], "size": int(obj["size"])}
            if obj["oid"] not in self.lfs:
                entry["actions"] = {"upload": {"href": f"{self.endpoint}/lfs-upload/{obj['oid']}"}}
            objects.append(entry)
        return _json(200, {"transfer": "basic", "objects": objects}, {})

    def _commit(self, repo: str, sent: bytes) -> tuple:
        root = self.repos[repo]
        lines = [json.loads(line) for line in sent.decode().splitlines() if line.strip()]
        writes: dict[str, bytes] = {}
        for line in lines:
            value = line.get("value", {})
            if line.get("key") == "file":
                writes[value["path"]] = base64.b64decode(value["content"])
            elif line.get("key") == "lfsFile":
                data = self.lfs.get(value["oid"])
                if data is None:
                    return _json(400, {"error": f"LFS object {value['oid']} was never uploaded"})
                writes[value["path"]] = data
        for path, data in writes.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        with self._lock:
            self.sha[repo] = hashlib.sha1(
                (self.sha[repo] + repr(sorted(writes))).encode()
            ).hexdigest()
            self.commits.append((repo, sorted(writes)))
        return _json(
            200,
            {
                "commitUrl": f"{self.endpoint}/datasets/{repo}/commit/{self.sha[repo]}",
                "commitOid": self.sha[repo],
                "pullRequestUrl": None,
            },
        )

    def _entry(self, repo: str, path: Path) -> dict[str, Any]:
        rel = path.relative_to(self.repos[repo]).as_posix()
        if path.is_dir():
            return {"type": "directory", "path": rel, "oid": self.sha[repo]}
        data = path.read_bytes()
        entry = {
            "type": "file",
            "path": rel,
            "size": len(data),
            "oid": _blob_id(data),
        }
        if len(data) >= self.lfs_from:
            sha256 = hashlib.sha256(data).hexdigest()
            entry["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": 134}
        return entry

    def _tree(self, repo: str, path: str, recursive: bool) -> tuple:
        folder = self.repos[repo] / path
        if not folder.is_dir():
            return _json(
                404, {"error": f"{path} does not exist"}, {"X-Error-Code": "EntryNotFound"}
            )
        found = folder.rglob("*") if recursive else folder.iterdir()
        return _json(200, [self._entry(repo, p) for p in sorted(found)])

    def _paths_info(self, repo: str, paths: list[str]) -> tuple:
        root = self.repos[repo]
        return _json(200, [self._entry(repo, root / p) for p in paths if (root / p).exists()])

    def _resolve(self, method: str, repo: str, path: str, headers: Any) -> tuple:
        limited = self._spend()
        if limited is not None:
            return 429, limited, b'{"error": "rate limited"}'
        if self.delay:
            time.sleep(self.delay)
        file = self.repos.get(repo, Path("/nonexistent")) / path
        if repo not in self.repos or not file.is_file():
            return _json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        data = file.read_bytes()
        if self.redirect and len(data) >= self.lfs_from:
            return (
                302,
                {
                    "Location": f"/cdn/{repo}/{urllib.parse.quote(path)}",
                    "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                    "X-Linked-Size": str(len(data)),
                    "X-Repo-Commit": self.sha[repo],
                    "ETag": f'"{_blob_id(data)}"',
                },
                b"",
            )
        return self._serve(
            data,
            headers,
            {
                "ETag": f'"{hashlib.sha256(data).hexdigest()}"'
                if len(data) >= self.lfs_from
                else f'"{_blob_id(data)}"',
                "X-Repo-Commit": self.sha[repo],
            },
        )

    def _cdn(self, repo: str, path: str, headers: Any) -> tuple:
        """A CDN's answer: the bytes, with a tag of its own (not a checksum of the Hub's)."""
        file = self.repos.get(repo, Path("/nonexistent")) / path
        if repo not in self.repos or not file.is_file():
            return 404, {}, b"not found"
        data = file.read_bytes()
        return self._serve(data, headers, {"ETag": f'"cdn-{len(data)}"'})

    def _serve(self, data: bytes, headers: Any, tags: dict[str, str]) -> tuple:
        meta = {
            **tags,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        wanted = headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            first, _, last = wanted[len("bytes=") :].partition("-")
            if first == "":  # a suffix
                lo, hi = max(0, len(data) - int(last)), len(data)
            else:
                lo, hi = int(first), len(data) if last == "" else min(len(data), int(last) + 1)
            meta["Content-Range"] = f"bytes {lo}-{hi - 1}/{len(data)}"
            return 206, meta, data[lo:hi]
        return 200, meta, data

    def _spend(self) -> dict[str, str] | None:
        """Count one resolve: None while the window allows it, else the 429's headers."""
        if self.refuse_every:
            with self._lock:
                self._counted += 1
                if self._counted % self.refuse_every:
                    return None
            return {
                "Retry-After": "1",
                "RateLimit": '"resolvers";r=0;t=1',
                "RateLimit-Policy": f'"fixed window";"resolvers";q={self.refuse_every - 1};w=1',
                "Content-Type": "application/json",
            }
        if self.limit is None:
            return None
        with self._lock:
            now = time.monotonic()
            if now - self._window_start >= self.window:
                self._window_start, self._used = now, 0
            self._used += 1
            left = self.window - (now - self._window_start)
            if self._used <= self.limit:
                return None
            wait = max(1, math.ceil(left))
            return {
                "Retry-After": str(wait),
                "RateLimit": f'"resolvers";r=0;t={wait}',
                "RateLimit-Policy": f'"fixed window";"resolvers";q={self.limit};w={self.window:g}',
                "Content-Type": "application/json",
            }
