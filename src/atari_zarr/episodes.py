"""Episode accounting: the per-episode table of a store, and the one way to build it.

Every store records a per-episode table in its attributes (``episodes``:
``{"length": [...], "return": [...], "terminated": [...]}``) and the counts that
go with it (``counts.episodes``, ``terminated_episodes``, ``truncated_episodes``).

* :class:`EpisodeLedger` builds the table from consecutive rows: the planner
  walks a run's checkpoints with it, the store writer records with it, and
  ``verify`` recomputes the table from the arrays with it. Rows come in blocks of
  any size; an episode still running at the end of a block carries over to the
  next one, so any split of the same rows gives the same lengths and end kinds,
  and the same returns up to float rounding (exactly the same when the rewards
  add up exactly, as DQN's clipped -1/0/1 rewards do).
* :func:`episode_table` is the one parser of the table a store recorded; it gives
  an :class:`EpisodeTable` (numpy columns, with the first and last row of each
  episode).
* :func:`return_to_go` is the one definition of a row's return-to-go (the sum of
  the rewards from the row to its episode's last stored row): the converter's
  ``--return-to-go`` array and the readers' windows both use it. A fragment's
  returns-to-go are exact: they only look forward.
* **Fragments.** An episode whose first rows are not in the store (it began in a
  checkpoint left out, or before a log that was missed) is a *fragment*. The table's
  ``first_step`` column (:data:`FIRST_STEP`) records the true step of each episode's
  first stored row: 0 for a whole episode, the number of steps played before it where
  the source tells, and :data:`UNKNOWN_STEP` (-1) where it does not.
  :func:`first_steps` is the one reader of it (stores written before it existed get
  it inferred: an episode after a cut one is unknown).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from atari_zarr.errors import InvalidArgumentError

__all__ = [
    "FIRST_STEP",
    "UNKNOWN_STEP",
    "EpisodeLedger",
    "EpisodeTable",
    "SourcePart",
    "checkpoint_summary",
    "episode_checkpoints",
    "episode_columns",
    "episode_table",
    "first_steps",
    "return_to_go",
    "source_parts",
]


#: Column of the episode table: the true step of each episode's first stored row.
FIRST_STEP = "first_step"
#: ``first_step`` of a fragment whose true start the source does not tell.
UNKNOWN_STEP = -1


@dataclass(frozen=True)
class EpisodeTable:
    """The per-episode table of a store (attribute ``episodes``), parsed and checked.

    Attributes
    ----------
    length : numpy.ndarray
        ``(E,)`` int64, every one positive: rows of each episode, in row order.
    terminated : numpy.ndarray
        ``(E,)`` bool: the episode ended in a terminal state (else it was cut).
    returns : numpy.ndarray or None
        ``(E,)`` float64 sum of each episode's rewards, None where the table has none.
    first_step : numpy.ndarray or None
        ``(E,)`` int64 true step of each episode's first stored row (0: whole;
        :data:`UNKNOWN_STEP`: a fragment of unknown start), None where the table has
        none (see :func:`first_steps`).
    """

    length: np.ndarray
    terminated: np.ndarray
    returns: np.ndarray | None
    first_step: np.ndarray | None = None

    @classmethod
    def from_steps(
        cls, episode: np.ndarray, terminated: np.ndarray, reward: np.ndarray
    ) -> EpisodeTable:
        """The table of per-step arrays (an unfinished recording has no other).

        Examples
        --------
        >>> t = EpisodeTable.from_steps(np.array([0, 0, 1]), np.array([0, 1, 0], bool),
        ...                             np.array([1.0, 2.0, 5.0]))
        >>> t.length.tolist(), t.terminated.tolist(), t.returns.tolist()
        ([2, 1], [True, False], [3.0, 5.0])
        """
        episode = np.asarray(episode)
        new = np.r_[True, episode[1:] != episode[:-1]] if episode.size else np.zeros(0, bool)
        starts = np.flatnonzero(new).astype(np.int64)
        length = np.diff(np.r_[starts, episode.size]).astype(np.int64)
        ends = starts + length - 1
        rewards = np.asarray(reward, dtype=np.float64)
        returns = np.add.reduceat(rewards, starts) if starts.size else np.zeros(0)
        return cls(length, np.asarray(terminated, dtype=bool)[ends], returns)

    @property
    def fragment(self) -> np.ndarray:
        """``(E,)`` bool: the episode's first rows are not in the store."""
        if self.first_step is None:
            return np.zeros(len(self), dtype=bool)
        return self.first_step != 0

    def __len__(self) -> int:
        return int(self.length.shape[0])

    @property
    def transitions(self) -> int:
        """Rows covered by the table (the sum of the lengths)."""
        return int(self.length.sum())

    @cached_property
    def ends(self) -> np.ndarray:
        """Last row of every episode."""
        return np.cumsum(self.length) - 1

    @cached_property
    def starts(self) -> np.ndarray:
        """First row of every episode."""
        return self.ends - self.length + 1


