"""atari_zarr: the Atari DQN Replay Dataset as cloud-friendly Zarr v3 stores.

Convert dopamine's circular-buffer checkpoints into one compressed store per
game/run, then read exact TorchRL TED transitions back, locally or from any
fsspec URL.

Examples
--------
>>> import tempfile
>>> import atari_zarr
>>> from atari_zarr.testing import write_fixture_run
>>> root, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> _ = write_fixture_run(root, "Pong", "1", capacity=64, steps=300)
>>> [store] = atari_zarr.convert(root, dest, progress=False)
>>> len(atari_zarr.AtariZarrDataset(store.url)) == store.transitions
True
"""

from atari_zarr._version import __version__
from atari_zarr.conversion.converter import ConvertedStore, convert
from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    InvalidNameError,
    MissingDependencyError,
    ReadOnlyDatasetError,
    RemoteAccessError,
    RemoteTimeoutError,
    SourceFormatError,
    SourceNotFoundError,
    StoreCorruptError,
    StoreExistsError,
    StoreFormatError,
    StoreIncompleteError,
    StoreLockedError,
    StoreNotFoundError,
    StoreWriteError,
)

# Names imported on first use: the reader pulls in torch and tensordict (about 2 s),
# which `atari-zarr ls/info/--help` and conversion workers do not need, and the
# collector needs gymnasium (the `collect` extra). Errors are never lazy: every one
# is importable from here, so `except atari_zarr.AtariZarrError` needs nothing else.
_LAZY = {
    "AtariZarrDataset": "atari_zarr.read.dataset",
    "MultiGameDataset": "atari_zarr.read.mixing",
    "ZarrCollector": "atari_zarr.record.collector",
    "collect": "atari_zarr.record.collector",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'atari_zarr' has no attribute {name!r}")


__all__ = [
    "AtariZarrDataset",
    "AtariZarrError",
    "ConvertedStore",
    "InvalidArgumentError",
    "InvalidNameError",
    "MissingDependencyError",
    "MultiGameDataset",
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
    "StoreNotFoundError",
    "StoreWriteError",
    "ZarrCollector",
    "__version__",
    "collect",
    "convert",
]
