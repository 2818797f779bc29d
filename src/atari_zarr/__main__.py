"""``python -m atari_zarr`` is ``atari-zarr``."""

import sys

from .cli import main

sys.exit(main())
