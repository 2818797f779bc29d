"""The subsets papers train on, chosen from a run's episodes: :class:`Subset`.

Offline-RL papers rarely train on whole 50M-transition runs. Two rules name most
of the subsets in use, and both choose whole episodes per checkpoint:

``fraction`` (d3rlpy's ``get_atari_transitions(game, fraction=F)``)
    From every checkpoint: its episodes in a random order, taken until ``int(F *
    checkpoint_rows)`` transitions are reached, the last one trimmed so the count
    is exact (a trimmed episode ends cut, as d3rlpy marks it ``terminated=False``).
    ``checkpoint_rows`` is 1,000,000, the transitions of one DQN Replay checkpoint
    (its buffer's capacity) and of one RL Unplugged shard; for a DQN Replay run it
    is the run's capacity. d3rlpy shuffles with Python's unseeded ``random``;
    here the order is drawn from ``seed`` and the checkpoint, so a subset can be
    made again. With ``order="played"`` the episodes are taken in the order they
    were played instead: the same count from the same checkpoints, but a *prefix*
    of each, so a source that can only be read from its start (a GZIP shard) is
    read only as far as the prefix (:meth:`Subset.prefix_rows`).
``decision-transformer`` (kzl/decision-transformer ``create_dataset``)
    Until ``num_steps`` transitions are taken: draw one of the last ``num_buffers``
    checkpoints at random and take its next ``trajectories_per_buffer`` whole
    trajectories (episodes that start and end in a terminal state inside it). A
    checkpoint without whole trajectories left is no longer drawn.

Episodes are those of the store's rows, cut at checkpoint boundaries (the part of an
episode that lies in a checkpoint is that checkpoint's; a part that ends at the
boundary ends cut). Chosen pieces keep their row order. Both the converter
(``--fraction``, ``--dt-*``) and the Decision Transformer drop-in
(:mod:`atari_zarr.compat.decision_transformer`) call :func:`select_pieces`, on a plan
or on a store.

Examples
--------
>>> from atari_zarr.episodes import EpisodeTable, SourcePart
>>> table = EpisodeTable(np.array([4, 6, 5, 5]), np.array([True, True, True, False]), None)
>>> parts = [SourcePart(0, 0, 10), SourcePart(1, 10, 10)]
>>> chosen = select_pieces(Subset.fraction_of(0.5, seed=0, checkpoint_rows=10), parts, table)
>>> chosen.rows  # 5 per checkpoint
10
>>> chosen.start.tolist(), chosen.stop.tolist(), chosen.terminated.tolist()
([0, 4, 10], [4, 5, 15], [True, False, True])
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atari_zarr.arguments import whole_number
from atari_zarr.episodes import EpisodeTable, SourcePart
from atari_zarr.errors import InvalidArgumentError

__all__ = [
    "CHECKPOINT_ROWS",
    "ORDERS",
    "PLAYED",
    "RANDOM",
    "Pieces",
    "Subset",
    "episode_pieces",
    "select_pieces",
]

log = logging.getLogger("atari_zarr")

#: Transitions of one checkpoint of the dataset (d3rlpy's "1M steps per epoch").
CHECKPOINT_ROWS = 1_000_000
FRACTION = "fraction"
DECISION_TRANSFORMER = "decision-transformer"
#: Orders of the fraction rule: d3rlpy's shuffle, or the order of play (a prefix).
RANDOM, PLAYED = "random", "played"
ORDERS = (RANDOM, PLAYED)


def _fraction_rows(fraction: float, checkpoint_rows: int, where: str) -> int:
    """d3rlpy's count, ``int(fraction * checkpoint_rows)``; refused when it is 0 rows."""
    rows = int(checkpoint_rows * fraction)
    if rows < 1:
        raise InvalidArgumentError(
            f"fraction {fraction:g} of checkpoints of {checkpoint_rows:,} transitions takes 0 "
            f"transitions of each for {where}; expected at least one: pass a fraction of "
            f"{1 / checkpoint_rows:.3g} or more"
        )
    return rows


#: The largest seed: 64 bits. NumPy takes more, but a cache's folder name holds the
#: seed, and a name of hundreds of digits is too long for a file system.
MAX_SEED = 2**64 - 1