def _column(raw: Any, kinds: str, dtype: str) -> np.ndarray | None:
    """``raw`` as a 1-d array of ``dtype`` when its values are of ``kinds``, else None."""
    try:
        arr = np.asarray(raw)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in kinds):
        return None
    return arr.astype(dtype)


def episode_table(meta: Mapping[str, Any], n: int | None = None) -> EpisodeTable | None:
    """The per-episode table in a store's attributes, or None when it is absent or unusable.

    This is the one parser of ``meta["episodes"]`` (``{"length": [...],
    "terminated": [...], "return": [...]}``). Usable means well formed: lists of the
    same length, integer lengths all positive, boolean flags, numeric returns (when
    there), and, when ``n`` is given, lengths adding up to the ``n`` rows in use.
    Otherwise the per-step arrays are the truth.

    Parameters
    ----------
    meta : mapping
        The ``atari_zarr`` attributes (:func:`atari_zarr.layout.read_metadata`).
    n : int, optional
        Rows the table must cover.

    Returns
    -------
    EpisodeTable or None

    Examples
    --------
    >>> meta = {"episodes": {"length": [3, 2], "terminated": [True, False], "return": [1, 0]}}
    >>> table = episode_table(meta, 5)
    >>> table.starts.tolist(), table.ends.tolist(), table.returns.tolist()
    ([0, 3], [2, 4], [1.0, 0.0])
    >>> episode_table(meta, 6) is None  # does not cover 6 rows
    True
    """
    table = meta.get("episodes")
    if not isinstance(table, Mapping) or "length" not in table or "terminated" not in table:
        return None
    length = _column(table["length"], "iu", "int64")
    terminated = _column(table["terminated"], "b", "bool")
    returns = None
    if "return" in table:
        returns = _column(table["return"], "iuf", "float64")
        if returns is None or returns.shape != getattr(length, "shape", None):
            return None
    if length is None or terminated is None or length.shape != terminated.shape:
        return None
    if (length <= 0).any() or (n is not None and int(length.sum()) != n):
        return None
    first = first_steps(meta, EpisodeTable(length, terminated, returns))
    return EpisodeTable(length, terminated, returns, first)


