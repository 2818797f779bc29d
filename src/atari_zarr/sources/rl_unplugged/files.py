"""Find RL Unplugged runs and their shards: ``{root}/{Game}/run_{r}-{i:05d}-of-{N:05d}``.

A run of RL Unplugged's ordered Atari episodes (TFDS ``rlu_atari_checkpoints_ordered``)
is ``N`` shard files beside the other runs of its game, one per DQN checkpoint in
time order (``N`` is 50, or 49 for Carnival, Gravitar and StarGunner):

.. code-block:: text

    gs://rl_unplugged/atari_episodes_ordered/Pong/run_1-00000-of-00050
    gs://rl_unplugged/atari_episodes_ordered/Pong/run_1-00001-of-00050
    ...

Shard ``i`` holds checkpoint ``i``. A shard absent from the listing is a gap in the
run; every shard of a run must agree on ``N``. The store of ``run_1`` is
``{Game}/1.zarr``.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

from atari_zarr.errors import SourceChangedError, SourceFormatError, SourceNotFoundError
from atari_zarr.layout import validate_name
from atari_zarr.sources.rl_unplugged.tfrecord import PREFIX_BLOCK, READ_BLOCK, open_shard
from atari_zarr.sources.roots import open_root, select_games
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.paths import join

__all__ = [
    "RluRun",
    "Shard",
    "find_runs",
    "holds_shards",
    "is_shard_name",
    "presets",
    "shard_name",
    "shard_run",
]

log = logging.getLogger("atari_zarr")

_SHARD_RE = re.compile(r"^run_(?P<run>\d+)-(?P<index>\d{5})-of-(?P<total>\d{5})$")


def shard_name(run: str | int, index: int, total: int) -> str:
    """File name of shard ``index`` of ``total`` of run ``run``.

    Examples
    --------
    >>> shard_name(1, 3, 50)
    'run_1-00003-of-00050'
    """
    return f"run_{run}-{index:05d}-of-{total:05d}"


def shard_run(name: str) -> str | None:
    """The run of shard file ``name`` (no directory), None when it is not one.

    Examples
    --------
    >>> shard_run("run_2-00049-of-00050"), shard_run("replay_logs")
    ('2', None)
    """
    match = _SHARD_RE.match(name)
    return None if match is None else str(int(match["run"]))


def is_shard_name(name: str) -> bool:
    """Whether ``name`` (a file name, no directory) is named like an RL Unplugged shard.

    Examples
    --------
    >>> is_shard_name("run_2-00049-of-00050"), is_shard_name("replay_logs")
    (True, False)
    """
    return _SHARD_RE.match(name) is not None


def presets(num_shards: int) -> dict[str, list[int]]:
    """d4rl-atari's presets as shard indices of a run of ``num_shards`` shards.

    ``mixed`` is checkpoint 1, ``medium`` checkpoint 10, as for DQN Replay; ``expert``
    is the last checkpoint of the run (50 in DQN Replay, whose final partial
    checkpoint RL Unplugged does not have: shard ``num_shards - 1`` here).

    Examples
    --------
    >>> presets(50)
    {'mixed': [1], 'medium': [10], 'expert': [49]}
    """
    return {"mixed": [1], "medium": [10], "expert": [num_shards - 1]}


@dataclass(frozen=True)
class Shard:
    """One shard file of a run."""

    index: int
    total: int
    name: str
    #: Path within the file system (no protocol).
    path: str
    #: Size in bytes as listed (part of the scan's fingerprint), None when unknown.
    size: int | None = None
    #: The object's version as listed (part of the scan's fingerprint): its generation
    #: (Cloud Storage), ETag (S3, HTTP) or modification time (local), None when unknown.
    #: A shard republished with the same size has another.
    version: str | None = None


class RluRun:
    """One game/run of RL Unplugged: its shard files.

    Parameters
    ----------
    url : str
        The game directory holding the ``run_{r}-*`` files (local path or fsspec URL).
    game : str
        Game name (the directory's name, e.g. ``"Pong"``).
    run : str
        Run number as a string (``"1"`` for ``run_1-*``).
    storage_options : dict, optional
        Passed to fsspec.
    timeout : float, None or "default"
        Seconds each file-system call may take, retries included (default 60).
    shards : list of Shard, optional
        The run's shards, when already listed (else the directory is listed).

    Raises
    ------
    SourceNotFoundError
        The directory holds no shard of this run.
    SourceFormatError
        Shards of the run disagree on the number of shards ``N``.

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr.record.rl_unplugged import write_rlu_run
    >>> written = write_rlu_run(tempfile.mkdtemp(), "Asterix", num_shards=3, present=(0, 2))
    >>> run = RluRun(written.game_dir, written.game, "1")
    >>> run.suffixes, run.num_shards, run.missing
    ([0, 2], 3, [1])
    """

    kind = "rl-unplugged"

    def __init__(
        self,
        url: str,
        game: str,
        run: str,
        storage_options: dict[str, Any] | None = None,
        shards: list[Shard] | None = None,
        *,
        timeout: Timeout = "default",
    ) -> None:
        self.url = str(url).rstrip("/")
        self.game = validate_name(game, "game")
        self.run = validate_name(run, "run")
        self.storage_options = dict(storage_options or {})
        self.fs, self._path = get_fs(self.url, self.storage_options, timeout=timeout)
        #: The deadline of every call to the source's file system.
        self.timeout = self.fs.timeout
        if shards is None:
            shards = _list_shards(self.fs, self._path.rstrip("/"), self.url).get(self.run, [])
        if not shards:
            raise SourceNotFoundError(
                f"{self.url} holds no shard of run {self.run}: expected files named like "
                f"{shard_name(self.run, 0, 50)}. Check the run number and the path."
            )
        shards = sorted(shards, key=lambda s: (s.index, s.total))
        _check_totals(shards, self.url)
        _check_one_file_per_shard(shards, self.url, self.run)
        self.shards = {s.index: s for s in shards}
        self.num_shards = shards[0].total
        #: Shard indices present, in order (the checkpoints a selection chooses from).
        self.suffixes = sorted(self.shards)
        #: Shard indices below ``num_shards`` that are not there.
        self.missing = [i for i in range(self.num_shards) if i not in self.shards]

    def where(self, index: int) -> str:
        """URL of shard ``index``, for messages (listed or not)."""
        shard = self.shards.get(index)
        name = shard.name if shard else shard_name(self.run, index, self.num_shards)
        return join(self.url, name)

    def names(self) -> list[tuple[str, int | None, str | None]]:
        """``(file name, size, version)`` of every shard, in index order (the scan's
        fingerprint)."""
        return [(s.name, s.size, s.version) for s in self.shards.values()]

    @contextmanager
    def open(self, index: int, *, prefix: bool = False) -> Iterator[BinaryIO]:
        """Shard ``index`` as its decompressed stream (:func:`~.tfrecord.open_shard`).

        ``prefix=True``: only the start of the shard will be read, so it is fetched
        in smaller ranges (:data:`~.tfrecord.PREFIX_BLOCK`), and little is fetched
        beyond what is read.
        """
        shard = self.shards.get(index)
        if shard is None:
            raise SourceNotFoundError(
                f"{self.where(index)} is not in the run; shards present: {self.suffixes}."
            )
        self.check_unchanged(index)
        with open_shard(self.fs, shard.path, PREFIX_BLOCK if prefix else READ_BLOCK) as stream:
            yield stream
        # what was read is the object listed: not another publication's bytes
        self.check_unchanged(index)

    def check_unchanged(self, index: int) -> None:
        """Raise :class:`~atari_zarr.errors.SourceChangedError` when shard ``index`` is
        no longer the object listed (its size or version differs), and
        :class:`~atari_zarr.errors.SourceNotFoundError` when it is gone: one conversion
        never mixes the objects of two publications.

        Examples
        --------
        >>> import os, tempfile
        >>> from atari_zarr.record.rl_unplugged import write_rlu_run
        >>> written = write_rlu_run(tempfile.mkdtemp(), "Asterix", num_shards=1, present=(0,))
        >>> run = RluRun(written.game_dir, written.game, "1")
        >>> run.check_unchanged(0)
        >>> with open(run.shards[0].path, "ab") as f:
        ...     _ = f.write(b"more")
        >>> run.check_unchanged(0)
        Traceback (most recent call last):
            ...
        atari_zarr.errors.SourceChangedError: ...: changed since the run was listed (size ...
        """
        shard = self.shards[index]
        if shard.size is None and shard.version is None:
            return  # nothing listed to compare with
        self.fs.invalidate_cache(shard.path)  # the object as it is, not as listed
        try:
            now = self.fs.info(shard.path)
        except FileNotFoundError:
            raise SourceNotFoundError(
                f"{self.where(index)}: the shard does not exist (anymore); expected the object "
                f"listed at the start of the conversion. The source was changed meanwhile: run "
                f"the same command again (it lists the run again)."
            ) from None
        size, version = now.get("size"), _version(now)
        changed = []
        if shard.size is not None and size is not None and int(size) != shard.size:
            changed.append(f"size {shard.size:,} bytes, now {int(size):,}")
        if shard.version is not None and version is not None and version != shard.version:
            changed.append(f"{shard.version}, now {version}")
        if changed:
            raise SourceChangedError(
                f"{self.where(index)}: changed since the run was listed ({'; '.join(changed)}); "
                f"expected the object listed, so that one conversion never mixes two "
                f"publications. The source was republished meanwhile: run the same command "
                f"again (it lists the run again and starts over)."
            )


def _check_one_file_per_shard(shards: list[Shard], where: str, run: str) -> None:
    """Refuse two files for one shard (``run_04-…`` and ``run_4-…``): whichever was
    listed last would be read."""
    for a, b in itertools.pairwise(shards):
        if a.index == b.index:
            raise SourceFormatError(
                f"{where}: holds both {a.name} and {b.name} for shard {a.index} of run {run}; "
                f"expected one file per shard. The directory mixes two spellings of the run "
                f"number: keep one file and remove the other."
            )


def _check_totals(shards: list[Shard], where: str) -> None:
    first = shards[0]
    for shard in shards[1:]:
        if shard.total != first.total:
            raise SourceFormatError(
                f"{where}: shards {first.name} and {shard.name} of one run disagree on the "
                f"number of shards ({first.total} and {shard.total}); expected one N for every "
                f"run_{{r}}-xxxxx-of-N file. The directory mixes copies of different releases: "
                f"keep the files of one."
            )
        if shard.index >= shard.total:
            raise SourceFormatError(
                f"{join(where, shard.name)}: shard index {shard.index} is not below the number "
                f"of shards {shard.total}; expected run_{{r}}-{{i}}-of-{{N}} with i < N. Rename "
                f"or remove the file."
            )


def _list_shards(fs: Any, path: str, url: str) -> dict[str, list[Shard]]:
    """Shards in one directory, by run (runs as strings, ``"1"`` for ``run_1-*``), as they
    are now (not as a listing cached earlier in the process: a shard replaced since
    would be read to its old size)."""
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return {}
    runs: dict[str, list[Shard]] = {}
    for entry in entries:
        if entry.get("type") == "directory":
            continue
        full = str(entry["name"]).rstrip("/")
        name = full.rsplit("/", 1)[-1]
        match = _SHARD_RE.match(name)
        if not match:
            continue
        if entry.get("size") is None or _version(entry) is None:
            # a web server's listing has neither: ask the object (Content-Length, ETag),
            # so that a resume can tell whether the source changed
            entry = {**entry, **_details(fs, f"{path}/{name}")}
        size = entry.get("size")
        shard = Shard(
            int(match["index"]),
            int(match["total"]),
            name,
            f"{path}/{name}",
            int(size) if size is not None else None,
            _version(entry),
        )
        runs.setdefault(str(int(match["run"])), []).append(shard)
    return runs


#: Listing fields that change when an object is written again, best first. A
#: Last-Modified header is none of them: it has whole seconds, and an object replaced
#: within the same second by one of the same size looks unchanged. A shard that tells
#: only that has no version, and its scans are never resumed (``_scan_digest``).
_VERSION_FIELDS = (
    "generation",
    "crc32c",
    "md5Hash",
    "ETag",
    "etag",
    "mtime",
)


def _details(fs: Any, path: str) -> dict[str, Any]:
    """What the object at ``path`` says of itself (a HEAD request); nothing if it is gone."""
    try:
        return dict(fs.info(path))
    except FileNotFoundError:
        return {}


def _version(entry: dict[str, Any]) -> str | None:
    """The version of a listed object: the first of :data:`_VERSION_FIELDS` it has."""
    for name in _VERSION_FIELDS:
        value = entry.get(name)
        if value not in (None, ""):
            return f"{name}:{value}"
    return None


def holds_shards(fs: Any, path: str) -> bool:
    """Whether the directory ``path`` holds shard files directly (a game directory)."""
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:
        return False
    return any(is_shard_name(str(n).rstrip("/").rsplit("/", 1)[-1]) for n in names)


def _sort_runs(runs: list[str]) -> list[str]:
    return sorted(runs, key=lambda r: (len(r), r))


def find_runs(
    source: str,
    games: list[str] | None = None,
    runs: list[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: Timeout = "default",
) -> list[RluRun]:
    """Find the game/runs under ``source``.

    ``source`` is the dataset root (``.../atari_episodes_ordered``, holding
    ``{Game}/run_*``) or one game directory (holding ``run_*`` files; the game is its
    last path component).

    Parameters
    ----------
    source : str
        Local path or fsspec URL.
    games, runs : list of str, optional
        Restrict to these games and runs (``"1"`` for ``run_1-*``); every one named
        must exist.
    storage_options : dict, optional
        Passed to fsspec.
    timeout : float, None or "default"
        Seconds each file-system call may take, retries included (default 60).

    Raises
    ------
    SourceNotFoundError
        ``source``, or a game or run named, does not exist; or nothing is found.
    SourceFormatError
        Shards of one run disagree on ``N``.

    Examples
    --------
    >>> import tempfile
    >>> from atari_zarr.record.rl_unplugged import write_rlu_run
    >>> written = write_rlu_run(tempfile.mkdtemp(), "Asterix", num_shards=3, present=(0, 2))
    >>> [(r.game, r.run, r.suffixes) for r in find_runs(written.root)]
    [('Asterix', '1', [0, 2])]
    """
    runs = [str(int(r)) if str(r).isdigit() else str(r) for r in runs or []] or None
    fs, root, source = open_root(
        source,
        games,
        runs,
        storage_options,
        "the RL Unplugged root (holding {Game}/run_{r}-xxxxx-of-yyyyy files) or a game directory",
        timeout,
    )
    direct = _list_shards(fs, root, source)
    if direct:
        game = source.split("://", 1)[-1].rsplit("/", 1)[-1]
        if games and game not in games:
            raise SourceNotFoundError(
                f"{source} is the game {game}, which --games {games} excludes. Drop the filter "
                f"or point SOURCE at the dataset root."
            )
        return _runs_of(source, game, direct, runs, storage_options, timeout)

    out: list[RluRun] = []
    for game in select_games(fs, root, source, games):
        listed = _list_shards(fs, f"{root}/{game}", join(source, game))
        if not listed and not games:
            continue  # another folder beside the games
        out.extend(_runs_of(join(source, game), game, listed, runs, storage_options, timeout))
    if not out:
        raise SourceNotFoundError(
            f"no runs found in {source}: expected {{Game}}/run_{{r}}-xxxxx-of-yyyyy files. Point "
            f"SOURCE at the dataset root or at one game directory."
        )
    return out


def _runs_of(
    url: str,
    game: str,
    listed: dict[str, list[Shard]],
    runs: list[str] | None,
    storage_options: dict[str, Any] | None,
    timeout: Timeout,
) -> list[RluRun]:
    found = _sort_runs(list(listed))
    if runs:
        absent = [r for r in runs if r not in listed]
        if absent:
            raise SourceNotFoundError(
                f"runs {absent} of {game} not found in {url}; found runs {found or 'none'} "
                f"(files run_{{r}}-xxxxx-of-yyyyy). Check the run numbers."
            )
        chosen = list(runs)
    else:
        chosen = found
    return [RluRun(url, game, r, storage_options, listed[r], timeout=timeout) for r in chosen]
