"""The errors of atari_zarr: one contract for every failure raised on purpose.

Every exception derives from :class:`AtariZarrError` *and* from the built-in
exception a caller would naturally catch (``FileNotFoundError``, ``ValueError``,
``ImportError`` ...), so ``except FileNotFoundError`` keeps working for code that
does not know this package, and ``except AtariZarrError`` catches every failure a
user can act on (the command line prints those as one line).

Messages follow one pattern: what failed and where (the file or URL, and the
record where there is one), what was expected versus what was found, and what to
do next.

Examples
--------
>>> try:
...     import_optional("not_a_module_xyz", extra="collect", purpose="recording play")
... except MissingDependencyError as exc:
...     print(exc)
recording play needs not_a_module_xyz; install it with: pip install 'atari-zarr[collect]'
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from atari_zarr.redaction import redact

__all__ = [
    "AtariZarrError",
    "DatasetClosedError",
    "InvalidArgumentError",
    "InvalidNameError",
    "MissingDependencyError",
    "ReadOnlyDatasetError",
    "RemoteAccessError",
    "RemoteTimeoutError",
    "SourceChangedError",
    "SourceFormatError",
    "SourceNotFoundError",
    "StoreChangedError",
    "StoreCorruptError",
    "StoreExistsError",
    "StoreFormatError",
    "StoreIncompleteError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreWriteError",
    "TooManyOpenFilesError",
]
# (import_optional and install_hint, the helpers for optional dependencies, and
# damaged_advice are imported by name: __all__ lists the errors, which the package
# exports at its top)


def damaged_advice(where: str) -> str:
    """What to do about a damaged source object at ``where``: a local file can be
    downloaded again; an object in a bucket or on a server gives the same bytes again.

    Examples
    --------
    >>> damaged_advice("/data/rlu/Pong/run_1-00003-of-00050")
    'The shard is damaged or was cut short: download it again.'
    >>> damaged_advice("gs://b/Pong/run_1-00003-of-00050").split(":")[0]
    'The object is damaged where it is stored, so fetching it again gives the same bytes'
    """
    if "://" in where and not where.startswith("file://"):
        return (
            "The object is damaged where it is stored, so fetching it again gives the same "
            "bytes: read the run from another copy (a mirror, mirrors=), or leave this "
            "checkpoint out (--checkpoints), and tell the source's owner."
        )
    return "The shard is damaged or was cut short: download it again."


class AtariZarrError(Exception):
    """Base class of every error raised on purpose by atari_zarr.

    Its message has the credentials of any URL in it removed when the error is made
    (:func:`~atari_zarr.redaction.redact`), whatever module raised it.

    Examples
    --------
    >>> str(StoreNotFoundError("https://me:pw@host/b/x.zarr?X-Amz-Signature=abc is gone"))
    'https://***@host/b/x.zarr?X-Amz-Signature=*** is gone'
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class SourceNotFoundError(AtariZarrError, FileNotFoundError):
    """A source directory, checkpoint, shard or file does not exist."""


class SourceChangedError(AtariZarrError, RuntimeError):
    """A source object was replaced or removed between its listing and its read."""


class SourceFormatError(AtariZarrError, ValueError):
    """A source file exists but is not what its writer (dopamine, TensorFlow) writes."""


class InvalidNameError(AtariZarrError, ValueError):
    """A game or run name that cannot be used as a path component."""


class InvalidArgumentError(AtariZarrError, ValueError):
    """An option value that cannot be used (checkpoint selection, storage option, ...)."""


class StoreNotFoundError(AtariZarrError, FileNotFoundError):
    """Nothing exists where a store (or a root of stores) was expected."""


class StoreWriteError(AtariZarrError, OSError):
    """A store, or the work area of its conversion, cannot be written where it was asked for."""


class StoreExistsError(AtariZarrError, FileExistsError):
    """The destination already holds a complete store."""


class StoreFormatError(AtariZarrError, ValueError):
    """A path or URL that is not an atari_zarr store of a supported version."""


class StoreIncompleteError(AtariZarrError, RuntimeError):
    """A store whose writer has not finished (it lacks the completion marker)."""


class StoreCorruptError(AtariZarrError, ValueError):
    """A store marked complete whose bytes fail their checksum, do not decode, or are gone."""


class StoreChangedError(AtariZarrError, RuntimeError):
    """A store that was replaced, or is being written again, while a reader had it open."""


class StoreLockedError(AtariZarrError, RuntimeError):
    """Another conversion is writing the same store right now."""


class RemoteAccessError(AtariZarrError, OSError):
    """A request to a remote store or source failed after the retries of its file system."""


class RemoteTimeoutError(RemoteAccessError, TimeoutError):
    """A request to a remote store or source did not finish within the time allowed."""


class ReadOnlyDatasetError(AtariZarrError, RuntimeError):
    """An attempt to write to, empty or delete a dataset opened for reading."""


class DatasetClosedError(AtariZarrError, RuntimeError):
    """An iterator of a dataset or stream asked for more after the dataset, the stream or
    the iterator itself was closed."""


class TooManyOpenFilesError(AtariZarrError, OSError):
    """The process has no file descriptor left (``ulimit -n``), although the readers let
    the ones they kept go."""


class MissingDependencyError(AtariZarrError, ImportError):
    """An optional dependency that a feature needs is not installed."""


def install_hint(extra: str) -> str:
    """The command that installs the optional dependencies named ``extra``.

    Examples
    --------
    >>> install_hint("cloud")
    "pip install 'atari-zarr[cloud]'"
    """
    return f"pip install 'atari-zarr[{extra}]'"


def import_optional(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingDependencyError` naming the extra to install.

    Parameters
    ----------
    module : str
        Dotted module name (``"gymnasium"``).
    extra : str
        The ``atari-zarr`` extra that provides it (``"collect"``).
    purpose : str
        What needs it, to start the message (``"recording play"``).
    """
    try:
        return import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{purpose} needs {module.split('.')[0]}; install it with: {install_hint(extra)}"
        ) from exc
