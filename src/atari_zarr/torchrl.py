"""TorchRL drop-in (public path): see :mod:`atari_zarr.read.torchrl`.

Needs the ``torchrl`` extra; ``import atari_zarr`` never imports this module.
"""

from atari_zarr.read.torchrl import AtariZarrExperienceReplay, AtariZarrStorage

__all__ = ["AtariZarrExperienceReplay", "AtariZarrStorage"]
