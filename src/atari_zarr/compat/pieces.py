"""The episodes a drop-in reads from a store: the part of a run its loader asked for.

A loader asks for a part of a run (some checkpoints, a subset rule). The store
:func:`atari_zarr.pull.open_request` finds either holds exactly that part (a store
converted with the same rule, e.g. pulled) or the whole run (a mirror, a store the
user converted), of which :func:`asked_pieces` takes the part, lazily, with the rule of
:mod:`atari_zarr.subsets`. Either way the drop-in reads the same episodes.
"""

from __future__ import annotations

from collections.abc import Iterable

from atari_zarr.episodes import EpisodeTable, SourcePart, episode_table, source_parts
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.subsets import CHECKPOINT_ROWS, Pieces, Subset, episode_pieces, select_pieces

__all__ = ["asked_pieces", "store_episodes"]


def store_episodes(ds: AtariZarrDataset) -> EpisodeTable:
    """The per-episode table of ``ds``: its attribute, else (an unfinished recording)
    built from the per-step values.

    Examples
    --------
    >>> table = store_episodes(AtariZarrDataset(store_url))
    >>> int(table.length.sum()) == len(AtariZarrDataset(store_url))
    True
    """
    table = episode_table(ds.metadata, len(ds))
    if table is None:
        steps = ds.read_steps(range(len(ds)), ["episode", "terminated", "reward"])
        table = EpisodeTable.from_steps(steps["episode"], steps["terminated"], steps["reward"])
    return table


def asked_pieces(
    reader: AtariZarrDataset,
    subset: Subset | None = None,
    *,
    checkpoints: Iterable[int] | None = None,
    need_parts: bool = False,
) -> Pieces:
    """The pieces of episodes of ``reader`` that ``subset`` and ``checkpoints`` choose.

    A store that records ``subset`` itself already holds exactly its pieces: all of
    them are taken. Otherwise the store must hold the run (no subset of its own), and
    the rule chooses from it.

    Raises
    ------
    InvalidArgumentError
        The store holds another subset than the one asked; or ``need_parts`` and the
        store records no checkpoints (a recording).

    Examples
    --------
    >>> reader = AtariZarrDataset(store_url)  # the converted Pong/1 fixture run: 6 checkpoints
    >>> asked_pieces(reader).rows == len(reader)  # every row, cut at checkpoints
    True
    >>> # 32 rows of each checkpoint; the last, partial one has fewer
    >>> asked_pieces(reader, Subset.fraction_of(0.5, checkpoint_rows=64)).rows
    186
    """
    parts = source_parts(reader.metadata)
    if not parts:
        if need_parts:
            raise InvalidArgumentError(
                f"{reader.where} records no checkpoints (a recording?): the rule draws among a "
                f"run's checkpoints; convert a DQN Replay or RL Unplugged run"
            )
        parts = [SourcePart(0, 0, len(reader))]
    if checkpoints is not None:
        wanted = {int(c) for c in checkpoints}
        parts = [p for p in parts if p.checkpoint in wanted]
    selection = reader.metadata.get("selection") or {}
    recorded = Subset.from_attributes(
        selection.get("subset") if isinstance(selection, dict) else None
    )
    episodes = store_episodes(reader)
    if subset is None or recorded == subset:
        return episode_pieces(parts, episodes)
    if recorded is not None:
        raise InvalidArgumentError(
            f"{reader.where} holds a subset ({recorded.describe()}), not the run; expected the "
            f"whole run or the subset asked ({subset.describe()}). Pass the whole run's store, "
            f"or leave the store to the loader (it finds or fetches the subset asked)."
        )
    capacity = int((reader.metadata.get("conversion") or {}).get("capacity") or CHECKPOINT_ROWS)
    return select_pieces(subset, parts, episodes, checkpoint_rows=capacity, where=reader.where)
