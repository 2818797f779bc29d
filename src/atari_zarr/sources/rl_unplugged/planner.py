"""Plan the store of an RL Unplugged run from its scans: offsets, episode ids, limits.

Each record (a ``tf.train.Example``) is one episode, its real steps rows in file order,
shard after shard; a record without a real step gives no row (counted in ``dropped``).
Limits are applied here, before anything is written, and shards after the cut are not
scanned (:func:`scans_needed`). The rules (rows, ``final_observation``, limits, gaps,
``source_row = shard * SHARD_STRIDE + step``) are defined once, in ``docs/format.md``:
"How RL Unplugged maps to the store".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atari_zarr.episodes import FIRST_STEP, UNKNOWN_STEP, EpisodeLedger
from atari_zarr.sources.rl_unplugged.scan import ShardScan

__all__ = [
    "MAX_DISAGREEMENTS",
    "SHARD_STRIDE",
    "RluPlan",
    "ShardPart",
    "check_returns",
    "plan_shards",
    "return_disagreements",
    "scans_needed",
]

log = logging.getLogger("atari_zarr")

#: ``source_row // SHARD_STRIDE`` is the shard, ``source_row % SHARD_STRIDE`` the step in it.
SHARD_STRIDE = 1_000_000_000
#: Disagreements between the source's returns and the step rewards listed in the attributes.
MAX_DISAGREEMENTS = 10
#: Returns agree when they differ by at most this much (absolute) plus a relative 1e-5:
#: the source keeps float32 returns of float32 rewards.
RETURN_ATOL = 1e-3


@dataclass
class ShardPart:
    """What to take from one shard, and where it goes.

    The shard's first ``records`` records are kept; their real steps become rows
    ``out_start .. out_start + rows - 1`` and the ``episodes`` records with a real
    step become episodes ``first_episode ..``. ``cut_rows`` is the rows kept of the
    last record when a transition limit cut it (None: kept whole).
    """

    index: int
    records: int
    rows: int
    out_start: int
    first_episode: int
    episodes: int
    cut_rows: int | None = None

    @property
    def key(self) -> str:
        """Graph key and done marker of the shard's write task."""
        return f"shard-{self.index}"

    def real(self, scan: ShardScan) -> np.ndarray:
        """Rows taken from each kept record of ``scan`` (the last one after a cut)."""
        real = np.array(scan.real[: self.records], dtype=np.int64)
        if self.cut_rows is not None and self.records:
            real[-1] = self.cut_rows
        return real

    def summary(self) -> dict[str, Any]:
        return {
            "shard": self.index,
            "records": self.records,
            "transitions": self.rows,
            "first_transition": self.out_start,
            "episodes": self.episodes,
            "first_episode": self.first_episode,
            "cut": self.cut_rows is not None,
        }


@dataclass
class RluPlan:
    """Everything needed to write one store of an RL Unplugged run."""

    num_shards: int
    present: list[int]
    selected: list[int]
    parts: list[ShardPart]
    n_rows: int
    episodes: EpisodeLedger
    gaps: list[dict[str, Any]]
    dropped: dict[str, int]
    #: Per-episode columns from the source: checkpoint_idx, episode_idx, episode_return,
    #: clipped_episode_return (None where absent).
    table: dict[str, list[Any]] = field(default_factory=dict)
    returns_check: dict[str, Any] = field(default_factory=dict)

    @property
    def n_episodes(self) -> int:
        return len(self.episodes)

    def attributes(self) -> dict[str, Any]:
        """The part of the store attributes that describes the conversion."""
        return {
            "num_shards": self.num_shards,
            "shards": [part.summary() for part in self.parts],
            "gaps": self.gaps,
            "dropped_records": self.dropped,
            "returns_check": self.returns_check,
        }

    def episode_attributes(self) -> dict[str, list[Any]]:
        """The ``episodes`` attribute: the ledger's columns and the source's."""
        return {**self.episodes.as_attributes(), **self.table}


def scans_needed(
    selected: Sequence[int],
    scanned: Mapping[int, tuple[int, int]],
    *,
    max_transitions: int | None = None,
    max_episodes: int | None = None,
    batch: int = 1,
) -> list[int]:
    """The next shards to scan, in index order; empty once planning can proceed.

    Parameters
    ----------
    selected : sequence of int
        Shards chosen, in index order.
    scanned : mapping of int to (int, int)
        Rows and episodes of every shard scanned so far.
    max_transitions, max_episodes : int, optional
        Limits: shards after the one where a limit is reached are not needed.
    batch : int
        At most this many shards (e.g. the number of workers) when a limit applies.

    Examples
    --------
    >>> scans_needed([0, 2, 3], {})
    [0, 2, 3]
    >>> scans_needed([0, 2, 3], {0: (100, 4)}, max_episodes=5, batch=1)
    [2]
    >>> scans_needed([0, 2, 3], {0: (100, 4), 2: (80, 3)}, max_episodes=5)
    []
    """
    if max_transitions is None and max_episodes is None:
        return [i for i in selected if i not in scanned]
    rows = episodes = 0
    out: list[int] = []
    for index in selected:
        if index not in scanned:
            out.append(index)
            if len(out) >= batch:
                break
            continue
        if out:
            continue  # a hole before: its size decides
        rows += scanned[index][0]
        episodes += scanned[index][1]
        if (max_transitions is not None and rows >= max_transitions) or (
            max_episodes is not None and episodes >= max_episodes
        ):
            return []
    return out