def _seed(seed: Any, where: str) -> int:
    """A subset's seed: an integer from 0 to :data:`MAX_SEED` (NumPy's generators take
    no negative one), checked before anything is read."""
    if isinstance(seed, int) and not isinstance(seed, bool) and seed > MAX_SEED:
        raise InvalidArgumentError(
            f"seed (--subset-seed) must be at most 2**64 - 1; got an integer of "
            f"{seed.bit_length()} bits for {where}. Pass a seed of at most 20 digits"
        )
    return whole_number(seed, "seed (--subset-seed)", where, low=0)


@dataclass(frozen=True)
class Subset:
    """A rule that chooses episodes of a run (see the module docstring).

    Make one with :meth:`fraction_of` or :meth:`decision_transformer`; it is recorded
    in a store's ``selection`` attribute (:meth:`attributes`).
    """

    rule: str
    fraction: float | None = None
    num_buffers: int | None = None
    num_steps: int | None = None
    trajectories_per_buffer: int | None = None
    seed: int = 0
    #: Transitions of a checkpoint for ``fraction`` (None: the run's own figure).
    checkpoint_rows: int | None = field(default=None)
    #: ``fraction`` only: the order episodes are taken in, ``"random"`` (d3rlpy's) or
    #: ``"played"`` (a prefix of every checkpoint).
    order: str = RANDOM

    @classmethod
    def fraction_of(
        cls,
        fraction: float,
        *,
        seed: int = 0,
        checkpoint_rows: int | None = None,
        order: str = RANDOM,
        where: str = "the selection",
    ) -> Subset:
        """d3rlpy's rule: ``int(fraction * checkpoint_rows)`` transitions per checkpoint.

        ``order="random"`` shuffles each checkpoint's episodes as d3rlpy does (from
        ``seed``); ``order="played"`` takes them in the order they were played.

        Raises
        ------
        InvalidArgumentError
            ``fraction`` outside ``(0, 1]``, or an unknown ``order``.

        Examples
        --------
        >>> Subset.fraction_of(1.5)
        Traceback (most recent call last):
            ...
        atari_zarr.errors.InvalidArgumentError: fraction must be in (0, 1]; got 1.5 for \
the selection (e.g. 0.01 for d3rlpy's 1%)
        """
        try:
            f = float(fraction)
        except (TypeError, ValueError):
            f = float("nan")
        if isinstance(fraction, bool) or not 0.0 < f <= 1.0:
            raise InvalidArgumentError(
                f"fraction must be in (0, 1]; got {fraction!r} for {where} (e.g. 0.01 for "
                f"d3rlpy's 1%)"
            )
        rows = (
            None
            if checkpoint_rows is None
            else whole_number(checkpoint_rows, "checkpoint_rows", where)
        )
        if order not in ORDERS:
            raise InvalidArgumentError(
                f'order must be one of {list(ORDERS)}; got {order!r} for {where} ("random": '
                f'd3rlpy\'s shuffle of each checkpoint, "played": the order of play)'
            )
        _fraction_rows(f, rows or CHECKPOINT_ROWS, where)
        seed = _seed(seed, where)
        if order == PLAYED:
            seed = 0  # the order of play draws nothing: one rule, one store, whatever the seed
        return cls(FRACTION, fraction=f, seed=seed, checkpoint_rows=rows, order=order)

    @classmethod
    def decision_transformer(
        cls,
        num_buffers: int = 50,
        num_steps: int = 500_000,
        trajectories_per_buffer: int = 10,
        *,
        seed: int = 0,
        where: str = "the selection",
    ) -> Subset:
        """kzl/decision-transformer's ``create_dataset`` sampling (defaults: its own)."""
        return cls(
            DECISION_TRANSFORMER,
            num_buffers=whole_number(num_buffers, "num_buffers", where),
            num_steps=whole_number(num_steps, "num_steps", where),
            trajectories_per_buffer=whole_number(
                trajectories_per_buffer, "trajectories_per_buffer", where
            ),
            seed=_seed(seed, where),
        )

    def attributes(self) -> dict[str, Any]:
        """The subset as a store records it."""
        out: dict[str, Any] = {"rule": self.rule, "seed": self.seed}
        if self.rule == FRACTION:
            out["fraction"] = self.fraction
            out["checkpoint_rows"] = self.checkpoint_rows
            if self.order != RANDOM:  # stores made before orders existed record none
                out["order"] = self.order
        else:
            out.update(
                num_buffers=self.num_buffers,
                num_steps=self.num_steps,
                trajectories_per_buffer=self.trajectories_per_buffer,
            )
        return out

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any] | None) -> Subset | None:
        """The subset a store recorded (None: the whole run).

        Examples
        --------
        >>> s = Subset.decision_transformer(2, 100, 3, seed=5)
        >>> Subset.from_attributes(s.attributes()) == s
        True
        """
        if not attrs:
            return None
        rule = attrs.get("rule")
        if rule == FRACTION:
            return cls.fraction_of(
                attrs.get("fraction"),  # type: ignore[arg-type]
                seed=int(attrs.get("seed", 0)),
                checkpoint_rows=attrs.get("checkpoint_rows"),
                order=str(attrs.get("order", RANDOM)),
            )
        if rule == DECISION_TRANSFORMER:
            return cls.decision_transformer(
                attrs.get("num_buffers"),  # type: ignore[arg-type]
                attrs.get("num_steps"),  # type: ignore[arg-type]
                attrs.get("trajectories_per_buffer"),  # type: ignore[arg-type]
                seed=int(attrs.get("seed", 0)),
            )
        raise InvalidArgumentError(
            f"unknown subset rule {rule!r}; expected {FRACTION!r} or {DECISION_TRANSFORMER!r}"
        )

    def prefix_rows(self, checkpoint_rows: int = CHECKPOINT_ROWS) -> int | None:
        """Rows from the start of each checkpoint that hold every row this rule takes.

        None where the rule may take rows from anywhere in a checkpoint (d3rlpy's
        shuffle, the Decision Transformer's sampling). A scan of a checkpoint may stop
        once it has read this many rows (and the episode they end in).

        Examples
        --------
        >>> Subset.fraction_of(0.01, order="played").prefix_rows()
        10000
        >>> Subset.fraction_of(0.01).prefix_rows() is None
        True
        """
        if self.rule != FRACTION or self.order != PLAYED:
            return None
        assert self.fraction is not None
        return int((self.checkpoint_rows or checkpoint_rows) * self.fraction)

    def describe(self) -> str:
        """One line for logs and ``info``."""
        if self.rule == FRACTION:
            how = " in the order played" if self.order == PLAYED else ""
            return f"fraction {self.fraction} of every checkpoint{how} (seed {self.seed})"
        return (
            f"Decision Transformer sampling: {self.num_steps} steps from the last "
            f"{self.num_buffers} checkpoints, {self.trajectories_per_buffer} trajectories at a "
            f"time (seed {self.seed})"
        )


