"""Command lines that repeat an operation, as recorded in a store's ``command`` attribute.

A store records the command that made it, so that an unfinished one names the
command that finishes it, and a damaged one the command that writes it again
(:func:`store_remedy`). This is the one place that spells such a command.

Examples
--------
>>> command_line("convert", "/data/dqn", "gs://b/x", games=["Pong"], max_transitions=1000,
...              return_to_go=True, checkpoints=None)
'atari-zarr convert /data/dqn gs://b/x --games Pong --max-transitions 1000 --return-to-go'
>>> command_line("collect", "my store.zarr", env="ALE/Pong-v5", overwrite=True)
"atari-zarr collect 'my store.zarr' --env ALE/Pong-v5 --overwrite"
"""

from __future__ import annotations

import os
import shlex
from typing import Any

__all__ = ["PROGRAM", "command_line", "store_remedy"]

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


def store_remedy(meta: dict[str, Any], url: str | None = None) -> str | None:
    """What to do about a damaged chunk of the store at ``url``: run its command again,
    from scratch, where that command wrote it; a copy elsewhere is copied again (its
    command would rewrite the original, not the copy).

    Examples
    --------
    >>> meta = {"command": "atari-zarr convert /src /stores"}
    >>> store_remedy(meta, "/stores/Pong/1.zarr")
    'write it again (atari-zarr convert /src /stores --overwrite), or copy the object again...'
    >>> store_remedy(meta, "/elsewhere/Pong/1.zarr")
    'copy the store again from where it was written (by `atari-zarr convert /src /stores`)...'
    >>> store_remedy({"command": "atari-zarr pull Pong/1 --checkpoints 3 --home /c"},
    ...              "/c/subsets/checkpoints-3/Pong/1.zarr")
    'pull it again (atari-zarr pull Pong/1 --checkpoints 3 --home /c --force), or copy the...'
    """
    command = meta.get("command")
    if not isinstance(command, str) or not command:
        return None
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    pulled = tokens[1:2] == ["pull"]
    if url is not None and "/" in url.rstrip("/"):
        root = url.rstrip("/").rsplit("/", 2)[0]
        if pulled and root.rsplit("/", 2)[1:2] == ["subsets"]:
            root = root.rsplit("/", 2)[0]  # a part's store: {home}/subsets/{label}/...
        if not any(_same_place(t, root) for t in tokens):
            return (
                f"copy the store again from where it was written (by `{command}`), or write "
                f"it again into {root} by that command with this root as its destination."
            )
    if pulled:  # a pull writes over a store in its cache with --force
        if "--force" not in tokens:
            command += " --force"
        return f"pull it again ({command}), or copy the object again if it was transferred."
    if "--overwrite" not in tokens:
        command += " --overwrite"
    return f"write it again ({command}), or copy the object again if it was transferred."


def _same_place(a: str, b: str) -> bool:
    """Two spellings of one directory or URL."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)