def _gaps(
    num_shards: int, present: Sequence[int], converted: Sequence[int]
) -> list[dict[str, Any]]:
    """Runs of shards before or between converted ones that were not converted."""
    if not converted:
        return []
    have = set(present)
    done = set(converted)
    gaps: list[dict[str, Any]] = []
    start: int | None = None
    for i in range(max(converted) + 1):
        if i in done:
            if start is not None:
                gaps.append(_gap(start, i, have))
                start = None
        elif start is None:
            start = i
    return gaps


def _gap(a: int, b: int, have: set[int]) -> dict[str, Any]:
    return {
        "from_shard": a,
        "to_shard": b,
        "shards": b - a,
        "absent": [i for i in range(a, b) if i not in have],
    }


def _close(a: float, b: float) -> bool:
    return bool(abs(a - b) <= RETURN_ATOL + 1e-5 * abs(b))


def check_returns(scans: Sequence[tuple[ShardScan, int]], first_episode: int = 0) -> dict:
    """Compare the source's returns with the sums of the step rewards, record by record.

    ``episode_return`` is compared with the sum of the unclipped rewards of the real
    steps, ``clipped_episode_return`` with the sum of the clipped ones (what DQN
    trained on). The whole record is compared, also where a limit kept part of it.

    Parameters
    ----------
    scans : sequence of (ShardScan, int)
        Each shard's scan and the number of its records kept, in row order.
    first_episode : int
        Store id of the first episode.

    Returns
    -------
    dict
        Per column: ``checked`` (records with that return), ``disagree`` (count) and
        ``first`` (up to :data:`MAX_DISAGREEMENTS`: ``episode``, ``shard``,
        ``record``, ``episode_idx``, ``source`` and ``steps`` returns).
    """
    out: dict[str, dict[str, Any]] = {}
    for column, sums in (
        ("episode_return", "unclipped_sum"),
        ("clipped_episode_return", "clipped_sum"),
    ):
        checked = disagree = 0
        first: list[dict[str, Any]] = []
        episode = first_episode
        for scan, records in scans:
            source = getattr(scan, column)[:records]
            total = getattr(scan, sums)[:records]
            has_rows = scan.real[:records] > 0
            for record in range(records):
                if not has_rows[record]:
                    continue
                value = float(source[record])
                if not np.isnan(value):
                    checked += 1
                    if not _close(value, float(total[record])):
                        disagree += 1
                        if len(first) < MAX_DISAGREEMENTS:
                            first.append(
                                {
                                    "episode": episode,
                                    "shard": scan.index,
                                    "record": record,
                                    "episode_idx": int(scan.episode_idx[record]),
                                    "source": value,
                                    "steps": float(total[record]),
                                }
                            )
                episode += 1
        out[column] = {"checked": checked, "disagree": disagree, "first": first}
    return out


def return_disagreements(meta: Mapping[str, Any]) -> list[str]:
    """One line per disagreement the conversion recorded, for ``info`` and ``verify``.

    Parameters
    ----------
    meta : mapping
        A store's ``atari_zarr`` attributes.

    Returns
    -------
    list of str
        Empty when the store is not from RL Unplugged or every return agreed.

    Examples
    --------
    >>> check = {"episode_return": {"checked": 3, "disagree": 1, "first": [
    ...     {"episode": 2, "shard": 0, "record": 2, "episode_idx": 2, "source": 5.0,
    ...      "steps": 4.0}]}}
    >>> [line] = return_disagreements({"conversion": {"returns_check": check}})
    >>> line[:80]
    '1 of 3 episode_return values differ from the sum of the step rewards; first: epi'
    >>> line[80:]
    'sode 2 (shard 0, record 2): source 5.0, steps 4.0'
    """
    conversion = meta.get("conversion")
    check = conversion.get("returns_check") if isinstance(conversion, Mapping) else None
    if not isinstance(check, Mapping):
        return []
    lines = []
    for column, found in sorted(check.items()):
        if not isinstance(found, Mapping) or not found.get("disagree"):
            continue
        firsts = "; ".join(
            f"episode {d.get('episode')} (shard {d.get('shard')}, record {d.get('record')}): "
            f"source {d.get('source')}, steps {d.get('steps')}"
            for d in found.get("first", [])[:3]
        )
        lines.append(
            f"{found['disagree']} of {found.get('checked')} {column} values differ from the sum "
            f"of the step rewards; first: {firsts}"
        )
    return lines


