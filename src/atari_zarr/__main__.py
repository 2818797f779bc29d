"""``python -m atari_zarr`` is ``atari-zarr``."""

import sys

from atari_zarr.cli import main

sys.exit(main())
