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

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("atari-zarr")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

from .convert import ConvertedStore, convert
from .errors import (
    AtariZarrError,
    InvalidArgumentError,
    InvalidNameError,
    SourceFormatError,
    SourceNotFoundError,
    StoreExistsError,
    StoreFormatError,
    StoreIncompleteError,
)


def __getattr__(name: str):  # PEP 562
    # The reader needs torch (~300 MB once imported); conversion workers do not.
    if name == "AtariZarrDataset":
        from .reader import AtariZarrDataset

        return AtariZarrDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AtariZarrDataset",
    "AtariZarrError",
    "ConvertedStore",
    "InvalidArgumentError",
    "InvalidNameError",
    "SourceFormatError",
    "SourceNotFoundError",
    "StoreExistsError",
    "StoreFormatError",
    "StoreIncompleteError",
    "__version__",
    "convert",
]