@dataclass(frozen=True)
class Pieces:
    """Runs of consecutive rows of one episode each, in row order.

    Attributes
    ----------
    start, stop : numpy.ndarray
        ``(M,)`` int64: rows ``start .. stop - 1`` of the run.
    terminated : numpy.ndarray
        ``(M,)`` bool: the piece ends in a terminal state (else it ends cut).
    episode : numpy.ndarray
        ``(M,)`` int64: the run's episode it belongs to.
    part : numpy.ndarray
        ``(M,)`` int64: position of its checkpoint in the parts given.
    whole : numpy.ndarray
        ``(M,)`` bool: the piece starts at its episode's first row.
    """

    start: np.ndarray
    stop: np.ndarray
    terminated: np.ndarray
    episode: np.ndarray
    part: np.ndarray
    whole: np.ndarray

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @property
    def length(self) -> np.ndarray:
        return self.stop - self.start

    @property
    def rows(self) -> int:
        """Rows of all pieces."""
        return int(self.length.sum())

    def take(self, idx: np.ndarray) -> Pieces:
        """The pieces ``idx``, in row order."""
        idx = np.sort(np.asarray(idx, dtype=np.int64))
        return Pieces(
            self.start[idx],
            self.stop[idx],
            self.terminated[idx],
            self.episode[idx],
            self.part[idx],
            self.whole[idx],
        )