def first_steps(meta: Mapping[str, Any], table: EpisodeTable) -> np.ndarray | None:
    """The true step of each episode's first stored row, or None for a table of nothing.

    The store's ``first_step`` column where it has one (integers, -1 or more). A
    converted store written before that column existed gets it inferred from what
    the table does tell: an episode that follows a cut one (the data jumped there, or
    a checkpoint ended) is :data:`UNKNOWN_STEP`, and so is the first one unless the
    store starts at the source's first checkpoint; the others are whole (0). A
    recording's episodes are all whole.

    Examples
    --------
    >>> table = EpisodeTable(np.array([3, 2, 4]), np.array([False, True, True]), None)
    >>> first_steps({"episodes": {"first_step": [0, 120, 0]}}, table).tolist()
    [0, 120, 0]
    >>> meta = {"conversion": {"checkpoints": [{"suffix": 2, "first_transition": 0,
    ...                                         "transitions": 9}]}}
    >>> first_steps(meta, table).tolist()  # inferred: an older store
    [-1, -1, 0]
    """
    episodes = meta.get("episodes")
    if isinstance(episodes, Mapping) and FIRST_STEP in episodes:
        column = _column(episodes[FIRST_STEP], "iu", "int64")
        if column is not None and column.shape == table.length.shape and (column >= -1).all():
            return column
    out = np.zeros(len(table), dtype=np.int64)
    parts = source_parts(meta)
    if not parts or not len(table):
        return out
    out[1:][~table.terminated[:-1]] = UNKNOWN_STEP
    if parts[0].checkpoint != 0:
        out[0] = UNKNOWN_STEP
    return out


class EpisodeLedger:
    """Per-episode lengths, returns and end kinds, accumulated from consecutive rows.

    Feed it the rows of a stream in order, in blocks of any size
    (:meth:`feed`); each row that is terminated or truncated closes the running
    episode. :meth:`cut` closes the running episode early, as truncated (a gap in
    the data, a limit, the end of the data).

    Returns are float64 sums built in one fixed order, so the same rows in the
    same blocks always give the same bits (stores are written byte for byte the
    same every time): within a block, the rewards of each episode's stretch are
    summed by numpy (``rewards[a:b].sum()`` in float64); the running return adds
    those partial sums in block order, starting from ``0.0``. Another split of the
    rows may round differently in the last bits; compare such returns with a
    tolerance (``verify`` does).

    Attributes
    ----------
    length : list of int
        Rows of every closed episode.
    returns : list of float
        Sum of the rewards of every closed episode.
    terminated : list of bool
        Whether each closed episode ended in a terminal state (else it was cut).
    current_length : int
        Rows of the running episode so far (0: none is running).
    current_return : float
        Sum of its rewards so far.

    Examples
    --------
    >>> ledger = EpisodeLedger()
    >>> ledger.feed([1.0, 0.0, 2.0], terminated=[False, True, False])
    array([1])
    >>> ledger.current_length, ledger.current_return
    (1, 2.0)
    >>> ledger.feed([0.5], truncated=[True])  # closes at offset 0 of this block
    array([0])
    >>> ledger.feed([1.0, 1.0])  # no end: the episode keeps running
    array([], dtype=int64)
    >>> ledger.cut()  # e.g. a gap follows: it ends here, truncated
    True
    >>> ledger.as_attributes()
    {'length': [2, 2, 2], 'return': [1.0, 2.5, 2.0], 'terminated': [True, False, False]}
    >>> ledger.counts()
    {'episodes': 3, 'terminated_episodes': 1, 'truncated_episodes': 2}
    """

    def __init__(self) -> None:
        self.length: list[int] = []
        self.returns: list[float] = []
        self.terminated: list[bool] = []
        self.current_length = 0
        self.current_return = 0.0

    def __len__(self) -> int:
        """Closed episodes so far."""
        return len(self.length)

    @property
    def transitions(self) -> int:
        """Rows of the closed episodes (the running one not included)."""
        return sum(self.length)

    def feed(
        self,
        rewards: ArrayLike,
        terminated: ArrayLike | None = None,
        truncated: ArrayLike | None = None,
    ) -> np.ndarray:
        """Account for a block of consecutive rows.

        Parameters
        ----------
        rewards : array-like of float
            The reward of every row of the block.
        terminated, truncated : array-like of bool, optional
            Per-row flags (default: all False). A row with either closes its
            episode; the episode counts as terminated when ``terminated`` is set
            on that row (it wins over ``truncated``).

        Returns
        -------
        numpy.ndarray
            Offsets within the block of the rows that closed an episode; the
            episodes closed are the last ``len(offsets)`` of the lists.

        Raises
        ------
        InvalidArgumentError
            The flags are not one per reward.
        """
        rew = np.asarray(rewards, dtype=np.float64).reshape(-1)
        n = rew.shape[0]
        term = np.zeros(n, dtype=bool) if terminated is None else np.asarray(terminated, bool)
        ends = term if truncated is None else term | np.asarray(truncated, dtype=bool)
        if term.shape != (n,) or ends.shape != (n,):
            raise InvalidArgumentError(
                f"episode accounting got {n} rewards but flags of shape {ends.shape}; "
                f"expected one reward and one flag per row"
            )
        offsets = np.flatnonzero(ends)
        start = 0
        for end in offsets.tolist():
            self.current_length += end - start + 1
            self.current_return += float(rew[start : end + 1].sum())
            self._close(bool(term[end]))
            start = end + 1
        self.current_length += n - start
        self.current_return += float(rew[start:].sum())
        return offsets

    def cut(self) -> bool:
        """Close the running episode as truncated; False when none is running."""
        if not self.current_length:
            return False
        self._close(False)
        return True

    def keep(self, episodes: int) -> None:
        """Forget every episode after the first ``episodes`` closed ones, and the running one."""
        del self.length[episodes:]
        del self.returns[episodes:]
        del self.terminated[episodes:]
        self.current_length = 0
        self.current_return = 0.0

    def _close(self, terminated: bool) -> None:
        self.length.append(self.current_length)
        self.returns.append(self.current_return)
        self.terminated.append(terminated)
        self.current_length = 0
        self.current_return = 0.0

    def table(self) -> EpisodeTable:
        """The closed episodes as an :class:`EpisodeTable`."""
        return EpisodeTable(
            np.asarray(self.length, dtype=np.int64),
            np.asarray(self.terminated, dtype=bool),
            np.asarray(self.returns, dtype=np.float64),
        )

    def as_attributes(self) -> dict[str, list[Any]]:
        """The closed episodes as the ``episodes`` attribute of a store."""
        return {
            "length": list(self.length),
            "return": list(self.returns),
            "terminated": list(self.terminated),
        }

    def counts(self) -> dict[str, int]:
        """Episode counts of the ``counts`` attribute of a store."""
        n = len(self.length)
        term = sum(self.terminated)
        return {"episodes": n, "terminated_episodes": term, "truncated_episodes": n - term}


