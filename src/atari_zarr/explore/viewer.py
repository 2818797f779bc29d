"""The episode viewer: a static page shipped in the wheel, and a loopback server for it.

The page is ``atari_zarr/viewer/index.html`` beside its bundled script ``viewer.js``
(built from ``viewer/`` at the repository's root by ``scripts/viewer.sh``). It reads a
store (or a root with ``catalog.json``) over http(s) in the browser, with no Python:
``index.html#store=URL&episode=E&step=K``. Any static host serves it (a bucket, a Hub
Space); ``file://`` works too, for stores whose host allows any origin (CORS).

:class:`ViewerServer` serves the page and one local store or root on loopback, from one
origin (so no CORS is needed), answering ``Range`` requests as object stores do, and
logs every request. ``atari-zarr view`` runs it (:func:`view`).

Examples
--------
>>> page_path().name, (page_path().parent / "viewer.js").is_file()
('index.html', True)
>>> page_url("https://example.org/Pong/1.zarr", episode=3, step=10)
'index.html#store=https://example.org/Pong/1.zarr&episode=3&step=10'
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse
import webbrowser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from atari_zarr.catalog import CATALOG, catalog_entries
from atari_zarr.errors import InvalidArgumentError, StoreFormatError, StoreNotFoundError
from atari_zarr.storage.paths import is_url, local_path

__all__ = ["ViewerServer", "page_path", "page_url", "view"]

#: Where the page and its script live in the package.
PAGE_DIR = Path(__file__).resolve().parents[1] / "viewer"
#: Where a :class:`ViewerServer` serves the local store (or root) it was given.
STORE_PREFIX = "/store"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript",
    ".json": "application/json",
}
# numbers of up to 20 digits (any file size); a longer one is no range a client means
_RANGE = re.compile(r"^bytes=(\d{0,20})-(\d{0,20})$")


def page_path() -> Path:
    """The viewer's page in the installed package (``atari_zarr/viewer/index.html``)."""
    return PAGE_DIR / "index.html"


def page_url(
    store: str,
    *,
    page: str = "index.html",
    path: str | None = None,
    episode: int | None = None,
    step: int | None = None,
) -> str:
    """The address of ``page`` opened on ``store`` (a root's store at ``path``), and on an
    episode's step, paused."""
    parts = [f"store={urllib.parse.quote(store, safe=':/@')}"]
    if path is not None:
        parts.append(f"path={urllib.parse.quote(path, safe='/')}")
    if episode is not None:
        parts.append(f"episode={int(episode)}")
    if step is not None:
        parts.append(f"step={int(step)}")
    return f"{page}#{'&'.join(parts)}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the log is ViewerServer.log
        pass

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_OPTIONS(self) -> None:  # a CORS preflight
        self._send(204, {}, b"", head=True)

    def _answer(self, *, head: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        viewer = self.server.viewer
        file = viewer.file_for(path)
        if file is None and viewer.catalog is not None and path == f"{STORE_PREFIX}/{CATALOG}":
            headers = {"Content-Type": "application/json"}
            self._send(200, headers, viewer.catalog, head=head)
            return
        if file is None:
            self._send(404, {"Content-Type": "text/plain"}, b"not found", head=head)
            return
        headers = {
            "Content-Type": _TYPES.get(file.suffix, "application/octet-stream"),
            "Accept-Ranges": "bytes",
        }
        try:  # only the bytes asked for are read: a chunk's range of a shard, not the shard
            with file.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                wanted = _RANGE.match(self.headers.get("Range") or "")
                if wanted is None or not (wanted.group(1) or wanted.group(2)):
                    self._send(200, headers, handle.read(), head=head)
                    return
                first, last = wanted.groups()
                if first:
                    lo, hi = int(first), size if not last else min(size, int(last) + 1)
                else:
                    lo, hi = max(0, size - int(last)), size
                if lo >= size or lo >= hi:
                    headers["Content-Range"] = f"bytes */{size}"
                    self._send(416, headers, b"", head=head)
                    return
                handle.seek(lo)
                body = handle.read(hi - lo)
        except OSError:  # gone since it was found, or not readable: not there for the page
            self._send(404, {"Content-Type": "text/plain"}, b"not found", head=head)
            return
        headers["Content-Range"] = f"bytes {lo}-{lo + len(body) - 1}/{size}"
        self._send(206, headers, body, head=head)

    def _send(self, status: int, headers: dict[str, str], body: bytes, *, head: bool) -> None:
        viewer = self.server.viewer
        viewer.note(self.command, urllib.parse.urlsplit(self.path).path, self.headers, status)
        self.send_response(status)
        if viewer.cors:
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Access-Control-Allow-Headers", "Range")
            self.send_header("Access-Control-Expose-Headers", "Content-Range, Retry-After")
        self.send_header("Cache-Control", "no-store")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], viewer: ViewerServer) -> None:
        super().__init__(address, _Handler)
        self.viewer = viewer


