"""The installed version of atari_zarr, which stores record as ``atari_zarr_version``."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("atari-zarr")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = ["__version__"]
