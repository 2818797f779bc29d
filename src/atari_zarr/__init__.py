"""atari_zarr: the Atari DQN Replay Dataset as cloud-friendly Zarr v3 stores.

Convert dopamine's circular-buffer checkpoints into one compressed store per
game/run, then read exact TorchRL TED transitions back, locally or from any
fsspec URL.

Examples
--------
>>> import tempfile
>>> import numpy as np
>>> import atari_zarr
>>> from atari_zarr.sources.dqn_replay.emulator import DopamineLoggedBuffer
>>> root, dest = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> buffer = DopamineLoggedBuffer(f"{root}/Pong/1/replay_logs", 64, np.random.default_rng(0))
>>> for k in range(300):  # episodes of 30 steps, logged as dopamine and batch_rl did
...     frame = np.full((84, 84), k % 200 + 1, np.uint8)
...     buffer.add(frame, 1, 0.0, k % 30 == 29, episode=k // 30, step=k % 30)
>>> buffer.log_final()
>>> [store] = atari_zarr.convert(root, dest, progress=False)
>>> len(atari_zarr.AtariZarrDataset(store.url)) == store.transitions
True
"""

from typing import TYPE_CHECKING

from atari_zarr._version import __version__

# every error, listed once (errors.__all__): never lazy, so `except atari_zarr.AtariZarrError`
# and the classes below it need nothing else
from atari_zarr.errors import *  # noqa: F403
from atari_zarr.errors import __all__ as _ERRORS

# Names imported on first use: the reader pulls in torch and tensordict (about 2 s),
# which `atari-zarr ls/info/--help` and conversion workers do not need, the converter
# every source kind, which a reader does not need, and the collector gymnasium (the
# `collect` extra). Type checkers see them here.
if TYPE_CHECKING:
    from atari_zarr.conversion.converter import ConvertedStore, convert
    from atari_zarr.read.batch import collate_batch
    from atari_zarr.read.dataset import AtariZarrDataset
    from atari_zarr.read.mixing import MultiGameDataset
    from atari_zarr.read.options import ReadOptions
    from atari_zarr.record.collector import ZarrCollector, collect
    from atari_zarr.verify import verify_store

_LAZY = {
    "AtariZarrDataset": "atari_zarr.read.dataset",
    "ConvertedStore": "atari_zarr.conversion.converter",
    "MultiGameDataset": "atari_zarr.read.mixing",
    "ReadOptions": "atari_zarr.read.options",
    "ZarrCollector": "atari_zarr.record.collector",
    "collate_batch": "atari_zarr.read.batch",
    "collect": "atari_zarr.record.collector",
    "convert": "atari_zarr.conversion.converter",
    "verify_store": "atari_zarr.verify",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'atari_zarr' has no attribute {name!r}")


__all__ = [
    "AtariZarrDataset",
    "ConvertedStore",
    "MultiGameDataset",
    "ReadOptions",
    "ZarrCollector",
    "__version__",
    "collate_batch",
    "collect",
    "convert",
    "verify_store",
    *_ERRORS,
]
