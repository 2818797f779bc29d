"""A planned run cut down to a subset of its episodes, for any source kind.

A source kind plans its whole selection (:mod:`atari_zarr.sources.registry`);
:func:`apply_subset` then keeps the pieces of episodes that the store's
:class:`~atari_zarr.subsets.Subset` chooses (:func:`~atari_zarr.subsets.select_pieces`)
and gives a plan of the same shape: fewer rows, renumbered episodes, each part
(checkpoint or shard) still written by one task. :func:`subset_rows` gives a part's
rows as the kind reads them, filtered and renumbered, so conversion and ``verify
--source`` see the same rows.

A chosen piece ends terminated where its episode ended in a terminal state inside
the piece; a piece cut by a checkpoint boundary or trimmed to the fraction's exact
count ends truncated, and its frame after the last row is unknown (zeros in
``final_observation``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from atari_zarr.episodes import FIRST_STEP, UNKNOWN_STEP, EpisodeLedger, SourcePart
from atari_zarr.layout import (
    EPISODE,
    FINAL_OBSERVATION,
    REWARD,
    TERMINATED,
    TRUNCATED,
    spec,
)
from atari_zarr.subsets import CHECKPOINT_ROWS, Subset, select_pieces

__all__ = ["SubsetPart", "apply_subset", "subset_rows"]

#: ``(part) -> (per-step arrays, stream)``: a part's rows as its kind reads them.
ReadRows = Callable[[Any], tuple[dict[str, np.ndarray], Iterator[tuple[str, np.ndarray, Any]]]]


@dataclass(frozen=True)
class SubsetPart:
    """What a part of a subset plan keeps of the kind's part ``original``.

    ``starts``/``stops`` are rows of ``original`` (from its first, ``0``) of each
    kept piece, ``terminated`` how each ends, ``source_episode`` the episode of the
    full plan each came from.
    """

    original: Any
    starts: np.ndarray
    stops: np.ndarray
    terminated: np.ndarray
    source_episode: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return self.stops - self.starts


def apply_subset(
    plan: Any,
    subset: Subset,
    read_rows: ReadRows,
    *,
    where: str,
) -> Any:
    """``plan`` (a registry ``Plan``) cut down to the pieces ``subset`` chooses.

    Parameters
    ----------
    plan : Plan
        The kind's plan of the whole selection.
    subset : Subset
        The rule.
    read_rows : callable
        ``part -> (per-step arrays, stream)`` of the kind (the rewards of the chosen
        pieces give their returns; the stream is not read).
    where : str
        The run, for messages.
    """
    parts = [SourcePart(p.unit, p.out_start, p.rows) for p in plan.parts]
    table = plan.episodes.table()
    checkpoint_rows = int(plan.conversion.get("capacity") or CHECKPOINT_ROWS)
    chosen = select_pieces(subset, parts, table, checkpoint_rows=checkpoint_rows, where=where)
    ledger = EpisodeLedger()
    new_parts = []
    out = 0
    first_episode = 0
    sizes: dict[int, tuple[int, int]] = {}
    for i, part in enumerate(plan.parts):
        mine = np.flatnonzero(chosen.part == i)
        if not mine.size:
            continue
        rewards = read_rows(part)[0][REWARD]
        starts = chosen.start[mine] - part.out_start
        stops = chosen.stop[mine] - part.out_start
        for a, b, term in zip(
            starts.tolist(), stops.tolist(), chosen.terminated[mine].tolist(), strict=True
        ):
            ledger.length.append(b - a)
            ledger.returns.append(float(np.asarray(rewards[a:b], dtype=np.float64).sum()))
            ledger.terminated.append(bool(term))
        rows = int((stops - starts).sum())
        keep = SubsetPart(part, starts, stops, chosen.terminated[mine], chosen.episode[mine])
        episodes = len(mine) if plan.n_final is not None else 0
        new_parts.append(
            replace(
                part,
                out_start=out,
                rows=rows,
                first_episode=first_episode,
                episodes=episodes,
                spec=keep,
            )
        )
        sizes[part.unit] = (out, rows)
        out += rows
        first_episode += len(mine)
    conversion = _conversion(plan.conversion, sizes)
    conversion["subset"] = {
        **subset.attributes(),
        "checkpoint_rows_used": checkpoint_rows,
        "transitions": out,
        "episodes": len(chosen),
        "planned_transitions": plan.n_rows,
    }
    columns: dict[str, list[Any]] = dict(ledger.as_attributes())
    for name, values in plan.episode_columns.items():
        if name not in columns and isinstance(values, list) and len(values) == len(table):
            columns[name] = [values[int(e)] for e in chosen.episode.tolist()]
    if FIRST_STEP in columns:  # a piece that starts inside its episode starts later in it
        into = (chosen.start - table.starts[chosen.episode]).tolist()
        columns[FIRST_STEP] = [
            UNKNOWN_STEP if first == UNKNOWN_STEP else int(first) + int(k)
            for first, k in zip(columns[FIRST_STEP], into, strict=True)
        ]
    return replace(
        plan,
        parts=new_parts,
        n_rows=out,
        n_final=None if plan.n_final is None else len(chosen),
        episodes=ledger,
        conversion=conversion,
        episode_columns=columns,
    )


def _conversion(conversion: Mapping[str, Any], sizes: Mapping[int, tuple[int, int]]) -> dict:
    """The ``conversion`` attribute with each part's rows as the subset store has them."""
    out = dict(conversion)
    for key, label in (("checkpoints", "suffix"), ("shards", "shard")):
        entries = out.get(key)
        if not isinstance(entries, list):
            continue
        fixed: list[dict[str, Any]] = []
        for entry in entries:
            entry = dict(entry)
            first, rows = sizes.get(int(entry.get(label, -1)), (_next_row(fixed), 0))
            entry["planned_transitions"] = entry.get("transitions")
            entry["first_transition"], entry["transitions"] = first, rows
            fixed.append(entry)
        out[key] = fixed
    return out


