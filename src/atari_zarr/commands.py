"""Command lines that repeat an operation, as recorded in a store's ``command`` attribute.

A store records the command that made it, so that an unfinished one names the
command that finishes it. This is the one place that spells such a command.

Examples
--------
>>> command_line("convert", "/data/dqn", "gs://b/x", games=["Pong"], max_transitions=1000,
...              return_to_go=True, checkpoints=None)
'atari-zarr convert /data/dqn gs://b/x --games Pong --max-transitions 1000 --return-to-go'
>>> command_line("collect", "my store.zarr", env="ALE/Pong-v5", overwrite=True)
"atari-zarr collect 'my store.zarr' --env ALE/Pong-v5 --overwrite"
"""

from __future__ import annotations

import shlex
from typing import Any

__all__ = ["PROGRAM", "command_line"]

#: The name of the command-line program.
PROGRAM = "atari-zarr"


def command_line(verb: str, *arguments: Any, **options: Any) -> str:
    """``atari-zarr VERB ARGUMENTS --options``, quoted for a POSIX shell.

    Options become ``--name-with-dashes``: ``True`` gives the bare flag, ``None`` and
    ``False`` leave the option out, a list or tuple gives its items after the flag,
    anything else its ``str``.
    """
    parts = [PROGRAM, verb, *(str(a) for a in arguments)]
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, list | tuple):
            parts += [flag, *(str(v) for v in value)]
        else:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)