def return_to_go(reward: np.ndarray, done: np.ndarray, carry: float = 0.0) -> np.ndarray:
    """Undiscounted return-to-go of consecutive rows, episodes ending where ``done``.

    Parameters
    ----------
    reward : numpy.ndarray
        Rewards of rows ``a .. b - 1``.
    done : numpy.ndarray of bool
        The episode ends after the row.
    carry : float
        Return-to-go of row ``b`` if row ``b - 1`` does not end its episode (the
        rows continue an episode that goes on past the block).

    Returns
    -------
    numpy.ndarray of float64

    Examples
    --------
    >>> return_to_go(np.array([1.0, 0.0, 1.0, 1.0, 2.0]), np.array([0, 0, 1, 0, 0], bool), 10.0)
    array([ 2.,  1.,  1., 13., 12.])
    """
    reward = np.asarray(reward, dtype=np.float64)
    n = len(reward)
    suffix = np.zeros(n + 1)
    suffix[:n] = np.cumsum(reward[::-1])[::-1]  # suffix[i] = sum(reward[i:])
    ends = np.flatnonzero(done)
    nxt = np.searchsorted(ends, np.arange(n))  # first episode end at or after each row
    has_end = nxt < len(ends)
    end = ends[np.minimum(nxt, len(ends) - 1)] if len(ends) else np.zeros(n, dtype=np.int64)
    return np.where(has_end, suffix[:n] - suffix[end + 1], suffix[:n] + carry)


