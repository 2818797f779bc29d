"""Undo dopamine's circular buffer: the exact, chronological transition stream.

A DQN Replay checkpoint is a dump of a circular buffer of capacity ``C``, not a list
of transitions (``docs/format.md`` has the full story). This module turns the
per-step arrays of every checkpoint (small: ``9·C`` bytes) into a :class:`RunPlan`:
for each checkpoint, which buffer rows are real, new transitions and which output
row each one becomes. The frames are moved later, by streaming, following the plan.

The rules it applies, in order (placement by ``add_count``, the never-written row, the
padding, missed logs as gaps, the final partial checkpoint, the ends, and the true first
step of every episode through checkpoints left out) are defined once, in
``docs/format.md``: "How the source maps to the store" and "Fragments".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atari_zarr.episodes import UNKNOWN_STEP, EpisodeLedger
from atari_zarr.errors import SourceFormatError
from atari_zarr.layout import ACTION, EPISODE, REWARD, SOURCE_ROW, TERMINATED, TRUNCATED
from atari_zarr.sources.dqn_replay.files import RunSource, SmallArrays

__all__ = ["Lap", "RunPlan", "lap_destinations", "lap_step_arrays", "plan_run"]

log = logging.getLogger("atari_zarr")

PADDING_ROWS = 3  # dopamine: stack_size - 1 zero rows before each episode


@dataclass
class Lap:
    """What to take from one checkpoint, and where it goes.

    Chronological position ``p`` of the checkpoint is buffer index
    ``(start_index + p) % capacity`` and source row ``first_row + p``.
    Positions ``first_pos .. capacity - 1`` are considered; of those, the
    ``padding`` ones (offsets from ``first_pos``) are dropped, the rest become
    output rows ``out_start .. out_start + n_out - 1`` in order.
    """

    suffix: int
    add_count: int
    kind: str  # "regular", "final" or "final-after-missed-log"
    capacity: int
    start_index: int
    first_row: int
    first_pos: int
    padding: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    out_start: int = 0
    n_out: int = 0
    first_episode: int = 0
    truncate_last: bool = False
    #: Positions from here on are left out (a transition limit cut the lap); None: none.
    stop_pos: int | None = None

    def positions(self) -> np.ndarray:
        """Buffer indices of positions ``first_pos ..`` in chronological order."""
        stop = self.capacity if self.stop_pos is None else self.stop_pos
        return (self.start_index + np.arange(self.first_pos, stop)) % self.capacity

    def kept_mask(self) -> np.ndarray:
        stop = self.capacity if self.stop_pos is None else self.stop_pos
        keep = np.ones(stop - self.first_pos, dtype=bool)
        keep[self.padding] = False
        return keep

    def summary(self) -> dict[str, Any]:
        return {
            "suffix": self.suffix,
            "add_count": self.add_count,
            "kind": self.kind,
            "first_source_row": self.first_row + self.first_pos,
            "source_rows": (self.capacity if self.stop_pos is None else self.stop_pos)
            - self.first_pos,
            "padding_rows": len(self.padding),
            "transitions": self.n_out,
            "first_transition": self.out_start,
            # After a missed final log, how many laps were missed is unknown: source
            # rows are numbered as if one was (a lower bound).
            "source_rows_exact": self.kind != "final-after-missed-log",
        }


@dataclass
class RunPlan:
    """Everything needed to write one store, computed from the small arrays only."""

    capacity: int
    laps: list[Lap]
    n_rows: int
    gaps: list[dict[str, int]]
    #: Per-episode lengths, returns and end kinds of the rows planned (none running).
    episodes: EpisodeLedger
    dropped: dict[str, int]
    #: True step of each episode's first row (0: whole; -1: a fragment of unknown start).
    first_steps: list[int] = field(default_factory=list)

    def attributes(self) -> dict[str, Any]:
        """The part of the store attributes that describes the conversion."""
        return {
            "capacity": self.capacity,
            "checkpoints": [lap.summary() for lap in self.laps],
            "gaps": self.gaps,
            "dropped_rows": self.dropped,
        }


def _classify(
    add_counts: dict[int, int], capacity: int, where: str
) -> tuple[list[int], int | None]:
    """Split suffixes into regular checkpoints and the final partial one."""
    suffixes = sorted(add_counts)
    final: int | None = None
    last = suffixes[-1]
    others = [add_counts[s] for s in suffixes[:-1]]
    if add_counts[last] % capacity != capacity - 1 or (others and add_counts[last] <= max(others)):
        final = last
    regular = [s for s in suffixes if s != final]
    previous: tuple[int, int] | None = None
    for s in regular:
        a = add_counts[s]
        if a % capacity != capacity - 1:
            raise SourceFormatError(
                f"checkpoint {s} in {where} has add_count {a}, which is not a full-buffer "
                f"log point (add_count % {capacity} == {capacity - 1}), and it is not the last "
                f"checkpoint; only the last one may be a final partial log. The run mixes files "
                f"of different runs; copy it again."
            )
        if previous is not None and a <= previous[1]:
            raise SourceFormatError(
                f"checkpoint {s} in {where} has add_count {a}, not more than checkpoint "
                f"{previous[0]}'s {previous[1]}; add_count must grow with the suffix. The run "
                f"mixes files of different runs; copy it again."
            )
        previous = (s, a)
    return regular, final


def _stale_matches(final: SmallArrays, prev: SmallArrays, indices: np.ndarray) -> bool:
    return bool(
        np.array_equal(final.action[indices], prev.action[indices])
        and np.array_equal(final.reward[indices], prev.reward[indices])
        and np.array_equal(final.terminal[indices], prev.terminal[indices])
    )


class _Planner:
    """Walks the laps in source order, carrying episode and padding state."""

    def __init__(self, source: RunSource, capacity: int) -> None:
        self.source = source
        self.capacity = capacity
        self.next_row = 0  # source row expected next
        self.pad_left: int | None = PADDING_ROWS  # padding still due; None = unknown
        self.n_out = 0
        self.episodes = EpisodeLedger()
        self.gaps: list[dict[str, int]] = []
        self.last_kept_lap: Lap | None = None
        self.dropped = {"padding": 0, "stale": 0, "never_written": 0, "not_selected": 0}
        #: Source row of the first step of the source's episode in progress (None: unknown).
        self.episode_start: int | None = None
        #: The next real row begins an episode (the stream starts, or a terminal was seen).
        self.awaiting_start = True
        #: True step of each output episode's first row, in order.
        self.first_steps: list[int] = []

    def cut(self) -> None:
        """Truncate the episode in progress (a gap follows, or the data ends)."""
        if self.episodes.cut():
            assert self.last_kept_lap is not None
            self.last_kept_lap.truncate_last = True

    def _leading_padding(self, lap: Lap, small: SmallArrays, idx: np.ndarray) -> int:
        """After a gap: count leading all-zero rows (frames peeked), at most 3."""
        n = 0
        limit = min(PADDING_ROWS, len(idx))
        while (
            n < limit
            and small.action[idx[n]] == 0
            and small.reward[idx[n]] == 0
            and small.terminal[idx[n]] == 0
        ):
            n += 1
        if n == 0:
            return 0
        frames = self.source.read_observation_rows(lap.suffix, self.capacity, list(idx[:n]))
        count = 0
        while count < n and not frames[count].any():
            count += 1
        return count

    def add(self, lap: Lap, small: SmallArrays, selected: bool) -> None:
        where = self.source.where("add_count", lap.suffix)
        never = max(0, -(lap.first_row + lap.first_pos))
        lap.first_pos += never
        start_row = lap.first_row + lap.first_pos
        if start_row < self.next_row:
            raise SourceFormatError(
                f"{where}: checkpoint {lap.suffix} (add_count {lap.add_count}) starts at source "
                f"row {start_row}, inside rows already taken from an earlier checkpoint (up to "
                f"{self.next_row - 1}); expected checkpoints that do not overlap. The run mixes "
                f"files of different runs; copy it again."
            )
        if start_row > self.next_row:
            self.gaps.append(
                {"from_row": self.next_row, "to_row": start_row, "rows": start_row - self.next_row}
            )
            self.cut()
            self.pad_left = None
            self.episode_start, self.awaiting_start = None, False
        idx = lap.positions()
        n = len(idx)
        act, rew, term = small.action[idx], small.reward[idx], small.terminal[idx]
        pad = np.zeros(n, dtype=bool)
        lead = self._leading_padding(lap, small, idx) if self.pad_left is None else self.pad_left
        if self.pad_left is None and lead:  # padding after a gap: an episode begins after it
            self.awaiting_start = True
        pad[: min(lead, n)] = True
        terminals = np.flatnonzero(term)
        for k in range(1, PADDING_ROWS + 1):
            after = terminals + k
            pad[after[after < n]] = True
        bad = np.flatnonzero(pad & ((act != 0) | (rew != 0) | (term != 0)))
        if bad.size:
            i = int(idx[bad[0]])
            raise SourceFormatError(
                f"{self.source.where('action', lap.suffix)}: buffer row {i} (source row "
                f"{start_row + int(bad[0])}) follows a terminal row or the start, so dopamine "
                f"wrote zero padding there, but it holds action {int(small.action[i])}, reward "
                f"{float(small.reward[i])}, terminal {int(small.terminal[i])}. Expected a "
                f"DQN Replay run logged with stack_size 4; this data was written differently."
            )
        if terminals.size:
            self.pad_left = max(0, PADDING_ROWS - (n - 1 - int(terminals[-1])))
        else:
            self.pad_left = max(0, lead - n)
        self.next_row = start_row + n
        self.dropped["never_written"] += never
        # which real rows begin a source episode: the first after a terminal (or the start)
        real = np.flatnonzero(~pad)
        begins = np.zeros(len(real), dtype=bool)
        if len(real):
            begins[0] = self.awaiting_start
            begins[1:] = term[real[:-1]] != 0
        entry_start = self.episode_start
        if selected and len(real) and self.episodes.current_length == 0:
            # the output starts an episode at this lap's first real row
            if begins[0]:
                self.first_steps.append(0)
            elif entry_start is not None:
                self.first_steps.append(start_row + int(real[0]) - entry_start)
            else:
                self.first_steps.append(UNKNOWN_STEP)
        if selected and len(real):
            self.first_steps.extend([0] * int(begins[1:].sum()))
        if begins.any():
            self.episode_start = start_row + int(real[np.flatnonzero(begins)[-1]])
        if len(real):
            self.awaiting_start = bool(term[real[-1]])
        if not selected:
            # Walked only for padding and continuity; what follows sees a gap.
            self.dropped["not_selected"] += n
            return
        lap.padding = np.flatnonzero(pad)
        keep = ~pad
        lap.out_start = self.n_out
        lap.n_out = int(keep.sum())
        lap.first_episode = len(self.episodes)
        self.n_out += lap.n_out
        self.dropped["padding"] += len(lap.padding)
        if lap.n_out:
            self.last_kept_lap = lap
            self.episodes.feed(rew[keep], terminated=term[keep].astype(bool))


def plan_run(
    source: RunSource,
    suffixes: Iterable[int] | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> RunPlan:
    """Plan the conversion of ``source`` from its small arrays.

    Parameters
    ----------
    source : RunSource
        The run to convert.
    suffixes : iterable of int, optional
        Checkpoint suffixes to convert (default: all). The others are still read
        (their small arrays only) so that padding after them is recognised.
    progress : callable, optional
        Called with 1 after each checkpoint is planned.

    Returns
    -------
    RunPlan

    Examples
    --------
    >>> from atari_zarr.sources.dqn_replay.files import RunSource
    >>> # source_root: a DQN Replay root holding the fixture run Pong/1
    >>> plan = plan_run(RunSource(f"{source_root}/Pong/1", "Pong", "1"))
    >>> plan.n_rows, [lap.kind for lap in plan.laps][-1]
    (300, 'final')
    """
    where = source.url
    add_counts = {s: source.read_add_count(s) for s in source.suffixes}
    selected = set(source.suffixes if suffixes is None else suffixes)
    unknown = selected - set(source.suffixes)
    if unknown:
        raise SourceFormatError(
            f"checkpoints {sorted(unknown)} are not in {where}; available: {source.suffixes}."
        )
    first = source.read_small(source.suffixes[0])
    capacity = first.capacity
    regular, final = _classify(add_counts, capacity, where)

    laps: list[tuple[Lap, int]] = []
    for s in regular:
        a = add_counts[s]
        laps.append((Lap(s, a, "regular", capacity, a % capacity, a - capacity, 0), s))
    prev_small: SmallArrays | None = None
    final_small: SmallArrays | None = None
    if final is not None:
        c = add_counts[final]
        a_prev = add_counts[regular[-1]] if regular else -1
        new = c + 1 if c < capacity - 1 else 0
        lap = Lap(final, c, "final", capacity, c, a_prev + new - capacity, capacity - new)
        if regular and new < capacity:
            final_small = source.read_small(final)
            prev_small = source.read_small(regular[-1])
            stale_idx = (c + np.arange(0, capacity - new)) % capacity
            if not _stale_matches(final_small, prev_small, stale_idx):
                # A log was missed after the last regular one: every row is new.
                lap = Lap(final, c, "final-after-missed-log", capacity, c, a_prev + c + 1, 0)
                log.warning(
                    "%s: the stale part of final checkpoint %d differs from checkpoint %d; "
                    "a log was missed in between, so all its rows are taken as new",
                    where,
                    final,
                    regular[-1],
                )
        laps.append((lap, final))

    planner = _Planner(source, capacity)
    out: list[Lap] = []
    prev_selected = True
    for lap, suffix in laps:
        if suffix == source.suffixes[0]:
            small = first
        elif final_small is not None and suffix == final:
            small = final_small
        elif prev_small is not None and suffix == prev_small.suffix:
            small = prev_small
        else:
            small = source.read_small(suffix)
        if small.capacity != capacity:
            raise SourceFormatError(
                f"{source.where('action', suffix)} holds {small.capacity} rows; expected "
                f"{capacity}, the capacity of checkpoint {source.suffixes[0]} (one capacity per "
                f"run). The run mixes files of different runs; copy it again."
            )
        is_selected = suffix in selected
        if lap.kind == "final" and final_small is not None:
            planner.dropped["stale"] += lap.first_pos
        planner.add(lap, small, is_selected)
        if is_selected:
            out.append(lap)
        elif prev_selected:
            planner.cut()  # the output jumps over this checkpoint
        prev_selected = is_selected
        if progress is not None:
            progress(1)
    planner.cut()
    return RunPlan(
        capacity=capacity,
        laps=out,
        n_rows=planner.n_out,
        gaps=planner.gaps,
        episodes=planner.episodes,
        dropped=planner.dropped,
        first_steps=planner.first_steps,
    )


def lap_step_arrays(lap: Lap, small: SmallArrays) -> dict[str, np.ndarray]:
    """The per-step output arrays of one lap, in output order, by array of the layout.

    Keys are :data:`~atari_zarr.layout.ACTION`, ``REWARD``, ``TERMINATED``,
    ``TRUNCATED``, ``EPISODE`` and ``SOURCE_ROW``.
    """
    idx = lap.positions()
    keep = lap.kept_mask()
    kidx = idx[keep]
    terminated = small.terminal[kidx].astype(bool)
    truncated = np.zeros(lap.n_out, dtype=bool)
    if lap.truncate_last and lap.n_out:
        truncated[-1] = True
    ends = terminated | truncated
    episode = np.empty(lap.n_out, dtype=np.int64)
    if lap.n_out:
        episode[0] = lap.first_episode
        episode[1:] = lap.first_episode + np.cumsum(ends[:-1], dtype=np.int64)
    source_row = lap.first_row + lap.first_pos + np.flatnonzero(keep).astype(np.int64)
    return {
        ACTION: small.action[kidx].astype(np.int32),
        REWARD: small.reward[kidx].astype(np.float32),
        TERMINATED: terminated,
        TRUNCATED: truncated,
        EPISODE: episode,
        SOURCE_ROW: source_row,
    }


def lap_destinations(lap: Lap) -> np.ndarray:
    """Output row of every buffer index of the lap's checkpoint, ``-1`` where dropped."""
    dest = np.full(lap.capacity, -1, dtype=np.int64)
    idx = lap.positions()[lap.kept_mask()]
    dest[idx] = lap.out_start + np.arange(lap.n_out, dtype=np.int64)
    return dest