class ViewerServer:
    """The viewer's page (at ``/``) and a local store or root (at ``/store/``) on loopback.

    Parameters
    ----------
    store : str or path, optional
        A local store (``.../Pong/1.zarr``) or a root of stores, served at
        :data:`STORE_PREFIX`; None serves the page alone.
    port : int
        The port (0: a free one).
    cors : bool
        Let pages of any origin read what is served (``Access-Control-Allow-Origin: *``),
        as a public bucket configured for it does.
    page : bool
        Serve the page (False: the store alone, as a bucket would).
    catalog : dict, optional
        What ``/store/catalog.json`` answers where the root has no such file (a local
        root never indexed: its stores listed by :func:`view`).

    Attributes
    ----------
    log : list of tuple
        Every request answered: ``(method, path, range or None, status)``.
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | None = None,
        *,
        port: int = 0,
        cors: bool = False,
        page: bool = True,
        catalog: dict[str, Any] | None = None,
    ) -> None:
        self.store = None if store is None else Path(store).resolve()
        self.port = int(port)
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(
                f"port {port}: expected a port from 0 to 65535 (0: a free one) on 127.0.0.1."
            )
        self.cors = cors
        self.page = page
        self.catalog = None if catalog is None else json.dumps(catalog).encode()
        self.log: list[tuple[str, str, str | None, int]] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None

    def __enter__(self) -> ViewerServer:
        try:
            self._server = _Server(("127.0.0.1", self.port), self)
        except OSError as exc:
            raise InvalidArgumentError(
                f"127.0.0.1:{self.port} is in use, or may not be served ({exc.strerror or exc}): "
                f"expected a free port. Choose another port, or leave it out for a free one."
            ) from None
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``."""
        assert self._server is not None, "the server is not running"
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    @property
    def store_url(self) -> str:
        """Where the store (or root) is served."""
        return self.origin + STORE_PREFIX

    def url(self, store: str | None = None, **where: Any) -> str:
        """The page opened on ``store`` (default: the one served), at ``path``, ``episode``
        and ``step`` (:func:`page_url`)."""
        return f"{self.origin}/{page_url(store or self.store_url, **where)}"

    def note(self, method: str, path: str, headers: Any, status: int) -> None:
        with self._lock:
            self.log.append((method, path, headers.get("Range"), status))

    def file_for(self, path: str) -> Path | None:
        """The file served at URL path ``path``, or None (nothing, or outside what is served)."""
        if path.startswith(STORE_PREFIX + "/") and self.store is not None:
            base, rel = self.store, path[len(STORE_PREFIX) + 1 :]
        elif self.page and path.count("/") == 1:
            base, rel = PAGE_DIR, path[1:] or "index.html"
        else:
            return None
        try:  # a NUL, a name longer than the file system takes: no file has that path
            file = (base / rel).resolve()
            if not file.is_relative_to(base) or not file.is_file():
                return None  # a path out of what is served, ``..`` included, is not there
        except (OSError, ValueError):
            return None
        return file


def view(
    store_or_root: str, *, port: int = 0, browser: bool = True, print_url: Any = print
) -> None:
    """Serve the viewer on loopback, opened on ``store_or_root``, until interrupted.

    A local store or root is served beside the page (a root without ``catalog.json``
    with the catalog of its complete stores, listed now); a URL (``https://``, ``gs://``,
    ``hf://``) is read by the page straight from its host, which must allow it (CORS).

    Parameters
    ----------
    store_or_root : str
        A store (``.../Pong/1.zarr``) or a root with ``catalog.json``: a local path or a URL.
    port : int
        The port on 127.0.0.1 (0: a free one).
    browser : bool
        Open the page in the default browser (:mod:`webbrowser`); else only print its URL.
    print_url : callable
        Gets the page's URL (the CLI prints it).

    Raises
    ------
    StoreNotFoundError
        A local ``store_or_root`` that does not exist, or holds no complete store.
    StoreFormatError
        A local ``store_or_root`` that is a file.
    InvalidArgumentError
        A URL the page cannot read (not https, gs, s3 or hf; with credentials or a
        query), or a port out of range or in use.
    """
    location = str(store_or_root)
    remote = is_url(location) and not location.startswith("file://")
    if remote and not re.match(r"^(https?|gs|s3|hf)://", location):
        raise InvalidArgumentError(
            f"{location}: the viewer reads stores over https (https://, gs://, s3://, hf://) "
            f"or local paths; copy the store to one of those."
        )
    if remote:
        parts = urllib.parse.urlsplit(location)
        if parts.username is not None or parts.password is not None or parts.query:
            # the page fetches each file at the store's URL + its name: a browser sends no
            # user info of a URL, and a query (a signed URL's) grants one file only
            raise InvalidArgumentError(
                f"{location}: the viewer reads public stores, by URLs without credentials "
                f"(user:password@) or a query (?...). Make the store public (or readable "
                f"by this page: CORS), or copy it here (`atari-zarr pull`) and view the copy."
            )
    local = None if remote else Path(local_path(location))
    if local is not None and local.exists() and not local.is_dir():
        raise StoreFormatError(
            f"{location} is a file: expected a store (a folder, DEST/Pong/1.zarr) or a root "
            f"of stores to view. Give the folder, or list the stores with `atari-zarr ls DEST`."
        )
    if local is not None and not local.is_dir():
        raise StoreNotFoundError(
            f"{location} does not exist: expected a store (DEST/Pong/1.zarr) or a root of "
            f"stores to view. Check the path, or list the stores with `atari-zarr ls DEST`."
        )
    catalog = None
    if local is not None and not (local / "zarr.json").is_file():
        entries, indexed = catalog_entries(str(local), sizes=False)
        if not entries:
            raise StoreNotFoundError(
                f"{location} holds no complete store: expected a store (DEST/Pong/1.zarr) or "
                f"a root of stores (DEST). List what is there with `atari-zarr ls {location}`."
            )
        if not indexed:  # a root never indexed: its stores, listed now
            catalog = {"format": 1, "stores": entries}
    with ViewerServer(local, port=port, catalog=catalog) as server:
        url = server.url(location if remote else None)
        print_url(url)
        if browser:
            webbrowser.open(url)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