@dataclass(frozen=True)
class SourcePart:
    """A run of consecutive rows that came from one source checkpoint (or shard).

    Attributes
    ----------
    checkpoint : int
        DQN Replay checkpoint suffix, or RL Unplugged shard index (one checkpoint each).
    first_row : int
        First row of the store it became.
    rows : int
        Rows it became.
    """

    checkpoint: int
    first_row: int
    rows: int


def source_parts(meta: Mapping[str, Any]) -> list[SourcePart]:
    """The checkpoints (or shards) a converted store's rows came from, in row order.

    Read from the conversion attributes (``conversion.checkpoints`` of DQN Replay
    stores, ``conversion.shards`` of RL Unplugged stores); parts that gave no row are
    left out. A recording has none: an empty list.

    Examples
    --------
    >>> meta = {"conversion": {"checkpoints": [
    ...     {"suffix": 3, "first_transition": 0, "transitions": 10},
    ...     {"suffix": 4, "first_transition": 10, "transitions": 0}]}}
    >>> source_parts(meta)
    [SourcePart(checkpoint=3, first_row=0, rows=10)]
    """
    conversion = meta.get("conversion")
    if not isinstance(conversion, Mapping):
        return []
    entries = conversion.get("checkpoints", conversion.get("shards"))
    if not isinstance(entries, list):
        return []
    parts = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            return []
        values = (
            entry.get("suffix", entry.get("shard")),
            entry.get("first_transition"),
            entry.get("transitions"),
        )
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return []
        label, first, rows = (int(v) for v in values)  # type: ignore[arg-type]
        if rows > 0:
            parts.append(SourcePart(label, first, rows))
    return parts


def episode_checkpoints(meta: Mapping[str, Any], table: EpisodeTable) -> np.ndarray | None:
    """The checkpoint (or shard) holding each episode's first row; None for a recording.

    RL Unplugged stores record it per episode (``checkpoint_idx``); DQN Replay stores
    per checkpoint (:func:`source_parts`).

    Examples
    --------
    >>> meta = {"conversion": {"checkpoints": [
    ...     {"suffix": 0, "first_transition": 0, "transitions": 4},
    ...     {"suffix": 1, "first_transition": 4, "transitions": 4}]}}
    >>> table = EpisodeTable(np.array([3, 3, 2]), np.array([True, True, False]), None)
    >>> episode_checkpoints(meta, table).tolist()
    [0, 0, 1]
    """
    episodes = meta.get("episodes")
    if isinstance(episodes, Mapping) and "checkpoint_idx" in episodes:
        column = _column(episodes["checkpoint_idx"], "iu", "int64")
        if column is not None and column.shape == table.length.shape:
            return column
    parts = source_parts(meta)
    if not parts:
        return None
    firsts = np.array([p.first_row for p in parts], dtype=np.int64)
    labels = np.array([p.checkpoint for p in parts], dtype=np.int64)
    at = np.searchsorted(firsts, table.starts, side="right") - 1
    return labels[np.clip(at, 0, len(labels) - 1)]


def episode_columns(meta: Mapping[str, Any], table: EpisodeTable) -> dict[str, np.ndarray]:
    """The columns of a store's per-episode table, as ``AtariZarrDataset.episode_table`` shows.

    ``first_row``, ``length``, ``return``, ``terminated``, ``checkpoint`` (where the
    store knows it), the source's own returns (RL Unplugged: ``source_return``,
    ``source_clipped_return``), then ``first_step`` and ``fragment``
    (:func:`first_steps`).
    """
    n = len(table)
    out: dict[str, np.ndarray] = {
        "first_row": table.starts,
        "length": table.length,
        "return": table.returns if table.returns is not None else np.full(n, np.nan),
        "terminated": table.terminated,
    }
    checkpoints = episode_checkpoints(meta, table)
    if checkpoints is not None:
        out["checkpoint"] = checkpoints
    episodes = meta.get("episodes")
    if isinstance(episodes, Mapping):
        for source, name in (
            ("episode_return", "source_return"),
            ("clipped_episode_return", "source_clipped_return"),
        ):
            raw = episodes.get(source)
            if isinstance(raw, list) and len(raw) == n:
                out[name] = np.array([np.nan if v is None else float(v) for v in raw])
    first = table.first_step if table.first_step is not None else first_steps(meta, table)
    if first is not None:
        out[FIRST_STEP] = first
        out["fragment"] = first != 0
    return out


