"""Exceptions raised by atari_zarr.

Every exception derives from :class:`AtariZarrError` *and* from the built-in
exception a caller would naturally catch (``FileNotFoundError``, ``ValueError``
...), so ``except FileNotFoundError`` keeps working for code that does not
know this package.

Messages follow one pattern: what failed and where (the file or URL), what
was expected versus what was found, and what to do next.
"""

from __future__ import annotations

__all__ = [
    "AtariZarrError",
    "InvalidArgumentError",
    "InvalidNameError",
    "ReadOnlyDatasetError",
    "RemoteAccessError",
    "RemoteTimeoutError",
    "SourceFormatError",
    "SourceNotFoundError",
    "StoreCorruptError",
    "StoreExistsError",
    "StoreFormatError",
    "StoreIncompleteError",
    "StoreLockedError",
]


class AtariZarrError(Exception):
    """Base class of every error raised on purpose by atari_zarr."""


class SourceNotFoundError(AtariZarrError, FileNotFoundError):
    """A DQN Replay source directory, checkpoint or file does not exist."""


class SourceFormatError(AtariZarrError, ValueError):
    """A DQN Replay source file exists but is not what dopamine writes."""


class InvalidNameError(AtariZarrError, ValueError):
    """A game or run name that cannot be used as a path component."""


class InvalidArgumentError(AtariZarrError, ValueError):
    """An option value that cannot be parsed (checkpoint selection, storage option)."""


class StoreExistsError(AtariZarrError, FileExistsError):
    """The destination already holds a complete store."""


class StoreFormatError(AtariZarrError, ValueError):
    """A path or URL that is not an atari_zarr store of a supported version."""


class StoreIncompleteError(AtariZarrError, RuntimeError):
    """A store whose writer has not finished (it lacks the completion marker)."""


class RemoteAccessError(AtariZarrError, OSError):
    """A request to a remote store or source failed after the retries of its file system."""


class RemoteTimeoutError(RemoteAccessError, TimeoutError):
    """A request to a remote store or source did not finish within the time allowed."""


class ReadOnlyDatasetError(AtariZarrError, RuntimeError):
    """An attempt to write to, empty or delete a dataset opened for reading."""


class StoreLockedError(AtariZarrError, RuntimeError):
    """Another conversion is writing the same store right now."""


class StoreCorruptError(AtariZarrError, ValueError):
    """Bytes of a store that fail their checksum or do not decode."""
