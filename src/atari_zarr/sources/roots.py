"""A source root, whatever the kind: opening it, and choosing its game folders.

Both kinds (:mod:`atari_zarr.sources.dqn_replay.files`,
:mod:`atari_zarr.sources.rl_unplugged.files`) find their runs under a root that holds
one folder per game; what lies inside a game folder is theirs.
"""

from __future__ import annotations

from typing import Any

from atari_zarr.errors import SourceNotFoundError
from atari_zarr.layout import validate_name
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import FileSystem, get_fs

__all__ = [
    "DETECT_GAMES",
    "entries",
    "game_dirs_to_detect",
    "list_dirs",
    "open_root",
    "select_games",
]

#: Game directories a detector looks into when no game is named: a dataset root holds
#: one layout throughout, and a remote listing per game costs a request.
DETECT_GAMES = 3


def open_root(
    source: str,
    games: list[str] | None,
    runs: list[str] | None,
    storage_options: dict[str, Any] | None,
    expected: str,
    timeout: Timeout = "default",
) -> tuple[FileSystem, str, str]:
    """Check the names asked for and that ``source`` exists: ``(fs, root path, source)``.

    ``expected`` says what ``source`` should be, for the error when it does not exist.

    Raises
    ------
    InvalidNameError
        A game or run name could escape the destination (``../x``).
    SourceNotFoundError
        ``source`` does not exist.
    """
    for name in games or []:
        validate_name(name, "game")
    for name in runs or []:
        validate_name(name, "run")
    fs, root = get_fs(source, storage_options, timeout=timeout)
    root = root.rstrip("/")
    source = str(source).rstrip("/")
    if not fs.exists(root):
        raise SourceNotFoundError(
            f"{source} does not exist: expected {expected}. Check the path or URL and the "
            f"storage options."
        )
    return fs, root, source


def list_dirs(fs: Any, path: str) -> list[str]:
    """Names of the folders directly under ``path``, sorted."""
    out = []
    for entry in fs.ls(path, detail=True):
        if entry.get("type") == "directory":
            out.append(str(entry["name"]).rstrip("/").rsplit("/", 1)[-1])
    return sorted(out)


def select_games(fs: Any, root: str, source: str, games: list[str] | None) -> list[str]:
    """The game folders of a root: those named (each must exist), else every one.

    Raises
    ------
    SourceNotFoundError
        A game named is not there.
    """
    found = list_dirs(fs, root)
    selected = list(games) if games else found
    missing = [g for g in selected if g not in found]
    if missing:
        raise SourceNotFoundError(
            f"games {missing} not found in {source}; found {found or 'no game folders'}. "
            f"Check the names (they are case-sensitive, e.g. 'Pong')."
        )
    return selected


def entries(fs: Any, path: str) -> list[tuple[str, bool]]:
    """``(name, is a folder)`` of everything directly under ``path``, sorted (none if absent)."""
    try:
        listed = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    return sorted(
        (str(e["name"]).rstrip("/").rsplit("/", 1)[-1], e.get("type") == "directory")
        for e in listed
    )


def game_dirs_to_detect(names: list[tuple[str, bool]], games: list[str] | None) -> list[str]:
    """The game folders a detector looks into: those named, else the first few."""
    dirs = [n for n, is_dir in names if is_dir]
    named = [g for g in dirs if g in (games or [])]
    # games that are not there are find_runs' to report, with the games found
    return named or dirs[:DETECT_GAMES]