def checkpoint_summary(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Episode statistics per source checkpoint (RL Unplugged: per shard): a learning curve.

    A DQN Replay run's data follows its agent from random play (checkpoint 0) to the
    end of training (checkpoint 50); these rows show it. Each episode counts where its
    first row came from. A recording has one group (``checkpoint`` None). Returns are
    the game's scores where the source recorded them (RL Unplugged's unclipped
    ``episode_return``; ``returns`` is then ``"source"``), else the sums of the stored
    rewards (DQN Replay's are clipped to [-1, 1], as its agent saw them; ``"rewards"``).

    The statistics cover whole episodes played to their end only: an episode that was
    cut (by the data's end, a gap, a limit) or that is a fragment (its first steps
    are not in the store) would pull the mean down, so it is counted apart.

    Returns
    -------
    list of dict
        In checkpoint order: ``checkpoint``, ``episodes`` (all of them),
        ``complete`` (those the statistics cover), ``cut`` and ``fragments`` (left
        out), ``return_mean``, ``return_median``, ``return_q25``, ``return_q75``,
        ``return_min``, ``return_max`` (None without returns or complete episodes),
        ``length_mean`` and ``returns`` (what the returns are). Empty without a
        usable episode table.

    Examples
    --------
    >>> meta = {"episodes": {"length": [3, 3, 2], "terminated": [True, True, False],
    ...                      "return": [1.0, 3.0, -1.0]},
    ...         "conversion": {"checkpoints": [
    ...             {"suffix": 0, "first_transition": 0, "transitions": 6},
    ...             {"suffix": 1, "first_transition": 6, "transitions": 2}]}}
    >>> [(r["checkpoint"], r["episodes"], r["complete"], r["return_mean"])
    ...  for r in checkpoint_summary(meta)]
    [(0, 2, 2, 2.0), (1, 1, 0, None)]
    """
    table = episode_table(meta)
    if table is None or len(table) == 0:
        return []
    labels = episode_checkpoints(meta, table)
    groups = [None] if labels is None else sorted(set(labels.tolist()))
    source = episode_columns(meta, table).get("source_return")
    kind = "source" if source is not None and np.isfinite(source).all() else "rewards"
    all_returns = source if kind == "source" else table.returns
    whole = table.terminated & ~table.fragment
    rows = []
    for label in groups:
        sel = np.ones(len(table), bool) if labels is None else labels == label
        use = sel & whole
        returns = None if all_returns is None else all_returns[use].astype(np.float64)

        def stat(fn: Any, values: np.ndarray | None = returns) -> float | None:
            return None if values is None or not values.size else float(fn(values))

        rows.append(
            {
                "checkpoint": label,
                "episodes": int(sel.sum()),
                "complete": int(use.sum()),
                "cut": int((sel & ~table.terminated & ~table.fragment).sum()),
                "fragments": int((sel & table.fragment).sum()),
                "return_mean": stat(np.mean),
                "return_median": stat(np.median),
                "return_q25": stat(lambda v: np.quantile(v, 0.25)),
                "return_q75": stat(lambda v: np.quantile(v, 0.75)),
                "return_min": stat(np.min),
                "return_max": stat(np.max),
                "length_mean": float(table.length[use].mean()) if use.any() else None,
                "returns": kind,
            }
        )
    return rows