def _next_row(entries: list[dict[str, Any]]) -> int:
    """The row after the entries so far (where a part that keeps nothing would start)."""
    if not entries:
        return 0
    last = entries[-1]
    return int(last["first_transition"]) + int(last["transitions"])


def subset_rows(
    part: Any, read_rows: ReadRows
) -> tuple[dict[str, np.ndarray], Iterator[tuple[str, np.ndarray, Any]]]:
    """Part ``part`` of a subset plan: its kind's rows, filtered to the pieces and renumbered."""
    keep: SubsetPart = part.spec
    original = keep.original
    steps, stream = read_rows(original)
    index = np.concatenate(
        [np.arange(a, b, dtype=np.int64) for a, b in zip(keep.starts, keep.stops, strict=True)]
    )
    lengths = keep.lengths
    ends = np.cumsum(lengths) - 1
    out: dict[str, np.ndarray] = {}
    for name, values in steps.items():
        if spec(name).dims[0] == "episode":  # pragma: no cover - no kind has such steps
            continue
        out[name] = np.asarray(values)[index]
    n = len(index)
    out[EPISODE] = np.repeat(
        np.arange(part.first_episode, part.first_episode + len(lengths), dtype=np.int64), lengths
    )
    terminated = np.zeros(n, dtype=bool)
    truncated = np.zeros(n, dtype=bool)
    terminated[ends[keep.terminated]] = True
    truncated[ends[~keep.terminated]] = True
    out[TERMINATED], out[TRUNCATED] = terminated, truncated
    # original row (from the part's first) -> row of the store; -1 where not kept
    remap = np.full(int(original.rows), -1, dtype=np.int64)
    remap[index] = part.out_start + np.arange(n, dtype=np.int64)
    # the final frame of an original episode goes to the piece that ends it, terminated
    finals = {
        int(e): part.first_episode + i
        for i, (e, t) in enumerate(zip(keep.source_episode, keep.terminated, strict=True))
    }
    ended = {int(e) for e, t in zip(keep.source_episode, keep.terminated, strict=True) if t}

    def filtered() -> Iterator[tuple[str, np.ndarray, Any]]:
        for name, rows, values in stream:
            if name == FINAL_OBSERVATION:
                new = np.array([finals.get(int(r), -1) for r in rows], dtype=np.int64)
                sel = np.flatnonzero(new >= 0)
                if sel.size:
                    frames = np.array(values[sel], copy=True)
                    for j, r in enumerate(np.asarray(rows)[sel].tolist()):
                        if int(r) not in ended:  # cut or trimmed: the next frame is unknown
                            frames[j] = 0
                    yield name, new[sel], frames
                continue
            new = remap[np.asarray(rows, dtype=np.int64) - original.out_start]
            sel = np.flatnonzero(new >= 0)
            if sel.size:
                yield name, new[sel], values[sel]

    return out, filtered()