def episode_pieces(parts: Sequence[SourcePart], table: EpisodeTable) -> Pieces:
    """The episodes of ``table`` cut at the boundaries of ``parts`` (checkpoints).

    Examples
    --------
    >>> from atari_zarr.episodes import EpisodeTable, SourcePart
    >>> table = EpisodeTable(np.array([4, 6]), np.array([True, True]), None)
    >>> p = episode_pieces([SourcePart(0, 0, 6), SourcePart(1, 6, 4)], table)
    >>> p.start.tolist(), p.stop.tolist(), p.terminated.tolist(), p.whole.tolist()
    ([0, 4, 6], [4, 6, 10], [True, False, True], [True, True, False])
    """
    starts, ends = table.starts, table.ends
    cols: list[list[Any]] = [[], [], [], [], [], []]
    for i, part in enumerate(parts):
        a, b = part.first_row, part.first_row + part.rows
        e0 = int(np.searchsorted(ends, a, side="left"))
        e1 = int(np.searchsorted(starts, b, side="left"))
        for e in range(e0, e1):
            lo, hi = max(int(starts[e]), a), min(int(ends[e]) + 1, b)
            if lo >= hi:
                continue
            ends_here = hi == int(ends[e]) + 1
            for col, value in zip(
                cols,
                (lo, hi, ends_here and bool(table.terminated[e]), e, i, lo == int(starts[e])),
                strict=True,
            ):
                col.append(value)
    return Pieces(
        np.asarray(cols[0], dtype=np.int64),
        np.asarray(cols[1], dtype=np.int64),
        np.asarray(cols[2], dtype=bool),
        np.asarray(cols[3], dtype=np.int64),
        np.asarray(cols[4], dtype=np.int64),
        np.asarray(cols[5], dtype=bool),
    )


def select_pieces(
    subset: Subset,
    parts: Sequence[SourcePart],
    table: EpisodeTable,
    *,
    checkpoint_rows: int = CHECKPOINT_ROWS,
    where: str = "the run",
) -> Pieces:
    """The pieces of episodes ``subset`` chooses from ``parts``, in row order.

    Parameters
    ----------
    subset : Subset
        The rule.
    parts : sequence of SourcePart
        The checkpoints (or shards) and the rows they became, in row order.
    table : EpisodeTable
        The episodes of those rows.
    checkpoint_rows : int
        Transitions of a checkpoint, for ``fraction`` when the subset does not fix it
        (a DQN Replay run's capacity).
    where : str
        The run or store, for messages.

    Raises
    ------
    InvalidArgumentError
        ``num_buffers`` larger than the checkpoints present.
    """
    pieces = episode_pieces(parts, table)
    if subset.rule == FRACTION:
        assert subset.fraction is not None
        budget = _fraction_rows(subset.fraction, subset.checkpoint_rows or checkpoint_rows, where)
        chosen, stops, ends = [], pieces.stop.copy(), pieces.terminated.copy()
        for i, part in enumerate(parts):
            mine = np.flatnonzero(pieces.part == i)
            if subset.order == PLAYED:
                order = mine  # row order is the order of play
            else:
                order = np.random.default_rng([subset.seed, part.checkpoint]).permutation(mine)
            taken = 0
            for j in order.tolist():
                if taken >= budget:
                    break
                size = int(pieces.stop[j] - pieces.start[j])
                if taken + size > budget:  # trimmed to the exact count: it ends cut
                    stops[j] = pieces.start[j] + (budget - taken)
                    ends[j] = False
                    size = budget - taken
                chosen.append(j)
                taken += size
        trimmed = Pieces(pieces.start, stops, ends, pieces.episode, pieces.part, pieces.whole)
        return trimmed.take(np.asarray(chosen, dtype=np.int64))
    assert subset.num_buffers is not None and subset.num_steps is not None
    assert subset.trajectories_per_buffer is not None
    if subset.num_buffers > len(parts):
        raise InvalidArgumentError(
            f"num_buffers {subset.num_buffers} is larger than the {len(parts)} checkpoints "
            f"present in {where} ({[p.checkpoint for p in parts]}); choose at most "
            f"{len(parts)}"
        )
    buffers = list(range(len(parts) - subset.num_buffers, len(parts)))
    whole = {
        b: np.flatnonzero((pieces.part == b) & pieces.whole & pieces.terminated).tolist()
        for b in buffers
    }
    cursor = dict.fromkeys(buffers, 0)
    rng = np.random.default_rng(subset.seed)
    active = [b for b in buffers if whole[b]]
    chosen = []
    total = 0
    while total < subset.num_steps and active:
        b = active[int(rng.integers(len(active)))]
        take = whole[b][cursor[b] : cursor[b] + subset.trajectories_per_buffer]
        cursor[b] += len(take)
        if cursor[b] >= len(whole[b]):
            active.remove(b)
        chosen.extend(take)
        total += int((pieces.stop[take] - pieces.start[take]).sum())
    if total < subset.num_steps:
        log.warning(
            "%s: the last %d checkpoints hold %d transitions in whole trajectories, fewer "
            "than the %d asked for; all of them are taken",
            where,
            subset.num_buffers,
            total,
            subset.num_steps,
        )
    return pieces.take(np.asarray(chosen, dtype=np.int64))
