"""TorchRL drop-in (public path): see :mod:`atari_zarr.compat.torchrl`.

Needs the ``torchrl`` extra; ``import atari_zarr`` never imports this module.
"""

from atari_zarr.compat.torchrl import AtariZarrExperienceReplay, AtariZarrStorage

__all__ = ["AtariZarrExperienceReplay", "AtariZarrStorage"]
