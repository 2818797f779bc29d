"""File system calls that honour the deadline: :class:`FileSystem` and :func:`get_fs`.

The package never calls an fsspec file system directly: :func:`get_fs` returns a
:class:`FileSystem`, which has the methods the package uses (``exists``, ``ls``,
``find``, ``glob``, ``du``, ``info``, ``cat_file``, ``pipe_file``, ``rm``,
``open``, ...) and sends every call of a remote file system through
:func:`~atari_zarr.storage.deadline.bounded`:

* **deadline.** For an async file system (gcsfs, s3fs, http, adlfs) the call's
  coroutine runs on fsspec's I/O loop inside ``asyncio.wait_for``: the whole
  call, the file system's retries and a listing's pages included, gets
  ``timeout`` seconds, then it is cancelled and
  :class:`~atari_zarr.errors.RemoteTimeoutError` is raised. Listings and
  existence checks are bounded as much as reads. A recursive ``rm`` is one
  bounded listing, then bounded batches of deletions, so that emptying a large
  store is not one call.
* **errors.** Failures become :class:`~atari_zarr.errors.RemoteAccessError`
  naming the redacted URL of the object; ``FileNotFoundError`` (and the other
  errors about the path itself) pass through for the caller to interpret.
  ``exists``/``isdir``/``isfile`` answer ``False`` only for a missing path: a
  server that fails raises, it is never mistaken for an empty place.
* **bounded reads of files.** ``open(path, "rb")`` returns a buffered reader
  whose reads are ranged ``cat_file`` calls of ``block_size`` bytes, each
  bounded (fsspec's own file objects call the file system without a deadline).
  ``open(path, "wb")`` collects the bytes and writes them with one bounded
  ``pipe_file`` when closed (object stores publish whole objects only).
* **fork safety.** After ``os.fork`` (a DataLoader or dask worker) the file
  system is built afresh instead of sharing the parent's HTTP session.
* **read-only web servers.** ``http://`` and ``https://`` locations are read;
  any change there (``pipe_file``, ``makedirs``, ``rm``, ``open(..., "wb")``)
  raises :class:`~atari_zarr.errors.StoreWriteError` before a request is made
  (:func:`~atari_zarr.storage.paths.refuse_write`).

Local paths use fsspec's ``LocalFileSystem`` directly (no network, no deadline).
File systems without an async implementation (``memory://``, sftp, ...) are
called directly with the same error translation; only async ones can be
cancelled, so only they get the deadline.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import shutil
import stat
import sys
import uuid
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar, cast
from urllib.parse import unquote

import fsspec
import fsspec.asyn
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations

from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    MissingDependencyError,
    RemoteAccessError,
    StoreFormatError,
    StoreWriteError,
    import_optional,
    install_hint,
)
from atari_zarr.forks import after_fork
from atari_zarr.redaction import redact_library_logs
from atari_zarr.storage.deadline import (
    bounded,
    remote_error,
    resolve_timeout,
    traced_options,
    with_retries,
)
from atari_zarr.storage.endpoint import check_resolves
from atari_zarr.storage.paths import is_read_only_url, is_url, local_path, redact, refuse_write

log = logging.getLogger("atari_zarr")

# Other libraries' records (gcsfs logs each failed round of retries with its traceback)
# reach an application's own logging only (the CLI's with -v): without a handler of
# theirs, Python's last-resort handler would print them to stderr.
for _library in ("gcsfs", "s3fs", "fsspec", "aiohttp", "aiobotocore", "botocore", "google"):
    logging.getLogger(_library).addHandler(logging.NullHandler())


def quiet_hub_logs() -> None:
    """huggingface_hub's records (a 429's "Rate limited. Waiting ..." among them) reach
    the application's logging only, as other libraries' do: the handler it adds on
    stderr by itself is replaced by a NullHandler. A handler the application added stays.
    """
    # its handler is added when its logging module is first imported: import it first
    import_optional("huggingface_hub.utils.logging", extra="hf", purpose="hf:// URLs")
    hub = logging.getLogger("huggingface_hub")
    for handler in list(hub.handlers):
        stream = getattr(handler, "stream", None)
        if type(handler) is logging.StreamHandler and stream in (sys.stderr, sys.__stderr__):
            hub.removeHandler(handler)
    if not hub.handlers:
        hub.addHandler(logging.NullHandler())


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "FileSystem",
    "backend_errors",
    "check_local_metadata",
    "disk_full_error",
    "get_fs",
    "local_write_error",
    "not_regular_error",
]

T = TypeVar("T")

#: Bytes per request of a file opened for reading (a whole buffer is read at once).
DEFAULT_BLOCK_SIZE = 5 << 20
#: Objects deleted per bounded call of a recursive ``rm``.
_RM_BATCH = 1000
#: Calls that change a file system: refused on http(s); locally, an OSError there means DEST
#: cannot be written.
_LOCAL_WRITES = frozenset({"makedirs", "pipe_file", "rm"})
#: Calls that write an object: "not found" answers them only when the bucket is missing.
_REMOTE_WRITES = frozenset({"pipe_file"})
#: Protocols whose fsspec back end comes with one of our extras.
_EXTRA_OF_PROTOCOL = {"s3": "s3", "s3a": "s3"}
#: Protocols whose back end the base install has (a damaged install lacks it): the package.
_BASE_PACKAGE_OF_PROTOCOL = {"gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}


@contextlib.contextmanager
def backend_errors(location: str, storage_options: dict[str, Any] | None = None) -> Iterator[None]:
    """Turn fsspec's failures to *find* a file system for ``location`` into our errors.

    fsspec raises ``ValueError`` for an unknown protocol and ``ImportError`` when the
    protocol's back end (gcsfs, s3fs, ...) is not installed.

    Examples
    --------
    >>> with backend_errors("nosuchproto://bucket/x"):
    ...     fsspec.core.url_to_fs("nosuchproto://bucket/x")
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: nosuchproto://bucket/x: the protocol ...
    """
    protocol = str(location).split("://", 1)[0]
    where = redact(str(location), storage_options)
    try:
        yield
    except ImportError as exc:
        extra = _EXTRA_OF_PROTOCOL.get(protocol)
        known = known_implementations.get(protocol, {})
        package = _BASE_PACKAGE_OF_PROTOCOL.get(
            protocol, str(known.get("class", protocol)).split(".", 1)[0]
        )
        hint = install_hint(extra) if extra else f"pip install {package}"
        raise MissingDependencyError(
            f"{where}: reading {protocol}:// needs the fsspec back end {package}, which is not "
            f"installed ({exc}); install it with: {hint}"
        ) from None
    except ValueError as exc:
        if "protocol" not in str(exc).lower():
            raise _setup_failed(protocol, where, exc, storage_options) from None
        raise InvalidArgumentError(
            f"{where}: the protocol {protocol!r} is not known to fsspec ({exc}); expected a "
            f"local path or a URL such as gs://, s3://, https://, memory:// or file://. Check "
            f"the spelling of the URL."
        ) from None
    except AtariZarrError:
        raise
    except Exception as exc:  # credentials refused or unreachable, bad option types, ...
        raise _setup_failed(protocol, where, exc, storage_options) from None


def _setup_failed(
    protocol: str, where: str, exc: BaseException, storage_options: dict[str, Any] | None
) -> RemoteAccessError:
    """The one-line error of a file system that could not be set up (credentials, options)."""
    found = redact(" ".join(str(exc).split()), storage_options)[:400]
    return RemoteAccessError(
        f"{where}: the {protocol}:// file system could not be set up with the storage options "
        f"given ({type(exc).__name__}: {found}); check the credentials and options "
        f"(--storage-option token=..., key=..., endpoint_url=...)"
    )


def _unreachable(exc: BaseException) -> BaseException | None:
    """The connection failure behind a FileNotFoundError, if that is what it hides."""
    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if isinstance(seen, ConnectionError | TimeoutError) or (
            type(seen).__module__.startswith("aiohttp") and "Connect" in type(seen).__name__
        ):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def _boxed(awaitable: Awaitable[T]) -> tuple[bool, Any]:
    # fsspec's sync() turns any TimeoutError (ours included) into its own
    # FSTimeoutError; carrying the outcome back as a value keeps our error as it is.
    try:
        return True, await awaitable
    except Exception as exc:
        return False, exc


#: The most bytes a metadata file (``zarr.json``, ``catalog.json``) may hold: the
#: catalog of every run of the dataset (300 stores) takes about 100 KB.
METADATA_LIMIT = 64 << 20


class FileSystem:
    """An fsspec file system whose every remote call honours a deadline.

    Parameters
    ----------
    location : str
        Local path or fsspec URL this file system serves (for messages and to
        choose the protocol).
    storage_options : dict, optional
        fsspec options for URLs.
    timeout : float, None or "default"
        Seconds each call may take, retries included; ``None`` for no limit;
        ``"default"``: :data:`~atari_zarr.storage.deadline.DEFAULT_TIMEOUT` (60 s).
    listings_cache : bool
        Whether listings (and what ``info`` and ``exists`` derive from them) may come
        from the file system's cache of earlier listings (gcsfs and s3fs keep one per
        process, for good). False for a place other processes change meanwhile, as the
        worker processes of a conversion change its work area: every answer is the
        server's.

    Attributes
    ----------
    path : str
        ``location`` as a path of this file system.
    fs : fsspec.AbstractFileSystem
        The underlying file system. Its calls are *not* bounded: use this
        object's methods.

    Examples
    --------
    >>> fs, path = get_fs("memory://doc-fs/a")
    >>> fs.pipe_file(f"{path}/b.bin", b"0123456789")
    >>> fs.exists(f"{path}/b.bin"), fs.cat_file(f"{path}/b.bin", 2, 5)
    (True, b'234')
    >>> with fs.open(f"{path}/b.bin", "rb") as f:
    ...     f.seek(8), f.read()
    (8, b'89')
    >>> fs.ls(path)
    ['/doc-fs/a/b.bin']
    """

    def __init__(
        self,
        location: str,
        storage_options: dict[str, Any] | None = None,
        *,
        timeout: float | str | None = "default",
        listings_cache: bool = True,
    ) -> None:
        self.location = str(location)
        self.storage_options = dict(storage_options or {})
        self.timeout = resolve_timeout(timeout)
        self.listings_cache = bool(listings_cache)
        self.remote = is_url(self.location)
        #: True for http(s):// locations, which are never written.
        self.read_only = is_read_only_url(self.location)
        self._connect()
        after_fork(self._after_fork)

    def _after_fork(self) -> None:
        self._forked = True

    def _connect(self) -> None:
        self._forked = False
        #: The process's shared instance, where this one keeps no listings of its own.
        self._shared: fsspec.AbstractFileSystem | None = None
        if self.remote:
            redact_library_logs()  # fsspec's DEBUG lines name the URL, user info included
            if self.location.startswith("hf://"):
                quiet_hub_logs()
            check_resolves(self.location, self.storage_options, timeout=self.timeout)
            with backend_errors(self.location, self.storage_options):
                options = traced_options(self.location, self.storage_options)
                fs, path = fsspec.core.url_to_fs(self.location, **options)
                cache = getattr(fs, "dircache", None)
                if not self.listings_cache and getattr(cache, "use_listings_cache", False):
                    # an instance of its own (fsspec keeps one per set of options) whose
                    # cache never answers: the process's shared one may hold listings
                    # that other processes made stale since
                    uncached = {**options, "use_listings_cache": False}
                    shared, (fs, path) = fs, fsspec.core.url_to_fs(self.location, **uncached)
                    # what this one writes or removes, the shared one's listings forget
                    self._shared = shared
            self._fs: fsspec.AbstractFileSystem = fs
            self.path = str(path)
        else:
            self._fs = LocalFileSystem()
            self.path = os.path.abspath(local_path(self.location))

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._forked:
            self._connect()  # the parent's session, sockets and event loop are not ours
        return self._fs

    @property
    def bounded(self) -> bool:
        """True when calls get the deadline (a remote async file system)."""
        fs = self.fs
        return self.remote and bool(getattr(fs, "async_impl", False))

    def __getstate__(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "storage_options": self.storage_options,
            "timeout": self.timeout,
            "listings_cache": self.listings_cache,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["location"],
            state["storage_options"],
            timeout=state["timeout"],
            listings_cache=state.get("listings_cache", True),
        )

    def __repr__(self) -> str:
        return f"FileSystem({redact(self.location, self.storage_options)!r})"

    def url(self, path: str) -> str:
        """The URL of ``path`` for messages, credentials removed.

        Examples
        --------
        >>> fs, path = get_fs("memory://doc-fs/a")
        >>> fs.url(path + "/zarr.json")
        'memory://doc-fs/a/zarr.json'
        """
        path = str(path)
        if not self.remote:
            return path
        base = self.path.rstrip("/")
        if path == base or path.startswith(base + "/"):
            # spelled the way the user spelled the location
            url = self.location.rstrip("/") + path[len(base) :]
        else:
            url = self.fs.unstrip_protocol(path)
        return redact(url, self.storage_options)

    # -- the one way a call is made ------------------------------------------------------
    def _call(self, what: str, name: str, where: str, *args: Any, **kwargs: Any) -> Any:
        if self.read_only and name in _LOCAL_WRITES:
            raise refuse_write(what, where)
        if self._shared is not None and name in _LOCAL_WRITES:
            try:
                return self._call_fs(what, name, where, *args, **kwargs)
            finally:  # the shared instance's listings would miss this write (or removal)
                self._shared.invalidate_cache()
        return self._call_fs(what, name, where, *args, **kwargs)

    def _call_fs(self, what: str, name: str, where: str, *args: Any, **kwargs: Any) -> Any:
        fs = self.fs
        if not self.remote:
            if name not in _LOCAL_WRITES:
                return getattr(fs, name)(*args, **kwargs)
            try:
                return getattr(fs, name)(*args, **kwargs)
            except OSError as exc:
                if name == "rm" and isinstance(exc, FileNotFoundError):
                    raise  # nothing to delete: the caller decides
                raise local_write_error(what, where, exc) from None
        if self.bounded:
            method = getattr(fs, f"_{name}")
            # fsspec's http file system does not retry: a web server's 503 is retried here
            coroutine = (
                with_retries(lambda: method(*args, **kwargs))
                if self.read_only
                else method(*args, **kwargs)
            )
            try:
                return self._run(what, where, coroutine)
            except FileNotFoundError:
                if name in _REMOTE_WRITES:
                    raise missing_bucket_error(what, where) from None
                raise
        try:
            return getattr(fs, name)(*args, **kwargs)
        except FileNotFoundError:
            if name in _REMOTE_WRITES:
                raise missing_bucket_error(what, where) from None
            raise
        except Exception as exc:
            error = remote_error(exc, what, where, self.timeout, self.storage_options)
            if error is None:
                raise
            raise error from None

    def _run(self, what: str, where: str, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` on the file system's loop within the deadline, its errors
        translated (:func:`~atari_zarr.storage.deadline.bounded`)."""
        ok, value = fsspec.asyn.sync(
            self.fs.loop,
            _boxed,
            bounded(
                what, where, coroutine, timeout=self.timeout, storage_options=self.storage_options
            ),
        )
        if ok:
            return cast(T, value)
        raise value

    # -- queries -------------------------------------------------------------------------
    def info(self, path: str) -> dict[str, Any]:
        """Details of one path (``name``, ``size``, ``type``); FileNotFoundError if absent."""
        return cast(dict[str, Any], self._call("checking", "info", self.url(path), path))

    def exists(self, path: str) -> bool:
        """True if ``path`` exists; a failing server raises instead of answering False.

        fsspec's http file system answers FileNotFoundError for any failure, a refused
        connection included: that one raises :class:`RemoteAccessError` here.
        """
        if not self.remote:
            return bool(self.fs.exists(path))
        try:
            self.info(path)
        except FileNotFoundError as exc:
            cause = _unreachable(exc)
            if cause is not None:
                where = redact(self.url(path), self.storage_options)
                err = remote_error(cause, "checking", where, self.timeout, self.storage_options)
                raise (err or exc) from None
            return False
        return True

    def isdir(self, path: str) -> bool:
        """True if ``path`` is a directory (a prefix, on object stores)."""
        if not self.remote:
            return bool(self.fs.isdir(path))
        try:
            return self.info(path).get("type") == "directory"
        except FileNotFoundError:
            return False

    def isfile(self, path: str) -> bool:
        """True if ``path`` is a file (an object)."""
        if not self.remote:
            return bool(self.fs.isfile(path))
        try:
            return self.info(path).get("type") == "file"
        except FileNotFoundError:
            return False

    def _listed(self, name: str) -> str:
        """A listed name as the file is called: a web server's directory listing gives
        links, percent-encoded (``%24store%24_action_ckpt.0.gz``), which are decoded."""
        return unquote(name) if self.read_only else name

    def ls(self, path: str, detail: bool = False) -> list[Any]:
        """Entries directly under ``path`` (names, or dicts with ``detail=True``)."""
        found = self._call("listing", "ls", self.url(path), path, detail=detail)
        if not self.read_only:
            return cast(list[Any], found)
        if detail:
            return [{**entry, "name": self._listed(entry["name"])} for entry in found]
        return [self._listed(name) for name in found]

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False) -> list[str]:
        """Every file below ``path`` (and directories with ``withdirs``), sorted."""
        found = self._call(
            "listing", "find", self.url(path), path, maxdepth=maxdepth, withdirs=withdirs
        )
        return sorted(self._listed(name) for name in found)

    def glob(self, pattern: str, maxdepth: int | None = None) -> list[str]:
        """Paths matching ``pattern`` (``*``, ``**``, ``?``, ``[..]``)."""
        kwargs = {} if maxdepth is None else {"maxdepth": maxdepth}
        found = self._call("listing", "glob", self.url(pattern), pattern, **kwargs)
        return sorted(self._listed(name) for name in found)

    def du(self, path: str) -> int:
        """Total bytes of the files below ``path`` (one listing)."""
        return int(self._call("listing", "du", self.url(path), path, total=True))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``start:end`` of a file (all of it by default)."""
        where = self.url(path)
        if start is not None or end is not None:
            where += f" (bytes {start or 0}-{'' if end is None else end})"
        return cast(bytes, self._call("reading", "cat_file", where, path, start=start, end=end))

    def cat_metadata(self, path: str, limit: int = METADATA_LIMIT) -> bytes:
        """A metadata file (``zarr.json``, ``catalog.json``): a regular file of at most
        ``limit`` bytes, read whole.

        A link or a special file in its place (a FIFO would hang the read for ever,
        ``/dev/zero`` would read until memory runs out) and a file beyond ``limit`` are
        refused before anything is read; remotely, at most ``limit + 1`` bytes are asked.

        Raises
        ------
        FileNotFoundError
            Nothing is there.
        StoreFormatError
            A link, a special file, or more than ``limit`` bytes.
        """
        where = self.url(path)
        if not self.remote:
            try:
                found = os.lstat(local_path(where))
            except (FileNotFoundError, NotADirectoryError):
                raise FileNotFoundError(where) from None
            mode, size = found.st_mode, found.st_size
            if not stat.S_ISREG(mode):
                raise not_regular_error(where, path_kind(mode))
            if size > limit:
                raise _too_big(where, size, limit)
            return self.cat_file(path)
        data = self.cat_file(path, 0, limit + 1)
        if len(data) > limit:
            raise _too_big(where, len(data), limit)
        return data

    # -- changes -------------------------------------------------------------------------
    def pipe_file(self, path: str, data: bytes) -> None:
        """Write ``data`` as the whole content of ``path``."""
        self._call("writing", "pipe_file", self.url(path), path, bytes(data))

    def write_whole(self, path: str, data: bytes) -> None:
        """Write ``data`` as ``path``, seen whole or not at all, never left half written.

        On a local disk the bytes go to a file of their own beside ``path``, renamed into
        place once written, and removed when the write fails (a full disk is the one
        line of :func:`disk_full_error`); object stores publish whole objects anyway.
        """
        if self.remote:
            self.pipe_file(path, data)
            return
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            full = disk_full_error(path, exc, resume="nothing was left half written")
            if full is not None:
                raise full from None
            raise local_write_error("writing", path, exc) from None

    def create_file(self, path: str, data: bytes) -> bool:
        """Write ``data`` to ``path`` only if nothing is there, in one conditional request
        (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``): False if something was.

        Raises ``NotImplementedError`` for a file system without conditional writes.
        """
        try:
            self._call("creating", "pipe_file", self.url(path), path, bytes(data), mode="create")
        except FileExistsError:
            return False
        except TypeError as exc:  # this backend's pipe_file takes no mode
            raise NotImplementedError(f"{self.location}: no conditional create") from exc
        return True

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Create a directory and its parents (nothing to do on object stores)."""
        self._call("creating", "makedirs", self.url(path), path, exist_ok=exist_ok)

    def rm(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (and everything below it with ``recursive``)."""
        if not (self.bounded and recursive):
            self._call("deleting", "rm", self.url(path), path, recursive=recursive)
            return
        # one bounded listing, then bounded batches: emptying a large prefix is many calls
        paths = self.find(path, withdirs=True)
        if not paths:
            raise FileNotFoundError(self.url(path))
        for i in range(0, len(paths), _RM_BATCH):
            batch = paths[i : i + _RM_BATCH]
            where = f"{self.url(path)} ({len(batch)} objects)"
            try:
                self._call("deleting", "rm", where, batch)
            except FileNotFoundError:
                pass  # listed, then gone: already deleted (directory markers, races)
        self.invalidate_cache(path)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget cached listings (no I/O)."""
        self.fs.invalidate_cache(path)

    # -- files ---------------------------------------------------------------------------
    def open(self, path: str, mode: str = "rb", block_size: int | None = None) -> Any:
        """A file object; for remote file systems, every request of it honours the deadline.

        Parameters
        ----------
        path : str
            Path within this file system.
        mode : {"rb", "wb"}
            Read, or write the whole file (written when closed).
        block_size : int, optional
            Bytes fetched per request when reading (default
            :data:`DEFAULT_BLOCK_SIZE`).
        """
        if mode not in ("rb", "wb"):
            raise InvalidArgumentError(
                f"open({path!r}, {mode!r}): only 'rb' and 'wb' are supported"
            )
        if mode == "wb" and self.read_only:
            raise refuse_write("writing", self.url(path))
        if not self.bounded:
            kwargs = {} if block_size is None else {"block_size": block_size}
            if not self.remote:
                return self.fs.open(path, mode, **kwargs)
            return self._open_direct(path, mode, **kwargs)
        if mode == "wb":
            return _PipeWriter(self, path)
        details = self.info(path)
        if details.get("type") == "directory":
            raise IsADirectoryError(f"{self.url(path)} is a directory, not a file")
        raw = _RangeReader(self, path, int(details["size"]))
        return io.BufferedReader(raw, buffer_size=block_size or DEFAULT_BLOCK_SIZE)

    def _open_direct(self, path: str, mode: str, **kwargs: Any) -> Any:
        try:
            return self.fs.open(path, mode, **kwargs)
        except Exception as exc:
            error = remote_error(exc, "opening", self.url(path), self.timeout, self.storage_options)
            if error is None:
                raise
            raise error from None


def missing_bucket_error(what: str, where: str) -> StoreWriteError:
    """The error for a write to an object store answered "not found": no such bucket.

    Examples
    --------
    >>> str(missing_bucket_error("creating", "gs://nope/x/lock.json")).split(" failed")[0]
    'creating gs://nope/x/lock.json'
    """
    return StoreWriteError(
        f"{what} {where} failed: the server answered 404 Not Found to a write, so its "
        f"bucket does not exist (or is not visible with these credentials); expected an "
        f"existing bucket you may write to. Create the bucket, or choose another "
        f"destination (--home, $ATARI_ZARR_HOME, or the store's URL)."
    )


def local_write_error(what: str, where: str, exc: BaseException | None) -> StoreWriteError:
    """The error for a local path that cannot be written (missing parent, permissions, space).

    Examples
    --------
    >>> err = local_write_error("creating", "/proc/x", PermissionError(13, "Permission denied"))
    >>> str(err).split(":")[0]
    'creating /proc/x failed (Permission denied)'
    """
    reason = getattr(exc, "strerror", None) or str(exc)
    return StoreWriteError(
        f"{what} {where} failed ({reason}): expected a writable directory. Choose another "
        f"destination, or fix its permissions or free space."
    )


#: errno values of a full disk (no space, quota exceeded).
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full_error(dest: str, exc: BaseException, *, resume: str) -> StoreWriteError | None:
    """The one-line error of a disk that filled up while writing ``dest``; None otherwise.

    Names the destination, the object being written and the space left, and says
    what running the command again does (``resume``).

    Examples
    --------
    >>> err = disk_full_error("/data/Pong/1.zarr", OSError(28, "No space left on device",
    ...                       "/data/Pong/1.zarr/observation/c/3/0/0"), resume="it resumes")
    >>> str(err).split(" (")[0]
    '/data/Pong/1.zarr: the disk is full'
    >>> disk_full_error("/d", OSError(13, "Permission denied"), resume="") is None
    True
    """
    if not isinstance(exc, OSError) or exc.errno not in _DISK_FULL:
        return None
    where = getattr(exc, "filename", None) or dest
    probe = os.path.dirname(os.path.abspath(str(dest)))
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        free = f"{shutil.disk_usage(probe or '/').free / 1e6:,.1f} MB free on its disk"
    except OSError:
        free = "free space unknown"
    return StoreWriteError(
        f"{dest}: the disk is full ({exc.strerror or exc}) while writing {where}; "
        f"{free}. Free some space, then run the same command again: {resume}"
    )


class _RangeReader(io.RawIOBase):
    """A read-only remote file: each read is one bounded ranged ``cat_file``.

    Over http(s), each read is one ranged GET whose answer is checked: a 206 must be
    the range asked (its ``Content-Range`` and length). A server that ignores ``Range``
    (``python -m http.server``) answers 200 with the whole object: that answer is kept
    open and read on as a stream, a block per read (each within the deadline), so
    memory holds a block, never the object, and a prefix costs only its bytes; a read
    before the stream's place starts it again. Any other answer is one line.
    """

    def __init__(self, fs: FileSystem, path: str, size: int) -> None:
        self._fs = fs
        self.name = path
        self.size = size
        self._pos = 0
        #: http(s): ranged GETs checked here (fsspec's ``cat_file`` takes any answer).
        self._http = fs.read_only and hasattr(fs.fs, "set_session")  # fsspec's http
        #: The open answer of a server that ignores Range, and the offset of its next byte.
        self._stream: Any = None
        self._stream_at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _wrong(self, start: int, end: int, found: str) -> RemoteAccessError:
        return RemoteAccessError(
            f"{self._fs.url(self.name)}: bytes {start}-{end - 1} of its {self.size:,} were "
            f"asked for and {found}; expected those bytes. The object may have changed while "
            f"it was read, or the server answers ranges wrongly: run the command again, or "
            f"copy the files and read them locally."
        )

    def _fetch(self, n: int) -> bytes:
        start, end = self._pos, min(self._pos + n, self.size)
        if end <= start:
            return b""
        if self._http:
            where = f"{self._fs.url(self.name)} (bytes {start}-{end - 1})"
            try:
                data = self._fs._run("reading", where, self._get(start, end))
            except BaseException:
                self._drop_stream()  # cut off mid-read: its place is unknown
                raise
        else:
            data = self._fs.cat_file(self.name, start, end)
            if len(data) != end - start:
                raise self._wrong(start, end, f"{len(data):,} bytes came back")
        self._pos = end
        return data

    async def _get(self, start: int, end: int) -> bytes:
        """Bytes ``start:end``: a checked 206, or read on from the stream of a 200."""
        fs = self._fs.fs
        if self._stream is not None and self._stream_at > start:
            self._drop_stream()  # a stream goes forward only: start it again
        if self._stream is None:
            kwargs = dict(fs.kwargs)
            headers = {**(kwargs.pop("headers", None) or {}), "Range": f"bytes={start}-{end - 1}"}
            session = await fs.set_session()
            answer = await session.get(fs.encode_url(self.name), headers=headers, **kwargs)
            try:
                fs._raise_not_found_for_status(answer, self.name)
                if answer.status == 206:
                    span = answer.headers.get("Content-Range", "")
                    want = f"bytes {start}-{end - 1}/"
                    if not span.startswith(want):
                        raise self._wrong(start, end, f"the server sent {span or 'no range'!r}")
                    data = await _read_up_to(answer.content, end - start + 1)
                    answer.release()  # the connection back to the pool, or closed
                    if len(data) != end - start:
                        raise self._wrong(start, end, f"{len(data):,} bytes came back")
                    return data
                if answer.status != 200:
                    raise self._wrong(start, end, f"the server answered {answer.status}")
                length = answer.headers.get("Content-Length")
                if length is not None and length.strip() != str(self.size):
                    raise self._wrong(start, end, f"a whole object of {length} bytes came back")
            except BaseException:
                answer.close()
                raise
            log.info(
                "%s: the server ignores Range (200, the whole object): read as a stream",
                self._fs.url(self.name),
            )
            self._stream, self._stream_at = answer, 0
        skip = start - self._stream_at
        while skip:  # bytes before the range: read past, never kept
            passed = await _read_up_to(self._stream.content, min(skip, DEFAULT_BLOCK_SIZE))
            if not passed:
                break
            skip -= len(passed)
            self._stream_at += len(passed)
        data = b"" if skip else await _read_up_to(self._stream.content, end - start)
        self._stream_at += len(data)
        if len(data) != end - start:
            self._drop_stream()
            raise self._wrong(
                start, end, f"the whole object it sent instead ended at byte {self._stream_at:,}"
            )
        return data

    def _drop_stream(self) -> None:
        stream, self._stream, self._stream_at = self._stream, None, 0
        if stream is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to close
                self._fs.fs.loop.call_soon_threadsafe(stream.close)

    def close(self) -> None:
        self._drop_stream()
        super().close()

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._fetch(len(view))
        view[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self._fetch(self.size - self._pos)  # one request, not one per 8 KB


async def _read_up_to(content: Any, n: int) -> bytes:
    """At most ``n`` bytes of an HTTP body (fewer only at its end): a body longer than
    asked is never read past ``n``."""
    parts, got = [], 0
    while got < n:
        part = await content.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class _PipeWriter(io.BytesIO):
    """Collects the bytes of a file; one bounded ``pipe_file`` publishes them on close."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        super().__init__()
        self._fs = fs
        self.name = path

    def close(self) -> None:
        if not self.closed:
            data = self.getvalue()
            super().close()
            self._fs.pipe_file(self.name, data)


def get_fs(
    location: str,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: float | str | None = "default",
    listings_cache: bool = True,
) -> tuple[FileSystem, str]:
    """Return ``(file system, path)`` for a local path or fsspec URL.

    Parameters
    ----------
    location : str
        Local path or fsspec URL.
    storage_options : dict, optional
        fsspec options for URLs.
    timeout : float, None or "default"
        Seconds each remote call may take, retries included (see :class:`FileSystem`).
    listings_cache : bool
        False: every listing is the server's, never a cached one (see :class:`FileSystem`).

    Examples
    --------
    >>> fs, path = get_fs("memory://atari/Pong")
    >>> type(fs.fs).__name__, path
    ('MemoryFileSystem', '/atari/Pong')
    >>> get_fs("/data/atari")[1]
    '/data/atari'
    """
    fs = FileSystem(str(location), storage_options, timeout=timeout, listings_cache=listings_cache)
    return fs, fs.path


def _too_big(where: str, size: int, limit: int) -> StoreFormatError:
    return StoreFormatError(
        f"{where} holds {'more than ' if size > limit else ''}{size:,} bytes; expected "
        f"metadata of at most {limit:,}. The file is not what atari-zarr writes: replace it "
        f"(write the catalog again with `atari-zarr index`, or copy the store again)."
    )


def path_kind(mode: int) -> str:
    """What a path that is not a regular file is, from its ``lstat`` mode.

    Examples
    --------
    >>> import stat
    >>> path_kind(stat.S_IFDIR), path_kind(stat.S_IFLNK), path_kind(stat.S_IFIFO)
    ('a directory', 'a symbolic link', 'a special file (FIFO, device or socket)')
    """
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a special file (FIFO, device or socket)"


def not_regular_error(path: str | os.PathLike[str], what: str) -> StoreFormatError:
    """The error for an object of a local store that is ``what`` instead of a regular file."""
    return StoreFormatError(
        f"{path} is {what}; expected a regular file, as every object of a store is. "
        f"Replace it with the object itself (copy the store again without links)."
    )


def check_local_metadata(root: str | os.PathLike[str]) -> None:
    """Refuse a local store whose metadata (``zarr.json`` of the store, its groups and
    arrays) is a symbolic link or a special file: a FIFO would hang the open for ever.

    Raises
    ------
    StoreFormatError
        Naming the first such file.

    Examples
    --------
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> os.mkfifo(f"{root}/zarr.json")
    >>> check_local_metadata(root)
    Traceback (most recent call last):
        ...
    atari_zarr.errors.StoreFormatError: .../zarr.json is a special file (FIFO, ...
    """
    # the store, its arrays and groups, and the arrays of next/ (scandir: a directory's
    # entries say their type without a system call each, as pathlib's glob does not)
    dirs = [(os.fspath(root), 0)]
    while dirs:
        directory, depth = dirs.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name == "zarr.json":
                if not entry.is_file(follow_symlinks=False):
                    try:
                        mode = os.lstat(entry.path).st_mode
                    except FileNotFoundError:
                        continue
                    raise not_regular_error(entry.path, path_kind(mode))
            elif depth < 2 and entry.is_dir(follow_symlinks=False):
                dirs.append((entry.path, depth + 1))
