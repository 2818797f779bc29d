"""What to take from a run, whatever its kind: :class:`Selection`.

Parts (DQN Replay checkpoints, RL Unplugged shards) by number or preset, and at most
how many transitions and episodes; a subset of the episodes
(:mod:`atari_zarr.subsets`). Each kind's planner applies it
(:func:`atari_zarr.sources.dqn_replay.selection.build_plan`, the RL Unplugged
planner), and a store records it in its ``selection`` attribute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atari_zarr.arguments import parse_indices, spans
from atari_zarr.errors import InvalidArgumentError, SourceNotFoundError
from atari_zarr.subsets import Subset

__all__ = [
    "CHECKPOINT_PRESETS",
    "Selection",
    "check_limit",
    "expand_presets",
    "parse_checkpoints",
]

#: d4rl-atari's dataset names -> checkpoint suffixes (its ``start_epoch..last_epoch``): early
#: training, the middle, the end of training, each one checkpoint of 1M transitions.
CHECKPOINT_PRESETS: dict[str, list[int]] = {"mixed": [1], "medium": [10], "expert": [50]}


def expand_presets(
    spec: str | Iterable[int] | None, presets: Mapping[str, Iterable[int]] | None = None
) -> str | Iterable[int] | None:
    """Replace preset names in a checkpoint selection by their suffixes.

    Parameters
    ----------
    spec : str, iterable of int or None
        A selection as :func:`parse_checkpoints` takes it, where comma-separated
        parts may also be ``mixed``, ``medium`` or ``expert``.
    presets : mapping, optional
        The suffixes of each preset name (default :data:`CHECKPOINT_PRESETS`, DQN
        Replay's 51 checkpoints; a run of another length has its own).

    Examples
    --------
    >>> expand_presets("expert")
    '50'
    >>> expand_presets("mixed,40-42")
    '1,40-42'
    >>> expand_presets([3, 4])
    [3, 4]
    """
    if not isinstance(spec, str) or spec.strip().lower() == "all":
        return spec
    presets = CHECKPOINT_PRESETS if presets is None else presets
    parts: list[str] = []
    for part in spec.split(","):
        key = part.strip().lower()
        if key in presets:
            parts.extend(str(s) for s in presets[key])
        else:
            parts.append(part.strip())
    return ",".join(parts)


def parse_checkpoints(
    spec: str | Iterable[int] | None, available: Sequence[int], where: str = "--checkpoints"
) -> list[int] | None:
    """Turn a checkpoint selection into suffixes.

    Parameters
    ----------
    spec : str, iterable of int or None
        ``None`` or ``"all"`` for everything; otherwise what
        :func:`~atari_zarr.arguments.parse_indices` reads: ``"0-9,50"`` or a list of ints.
    available : sequence of int
        Suffixes present in the source.
    where : str
        What ``spec`` was passed as, for messages.

    Raises
    ------
    InvalidArgumentError
        A part of ``spec`` is neither a suffix nor a range.
    SourceNotFoundError
        A suffix asked for is not in ``available``.

    Examples
    --------
    >>> parse_checkpoints("0-2,5", range(10))
    [0, 1, 2, 5]
    >>> parse_checkpoints(None, range(3)) is None
    True
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return None
    chosen = parse_indices(spec, where)
    missing = sorted(set(chosen) - set(available))
    if missing:
        raise SourceNotFoundError(
            f"checkpoints {spans(missing)} were asked for but the source has "
            f"{spans(available)}; choose among those."
        )
    return chosen


def check_limit(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if int(value) < 1:
        raise InvalidArgumentError(
            f"{name} must be a positive number, got {value}; pass at least 1, or no limit."
        )
    return int(value)


@dataclass(frozen=True)
class Selection:
    """What to take from a run: checkpoints, and at most how many transitions and episodes.

    Parameters
    ----------
    checkpoints : str, iterable of int or None
        As :func:`parse_checkpoints` takes it, presets included (``"expert"``,
        ``"0-9,50"``, ``[1, 2]``); None or ``"all"``: every checkpoint.
    max_transitions, max_episodes : int, optional
        Limits applied by :func:`limit_plan` (None: no limit).
    subset : Subset, optional
        A subset of the episodes those give (:mod:`atari_zarr.subsets`: d3rlpy's
        fraction, Decision Transformer sampling), applied after the limits.

    Raises
    ------
    InvalidArgumentError
        A limit is not a positive number.

    Examples
    --------
    >>> sel = Selection("medium", max_transitions=1000)
    >>> sel.suffixes(range(12))
    [10]
    >>> sel.attributes()
    {'checkpoints': 'medium', 'max_transitions': 1000, 'max_episodes': None}
    >>> Selection.from_attributes(sel.attributes()) == sel
    True
    """

    checkpoints: str | Iterable[int] | None = None
    max_transitions: int | None = None
    max_episodes: int | None = None
    #: Episodes chosen from what the checkpoints and limits give (None: all).
    subset: Subset | None = None

    def __post_init__(self) -> None:
        # Normalised so that a selection and its recorded attributes compare equal.
        spec: Any = self.checkpoints
        if spec is not None and not isinstance(spec, str):
            object.__setattr__(self, "checkpoints", tuple(int(s) for s in spec))
        for name in ("max_transitions", "max_episodes"):
            object.__setattr__(self, name, check_limit(getattr(self, name), name))

    def suffixes(self, available: Sequence[int]) -> list[int] | None:
        """The checkpoints chosen among ``available`` (None: all of them)."""
        return parse_checkpoints(expand_presets(self.checkpoints), available)

    def attributes(self) -> dict[str, Any]:
        """The selection as recorded in a store's ``selection`` attribute."""
        spec = self.checkpoints
        out: dict[str, Any] = {
            "checkpoints": spec if spec is None or isinstance(spec, str) else list(spec),
            "max_transitions": self.max_transitions,
            "max_episodes": self.max_episodes,
        }
        if self.subset is not None:  # stores of whole runs record what they always did
            out["subset"] = self.subset.attributes()
        return out

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any]) -> Selection:
        """The selection a store recorded (:meth:`attributes`)."""
        return cls(
            attrs.get("checkpoints"),
            attrs.get("max_transitions"),
            attrs.get("max_episodes"),
            Subset.from_attributes(attrs.get("subset")),
        )