def plan_shards(
    scans: Mapping[int, ShardScan],
    *,
    num_shards: int,
    present: Sequence[int],
    selected: Sequence[int],
    max_transitions: int | None = None,
    max_episodes: int | None = None,
    load_steps: Callable[[int], ShardScan] | None = None,
) -> RluPlan:
    """Plan the store from the scans of the selected shards (records only are needed).

    Parameters
    ----------
    scans : mapping of int to ShardScan
        The scans, by shard index; every selected shard up to the limits.
    num_shards : int
        ``N`` of the run's file names.
    present : sequence of int
        Shard indices that exist.
    selected : sequence of int
        Shard indices chosen, in index order.
    max_transitions, max_episodes : int, optional
        Limits (None: no limit).
    load_steps : callable, optional
        ``index -> ShardScan`` with the per-step columns: needed only for the return
        of an episode a transition limit cuts (else the scans' sums are used).

    Returns
    -------
    RluPlan
    """
    ledger = EpisodeLedger()
    table: dict[str, list[Any]] = {
        "checkpoint_idx": [],
        "episode_idx": [],
        "episode_return": [],
        "clipped_episode_return": [],
        FIRST_STEP: [],
    }
    # the shard before and whether its last episode ended in a terminal state: an episode
    # that opens a shard is whole after one, and of unknown start otherwise (no public
    # statement says how the source split episodes at checkpoint boundaries)
    before: tuple[int, bool] | None = None
    parts: list[ShardPart] = []
    dropped = {"no_real_step": 0, "over_limit": 0}
    n_out = 0
    kept: list[tuple[ShardScan, int]] = []
    done = False
    for index in selected:
        if done:
            break
        scan = scans[index]
        real = scan.real
        records = scan.records
        cut: int | None = None
        # the limits, record by record
        rows_before = n_out
        eps = 0
        take = 0
        for r in range(scan.records):
            n = int(real[r])
            if max_episodes is not None and len(ledger) + eps >= max_episodes and n:
                done = True
                break
            if max_transitions is not None and rows_before + n >= max_transitions and n:
                left = max_transitions - rows_before
                take = r + 1
                if left < n:
                    cut = left
                eps += 1
                rows_before += left
                done = True
                break
            take = r + 1
            rows_before += n
            eps += 1 if n else 0
        if done:
            records = take
            dropped["over_limit"] += scan.records - take
        part = ShardPart(
            index=index,
            records=records,
            rows=rows_before - n_out,
            out_start=n_out,
            first_episode=len(ledger),
            episodes=eps,
            cut_rows=cut,
        )
        keep = part.real(scan)
        has_rows = keep > 0
        dropped["no_real_step"] += int((~has_rows).sum())
        returns = scan.clipped_sum[:records].copy()
        if cut is not None:
            steps = load_steps(index) if load_steps is not None else scan
            if steps.reward is None:  # pragma: no cover - a caller passing records only
                raise ValueError("a cut episode needs the per-step rewards of its shard")
            start = int(scan.real[: records - 1].sum())
            returns[-1] = float(steps.reward[start : start + cut].astype(np.float64).sum())
        terminal = scan.terminal[:records].copy()
        if cut is not None:
            terminal[-1] = False
        opens_whole = index == 0 or (before is not None and before == (index - 1, True))
        for i, r in enumerate(np.flatnonzero(has_rows).tolist()):
            table[FIRST_STEP].append(0 if i or opens_whole else UNKNOWN_STEP)
            ledger.length.append(int(keep[r]))
            ledger.returns.append(float(returns[r]))
            ledger.terminated.append(bool(terminal[r]))
            table["checkpoint_idx"].append(int(scan.checkpoint_idx[r]))
            table["episode_idx"].append(int(scan.episode_idx[r]))
            for column in ("episode_return", "clipped_episode_return"):
                value = float(getattr(scan, column)[r])
                table[column].append(None if np.isnan(value) else value)
        n_out += part.rows
        before = (index, bool(scan.terminal[scan.records - 1])) if scan.records else None
        if part.rows:
            parts.append(part)
            kept.append((scan, records))
    plan = RluPlan(
        num_shards=num_shards,
        present=list(present),
        selected=list(selected),
        parts=parts,
        n_rows=n_out,
        episodes=ledger,
        gaps=_gaps(num_shards, present, [p.index for p in parts]),
        dropped=dropped,
        table=table,
        returns_check=check_returns(kept),
    )
    for column in ("episode_return", "clipped_episode_return"):
        if all(v is None for v in table[column]):
            del table[column]  # a release without it
    mismatches = sum(c["disagree"] for c in plan.returns_check.values())
    if mismatches:
        log.warning(
            "%d source returns differ from the sum of their step rewards (recorded in the "
            "attributes, conversion.returns_check)",
            mismatches,
        )
    return plan
