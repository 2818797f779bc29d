"""A command line that pauses for good in the middle of a conversion, to be killed there.

:data:`PAUSE_SCRIPT` runs ``atari-zarr ARGS`` with a dask callback that, in the
scheduling thread, blocks for good once ``AFTER`` tasks whose key holds ``FRAGMENT``
(``-lap-`` for DQN Replay checkpoints, ``-shard-`` for RL Unplugged shards) have
finished, their data and markers written, after printing ``paused`` on stdout. A test
writes it to a file (worker processes spawned from it import that file too) and runs
``python FILE FRAGMENT AFTER VERB ARGS...``; :func:`pause_command` spells that.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["PAUSE_SCRIPT", "pause_command"]

PAUSE_SCRIPT = """
import sys
import threading

from dask.callbacks import Callback

from atari_zarr.cli import main

fragment, after = sys.argv[1], int(sys.argv[2])


class Pause(Callback):
    def __init__(self):
        super().__init__()
        self.done = 0

    def _posttask(self, key, result, dsk, state, worker_id):
        if fragment in str(key):
            self.done += 1
            if self.done == after:
                print("paused", flush=True)
                threading.Event().wait()  # until killed


if __name__ == "__main__":  # worker processes spawned from here import this file too
    Pause().register()
    sys.exit(main(sys.argv[3:]))
"""


def pause_command(where: str | Path, fragment: str, after: int, *args: str) -> list[str]:
    """``python SCRIPT FRAGMENT AFTER ARGS...``, the script written into the directory
    ``where``."""
    script = Path(where) / "pause_after_tasks.py"
    script.write_text(PAUSE_SCRIPT)
    return [sys.executable, str(script), fragment, str(after), *args]
