"""Grain data source (public path): see :mod:`atari_zarr.compat.grain`.

Needs no extra (Grain itself is the ``grain`` extra); ``import atari_zarr`` never
imports this module.
"""

from atari_zarr.compat.grain import AtariZarrSource

__all__ = ["AtariZarrSource"]
