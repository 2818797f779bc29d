"""The work area of a conversion in progress: lock, done markers and shared pieces.

A conversion of ``DEST/Pong/1.zarr`` keeps its bookkeeping next to the store, in
``DEST/Pong/1.zarr.converting/``, never inside it, so the store itself stays a plain
Zarr hierarchy (zarr warns about foreign objects inside a group) and
``--overwrite``, which empties the store, cannot delete the lock:

.. code-block:: text

    1.zarr.converting/
      lock.json             who is converting: host, pid, token, start, heartbeat
      plan.json             digest of the plan these markers belong to
      done/lap-{suffix}     a checkpoint's whole units and pieces are written
      done/unit-{a}-{u}     a shared unit (array a, unit u) is written
      pieces/{a}/{u}/{start}.npy   rows of a shared unit written by one checkpoint
      scans/inputs.json     fingerprint of the shards the scans below were read from
      scans/done/{i}        shard i is scanned (pass 1 of RL Unplugged)
      scans/{i}/{name}.npy  its per-record and per-step columns
      frames/{i}/...        its frames, when the scan kept them for the write pass
                            (:mod:`atari_zarr.conversion.kept_frames`)

Scans are kept when the plan's markers are reset (they depend on the source's
files only, and planning needs them), and dropped when the shards they were read
from change (``scans/inputs.json``) or the conversion starts over.

Markers are written after the data they vouch for, so a conversion killed at
any point redoes exactly the work whose marker is missing. The whole area is
deleted once the store is marked complete.

Every listing of the work area is the server's, never one cached by the process: the
worker processes of a conversion write markers and scans that the process planning it
lists (gcsfs and s3fs would otherwise answer from a listing made before they were
written, and a resumed conversion would never see its own work done).

Locking. ``lock.json`` appears whole or not at all: on local disks its content is
written to a file of its own, then hard-linked into place, which fails when a
lock exists (on object stores: create if absent, then read back our token, best
effort since object stores have no exclusive create through fsspec). A stale lock
is taken over under an ``flock`` of ``lock.guard`` and only if it is still the
very lock judged stale, so two takers never both take it over. A lock is
stale, and is taken over with a warning, when its owner ran on this host and its
pid is gone (a ``kill -9``), or when its heartbeat, refreshed every
:data:`HEARTBEAT_S` seconds while the conversion runs, is older than
:data:`LEASE_S` seconds (an owner on another host that died).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import numpy as np
from numcodecs import Blosc

from atari_zarr import npy_format
from atari_zarr.errors import StoreLockedError
from atari_zarr.layout import WORK_SUFFIX

try:  # POSIX: the guard of stale-lock takeovers
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs, local_write_error
from atari_zarr.storage.paths import is_url, join, redact

__all__ = ["HEARTBEAT_S", "LEASE_S", "WorkDir", "work_url"]

log = logging.getLogger("atari_zarr")

#: Seconds between refreshes of a held lock's heartbeat.
HEARTBEAT_S = 60.0
#: A lock whose heartbeat is older than this is stale (owner on another host died).
LEASE_S = 600.0


def work_url(store_url: str) -> str:
    """Where the work area of the store at ``store_url`` lives.

    Examples
    --------
    >>> work_url("gs://b/atari/Pong/1.zarr")
    'gs://b/atari/Pong/1.zarr.converting'
    """
    return str(store_url).rstrip("/") + WORK_SUFFIX


def _array_id(name: str) -> str:
    # array names hold "/" (next/reward); keep one path level per array
    return name.replace("/", ".")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


_PIECE_CODEC = Blosc(cname="zstd", clevel=1, shuffle=Blosc.NOSHUFFLE)


class WorkDir:
    """Bookkeeping of one conversion (see the module docstring).

    Parameters
    ----------
    store_url : str
        The store being written (local path or fsspec URL).
    storage_options : dict, optional
        fsspec options for the destination.
    timeout : float, None or "default"
        Seconds each call to the destination may take (default 60).

    Examples
    --------
    >>> import tempfile
    >>> work = WorkDir(tempfile.mkdtemp() + "/Pong/1.zarr")
    >>> work.mark("lap-0"); sorted(work.done())
    ['lap-0']
    """

    def __init__(
        self,
        store_url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        timeout: Timeout = "default",
    ) -> None:
        self.url = work_url(store_url)
        self.store_url = str(store_url).rstrip("/")
        self.storage_options = dict(storage_options or {})
        # the markers, scans and kept frames are written by worker processes while this
        # one lists them: a listing cached in this process would never show them
        self.fs, self.path = get_fs(
            self.url, self.storage_options, timeout=timeout, listings_cache=False
        )
        self._token: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # -- markers and pieces -------------------------------------------------------------
    def _p(self, *parts: str) -> str:
        return "/".join([self.path.rstrip("/"), *parts])

    def _write(self, path: str, data: bytes) -> None:
        if not is_url(self.url):
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.write_whole(path, data)  # never a half-written marker or piece

    def mark(self, key: str) -> None:
        """Record that the work named ``key`` is written."""
        self._write(self._p("done", key), b"")

    def done(self) -> set[str]:
        """Keys of the work already recorded as written."""
        try:
            entries = self.fs.ls(self._p("done"), detail=False)
        except FileNotFoundError:
            return set()
        names = (str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return {n for n in names if not n.endswith(".tmp")}

    def unit_key(self, name: str, unit: int) -> str:
        return f"unit-{_array_id(name)}-{unit}"

    def _piece_path(self, name: str, unit: int, start: int) -> str:
        return self._p("pieces", _array_id(name), str(unit), f"{start}.npy.blosc")

    def save_piece(self, name: str, unit: int, start: int, data: np.ndarray) -> None:
        """Store rows ``start ..`` of a shared unit, as Blosc-compressed plain ``.npy``.

        Compressed because a piece of frames is up to a whole shard raw (29 MB) and
        may travel to an object store; never pickled.
        """
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(data), allow_pickle=False)
        self._write(self._piece_path(name, unit, start), _PIECE_CODEC.encode(buf.getvalue()))

    def load_piece(self, name: str, unit: int, start: int) -> np.ndarray:
        with self.fs.open(self._piece_path(name, unit, start), "rb") as f:
            raw = bytes(_PIECE_CODEC.decode(f.read()))
        return npy_format.load(raw)

    def drop_pieces(self, name: str, unit: int) -> None:
        """Remove the pieces of a unit once it is written (a tidy-up: never fatal).

        A directory that looked present may be gone by the time it is deleted.
        """
        path = self._p("pieces", _array_id(name), str(unit))
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass  # already gone; release(remove_all=True) removes the work area anyway

    # -- frames a scan kept ---------------------------------------------------------------
    def save_bytes(self, *parts: str, data: bytes) -> None:
        """Keep ``data`` at ``parts`` (under the work area), whole or not at all."""
        self._write(self._p(*parts), data)

    def load_bytes(self, *parts: str) -> bytes:
        """What :meth:`save_bytes` kept at ``parts``."""
        with self.fs.open(self._p(*parts), "rb") as f:
            return bytes(f.read())

    def save_array(self, *parts: str, data: np.ndarray) -> None:
        """Keep ``data`` at ``parts`` (under the work area) as Blosc-compressed ``.npy``."""
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(data), allow_pickle=False)
        self.save_bytes(*parts, data=_PIECE_CODEC.encode(buf.getvalue()))

    def load_array(self, *parts: str) -> np.ndarray:
        """What :meth:`save_array` kept at ``parts`` (never unpickled)."""
        raw = bytes(_PIECE_CODEC.decode(self.load_bytes(*parts)))
        return npy_format.load(raw)

    def drop(self, *parts: str) -> None:
        """Remove what lies at ``parts`` (a tidy-up: never fatal)."""
        path = self._p(*parts)
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    # -- scans (pass 1) ------------------------------------------------------------------
    def scan_digest(self) -> str | None:
        """Fingerprint of the shards the kept scans were read from (None: no scans)."""
        try:
            with self.fs.open(self._p("scans", "inputs.json"), "rb") as f:
                return json.loads(f.read()).get("digest")
        except (FileNotFoundError, ValueError):
            return None

    def reset_scans(self, digest: str) -> None:
        """Forget every scan (and the frames scans kept); record the fingerprint of the
        shards the next ones read."""
        for sub in ("scans", "frames"):
            if self.fs.exists(self._p(sub)):
                self.fs.rm(self._p(sub), recursive=True)
        self._write(self._p("scans", "inputs.json"), json.dumps({"digest": digest}).encode())

    def save_scan(self, index: int, arrays: dict[str, np.ndarray]) -> None:
        """Keep the scan of shard ``index``: one Blosc-compressed ``.npy`` per column."""
        for name, data in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(data), allow_pickle=False)
            path = self._p("scans", str(index), f"{name}.npy.blosc")
            self._write(path, _PIECE_CODEC.encode(buf.getvalue()))

    def load_scan(self, index: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The columns ``names`` (default: all) of the scan of shard ``index``."""
        if names is None:
            found = self.fs.ls(self._p("scans", str(index)), detail=False)
            names = [
                str(p).rstrip("/").rsplit("/", 1)[-1].removesuffix(".npy.blosc") for p in found
            ]
            names = [n for n in names if not n.endswith(".tmp")]
        out = {}
        for name in names:
            with self.fs.open(self._p("scans", str(index), f"{name}.npy.blosc"), "rb") as f:
                raw = bytes(_PIECE_CODEC.decode(f.read()))
            out[name] = npy_format.load(raw)
        return out

    def mark_scan(self, index: int) -> None:
        """Record that the scan of shard ``index`` is kept."""
        self._write(self._p("scans", "done", str(index)), b"")

    def scans_done(self) -> set[int]:
        """Shards whose scan is kept."""
        try:
            entries = self.fs.ls(self._p("scans", "done"), detail=False)
        except FileNotFoundError:
            return set()
        names = (str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)
        return {int(n) for n in names if n.isdigit()}

    # -- plan ---------------------------------------------------------------------------
    def plan_digest(self) -> str | None:
        try:
            with self.fs.open(self._p("plan.json"), "rb") as f:
                return json.loads(f.read()).get("digest")
        except (FileNotFoundError, ValueError):
            return None

    def conversion_id(self) -> str | None:
        """The conversion that owns the store now (a new one at every :meth:`reset`)."""
        try:
            with self.fs.open(self._p("plan.json"), "rb") as f:
                found = json.loads(f.read()).get("conversion")
        except (FileNotFoundError, ValueError):
            return None
        return found if isinstance(found, str) else None

    def check_owner(self, conversion: str) -> None:
        """Raise unless ``conversion`` still owns the store: a task of a conversion
        started over since (``--overwrite``) must write nothing."""
        current = self.conversion_id()
        if current != conversion:
            raise StoreLockedError(
                f"{self.store_url}: a write task of conversion {conversion} found the store "
                f"owned by {'conversion ' + current if current else 'no conversion'}: it was "
                f"started over (--overwrite) or finished since. The task writes nothing; run "
                f"the conversion again if it was yours."
            )

    def reset(self, digest: str) -> None:
        """Forget all markers and pieces; record the plan they will belong to, under a
        new conversion id (tasks of the conversion before it then write nothing)."""
        for sub in ("done", "pieces", "plan.json"):
            if self.fs.exists(self._p(sub)):
                self.fs.rm(self._p(sub), recursive=True)
        doc = {"digest": digest, "conversion": uuid.uuid4().hex}
        self._write(self._p("plan.json"), json.dumps(doc).encode())

    # -- lock ---------------------------------------------------------------------------
    def _read_lock(self) -> dict[str, Any] | None:
        try:
            with self.fs.open(self._p("lock.json"), "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError:  # torn by a crash mid-write: nobody can be holding it
            return {}

    def _stale(self, owner: dict[str, Any]) -> bool:
        if not owner:
            return True
        if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
            return not _pid_alive(owner["pid"])
        return time.time() - float(owner.get("heartbeat", 0)) > LEASE_S

    def _create_lock(self, info: dict[str, Any]) -> bool:
        data = json.dumps(info).encode()
        path = self._p("lock.json")
        if not is_url(self.url):
            self.fs.makedirs(self.path, exist_ok=True)
            # written whole under a name of our own, then linked into place: a reader
            # never finds the lock empty, and the link fails when a lock exists
            tmp = f"{path}.{info['token']}.tmp"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
            except OSError as exc:
                raise local_write_error("creating", path, exc) from None
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return True
        try:  # one conditional request: only one of two takers creates it
            return self.fs.create_file(path, data)
        except NotImplementedError:
            pass
        if self.fs.exists(path):  # no conditional writes here: write, then read back
            return False
        self.fs.pipe_file(path, data)
        owner = self._read_lock()
        return owner is not None and owner.get("token") == info["token"]

    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock (host, pid, started, command), None when nobody does or
        the holder is gone (a stale lock, which the next :meth:`acquire` takes over)."""
        owner = self._read_lock()
        if owner is None or self._stale(owner):
            return None
        return owner

    def acquire(self, command: str) -> None:
        """Take the lock or raise :class:`StoreLockedError` naming its holder."""
        now = time.time()
        info: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "token": uuid.uuid4().hex,
            "started": now,
            "heartbeat": now,
            "command": redact(command),  # the lock sits in the store users mirror
        }
        for _ in range(2):
            if self._create_lock(info):
                self._token = str(info["token"])
                self._info = info
                self._beat = threading.Thread(target=self._heartbeat, daemon=True)
                self._beat.start()
                return
            owner = self._read_lock()
            if owner is None:
                continue  # released meanwhile
            if not self._stale(owner):
                started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["started"]))
                raise StoreLockedError(
                    f"{self.store_url} is being written by another conversion (pid "
                    f"{owner.get('pid')} on host {owner.get('host')}, started {started}, "
                    f"lock {join(self.url, 'lock.json')}); expected no other writer. Wait for "
                    f"it to finish (then run the command again to check). If that process is "
                    f"dead on another host, delete the lock file or wait {LEASE_S:.0f} s after "
                    f"its last heartbeat."
                )
            log.warning(
                "%s: taking over the stale lock of pid %s on host %s (no longer running)",
                self.store_url,
                owner.get("pid"),
                owner.get("host"),
            )
            self._take_over(owner)
        raise StoreLockedError(  # pragma: no cover - lost two races in a row
            f"{self.store_url}: could not take the lock {join(self.url, 'lock.json')}; another "
            f"conversion keeps taking it. Run the command again later."
        )

    def _take_over(self, stale: dict[str, Any]) -> None:
        """Remove the lock judged stale, ``stale``, if it is still the one in place.

        Local disks: under an exclusive ``flock`` of ``lock.guard``, read again and
        compare, so a lock another taker created meanwhile is never removed.
        """
        path = self._p("lock.json")
        if is_url(self.url) or fcntl is None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path)  # best effort: no conditional delete through fsspec
            return
        with open(self._p("lock.guard"), "ab") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                if self._read_lock() == stale:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            owner = self._read_lock()
            if not owner or owner.get("token") != self._token:
                log.error("%s: lost the lock to another conversion", self.store_url)
                return
            self._info["heartbeat"] = time.time()
            self._write(self._p("lock.json"), json.dumps(self._info).encode())

    def release(self, *, remove_all: bool) -> None:
        """Stop the heartbeat, then delete the lock (and everything else if asked)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if self._token is None:
            return
        owner = self._read_lock()
        self._token = None
        if owner and owner.get("token") != self._info["token"]:
            return  # someone took over a lock they thought stale; leave theirs alone
        if remove_all:
            if self.fs.exists(self.path):
                self.fs.rm(self.path, recursive=True)
        else:
            try:
                self.fs.rm(self._p("lock.json"))
            except FileNotFoundError:
                pass
