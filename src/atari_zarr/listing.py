"""What the command line prints of pulls: the table of ``ls --available``, and the line
that loads a pulled store with the loader its request names.

Examples
--------
>>> from atari_zarr.pull import Request, Resolved
>>> found = Resolved("/c/Pong/5.zarr", "/c")
>>> loading_line(Request.parse("Pong/5"), found).split("; ")[1]
'AtariZarrExperienceReplay("Pong/5", batch_size=32)'
"""

from __future__ import annotations

import re
from typing import Any

from atari_zarr.pull import GAMES, Request, Resolved
from atari_zarr.subsets import PLAYED

__all__ = ["cache_root", "format_available", "loading_line", "takes_part"]


def _snake(game: str) -> str:
    """d3rlpy's spelling of a game: ``"SpaceInvaders"`` is ``"space_invaders"``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


def loading_line(request: Request, found: Resolved, *, home_given: bool = False) -> str:
    """The Python line that loads what ``found`` holds, with the loader its request names.

    Examples
    --------
    >>> found = Resolved("/c/Pong/5.zarr", "/c")
    >>> loading_line(Request.parse("Pong/5"), found).split("; ")[1]
    'AtariZarrExperienceReplay("Pong/5", batch_size=32)'
    >>> loading_line(Request.parse("space_invaders", run=2, fraction=0.01), found).split("; ")[1]
    'get_atari_transitions("space_invaders", fraction=0.01, index=1)'
    """
    subset = request.subset
    if not found.exact:
        return _part_line(request, found)
    root = f", root={cache_root(found)!r}" if home_given else ""
    if request.whole:
        return (
            "from atari_zarr.torchrl import AtariZarrExperienceReplay; "
            f'AtariZarrExperienceReplay("{request.dataset_id}", batch_size=32{root})'
        )
    if request.checkpoints is None and subset is not None and subset.rule == "fraction":
        order = "" if subset.order == PLAYED else f', order="{subset.order}"'
        seed = f", seed={subset.seed}" if subset.seed else ""
        return (
            "from atari_zarr.compat.d3rlpy import get_atari_transitions; "
            f'get_atari_transitions("{_snake(request.game)}", fraction={subset.fraction:g}, '
            f"index={int(request.run) - 1}{order}{seed}{root})"
        )
    if request.checkpoints is None and subset is not None and request.run == "1":
        seed = f", seed={subset.seed}" if subset.seed != 123 else ""
        home = f", home={cache_root(found)!r}" if home_given else ""
        return (
            "from atari_zarr.compat.decision_transformer import create_dataset; "
            f'create_dataset({subset.num_buffers}, {subset.num_steps}, "{request.game}", '
            f"None, {subset.trajectories_per_buffer}{seed}{home})"
        )
    return f"from atari_zarr import AtariZarrDataset; AtariZarrDataset({found.url!r})"


def takes_part(request: Request) -> bool:
    """A reader's call takes ``request`` from its whole run's store (:func:`loading_line`):
    some checkpoints, or one subset rule; not both at once.

    Examples
    --------
    >>> takes_part(Request.parse("Pong/1", checkpoints="3")), takes_part(
    ...     Request.parse("Pong/1", checkpoints="3", fraction=0.5))
    (True, False)
    """
    return request.checkpoints is None or request.subset is None


def _part_line(request: Request, found: Resolved) -> str:
    """The Python line that takes exactly the part ``request`` asks for from the whole
    run ``found`` (a store of the whole run standing for the part): the drop-in of its
    rule given that store, or the rows of its checkpoints (an RL Unplugged shard holds
    whole episodes, so they are the transitions of the checkpoints' own store)."""
    from atari_zarr.episodes import source_parts
    from atari_zarr.opening import open_store

    subset, store = request.subset, f"store={found.url!r}"
    if not takes_part(request):
        raise ValueError(f"no reader's call takes {request.describe()} from a whole run")
    if subset is not None and subset.rule == "fraction":
        order = "" if subset.order == PLAYED else f', order="{subset.order}"'
        seed = f", seed={subset.seed}" if subset.seed else ""
        return (
            "from atari_zarr.compat.d3rlpy import get_atari_transitions; "
            f'get_atari_transitions("{_snake(request.game)}", fraction={subset.fraction!r}, '
            f"index={int(request.run) - 1}{order}{seed}, {store})"
        )
    if subset is not None:
        return (
            "from atari_zarr.compat.decision_transformer import create_dataset; "
            f'create_dataset({subset.num_buffers}, {subset.num_steps}, "{request.game}", '
            f"None, {subset.trajectories_per_buffer}, seed={subset.seed}, {store})"
        )
    meta = open_store(found.url, found.storage_options).metadata
    wanted = set(request.checkpoints or ())
    spans: list[list[int]] = []
    for p in source_parts(meta):
        if p.checkpoint not in wanted:
            continue
        if spans and spans[-1][1] == p.first_row:  # checkpoints that follow: one span
            spans[-1][1] += p.rows
        else:
            spans.append([p.first_row, p.first_row + p.rows])
    # a range holds no row, and numpy's 8 bytes a row: a list of Python ints would take
    # 36 a row, 1.8 GB for 49 of a 50M run's checkpoints
    if len(spans) == 1:
        imports, rows = "import torch", f"range({spans[0][0]}, {spans[0][1]})"
    else:
        imports = "import numpy, torch"
        rows = "numpy.r_[" + ", ".join(f"{a}:{b}" for a, b in spans) + "]"
    return (
        f"{imports}; from atari_zarr import AtariZarrDataset; "
        f"torch.utils.data.Subset(AtariZarrDataset({found.url!r}), {rows})"
    )


def cache_root(found: Resolved) -> str:
    """The cache a store found in it belongs to (its root, less ``subsets/{label}``)."""
    parts = found.root.rstrip("/").rsplit("/", 2)
    return parts[0] if len(parts) == 3 and parts[1] == "subsets" else found.root


def format_available(rows: list[dict[str, Any]]) -> str:
    """:func:`available`'s rows as a table, one line a run."""
    lines = [f"{'dataset':<18} {'shards':>6} {'size':>10}  cached"]
    for row in rows:
        if row["source_bytes"] is not None:
            size = f"{row['source_bytes'] / 2**30:,.2f} GiB"
        elif row["gib"] is not None:
            size = f"{row['gib']:,.2f} GiB"
        else:
            size = "?"
        lines.append(
            f"{row['id']:<18} {row['shards']:>6} {size:>10}  {'yes' if row['cached'] else ''}"
        )
    known = sum(1 for r in rows if r["gib"] is not None or r["source_bytes"] is not None)
    lines.append(
        f"{len(rows)} runs of {len(GAMES)} games; sizes known for {known} of them "
        f"(--source-sizes lists the source's files for all)"
    )
    return "\n".join(lines)
