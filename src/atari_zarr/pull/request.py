"""What a loader asks for, and what exists: the games table and the request grammar.

:data:`GAMES` is the one table of what can be pulled, from TFDS's
``rlu_atari_checkpoints_ordered`` builder: 46 games, runs 1 to 5, 50 shards a run (49
for Carnival, Gravitar and StarGunner), and the size of a run where TFDS's catalog
gives it. A :class:`Request` is a dataset id as the loaders spell it, parsed once; a
:class:`Resolved` is where one was found. The cache's root (:func:`cache_home`) is where
both a lookup and a pull start.

Examples
--------
>>> GAMES["Pong"].shards, Request.parse("space_invaders", run=2).dataset_id
(50, 'SpaceInvaders/2')
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from atari_zarr.arguments import parse_indices, spans
from atari_zarr.catalog import CatalogEntry
from atari_zarr.commands import command_line
from atari_zarr.errors import InvalidArgumentError, StoreNotFoundError
from atari_zarr.storage.paths import HOME_ENV, cache_home, is_url, join
from atari_zarr.subsets import PLAYED, Subset

__all__ = [
    "GAMES",
    "HOME_ENV",
    "MIRRORS_ENV",
    "RUNS",
    "Download",
    "Game",
    "Request",
    "Resolved",
    "cache_home",
    "check_home",
    "game_name",
    "pullable",
]

#: Roots of stores read in place before anything is pulled, comma-separated.
MIRRORS_ENV = "ATARI_ZARR_MIRRORS"
#: Runs of every game.
RUNS = (1, 2, 3, 4, 5)
#: Digits of the longest run id taken (no source numbers its runs past a few).
MAX_RUN_DIGITS = 18

#: ``True`` fetches what is missing, ``"force"`` fetches again, ``False`` never does.
Download = bool | Literal["force"]


@dataclass(frozen=True)
class Game:
    """One game of RL Unplugged's ordered Atari episodes."""

    name: str
    #: Shards (checkpoints) of each run.
    shards: int = 50
    #: GiB of each run 1..5 in TFDS's catalog (None where it was not taken from there).
    sizes: tuple[float | None, ...] = (None,) * 5


_SHORT = ("Carnival", "Gravitar", "StarGunner")  # 49 shards: TFDS's _SHORT_GAMES
# GiB of a run: TFDS's catalog page of rlu_atari_checkpoints_ordered ("Dataset size") for
# Alien 1-3, Krull and KungFuMaster; run 1 of Breakout, Pong, Qbert and UpNDown as the
# project's notes on the source round them. The rest is listed from the source on demand.
_SIZES: dict[str, tuple[float | None, ...]] = {
    "Alien": (74.09, 74.32, 74.21, None, None),
    "Breakout": (31.0, None, None, None, None),
    "Krull": (90.54, 90.60, 90.46, 90.57, 90.58),
    "KungFuMaster": (62.07, 61.93, 61.96, 62.19, 62.18),
    "Pong": (21.0, None, None, None, None),
    "Qbert": (97.0, None, None, None, None),
    "UpNDown": (100.0, None, None, None, None),
}
#: The one table of what can be pulled: TFDS's ``_GAMES``, with shards and sizes.
GAMES: dict[str, Game] = {
    name: Game(name, 49 if name in _SHORT else 50, _SIZES.get(name, (None,) * 5))
    for name in (
        "Alien Amidar Assault Asterix Atlantis BankHeist BattleZone BeamRider Boxing "
        "Breakout Carnival Centipede ChopperCommand CrazyClimber DemonAttack DoubleDunk "
        "Enduro FishingDerby Freeway Frostbite Gopher Gravitar Hero IceHockey Jamesbond "
        "Kangaroo Krull KungFuMaster MsPacman NameThisGame Phoenix Pong Pooyan Qbert "
        "Riverraid RoadRunner Robotank Seaquest SpaceInvaders StarGunner TimePilot UpNDown "
        "VideoPinball WizardOfWor YarsRevenge Zaxxon"
    ).split()
}


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def game_name(name: str) -> str:
    """The game as the stores spell it, from any of the spellings loaders use.

    ``"pong"``, ``"Pong"``, ``"space_invaders"`` (d3rlpy), ``"space-invaders"``
    (d4rl-atari) and ``"SpaceInvaders"`` are the same game. A name not in
    :data:`GAMES` is returned as it was given in CamelCase, so a store of another
    game in the cache or a mirror is still found.

    Examples
    --------
    >>> game_name("space_invaders"), game_name("ms-pacman"), game_name("Pong")
    ('SpaceInvaders', 'MsPacman', 'Pong')
    """
    squashed = _squash(name)
    for game in GAMES:
        if _squash(game) == squashed:
            return game
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[_\-\s]+", str(name)) if p)


def check_home(home: str) -> None:
    """Refuse a local cache root that exists and is not a directory, in one line (a
    write under it would fail as "creating a directory" deep inside).

    Examples
    --------
    >>> import tempfile
    >>> check_home(tempfile.mkdtemp())
    >>> check_home(tempfile.mkstemp()[1])
    Traceback (most recent call last):
        ...
    atari_zarr.errors.InvalidArgumentError: ... is a file, not a directory: ...
    """
    if not is_url(home) and os.path.exists(home) and not os.path.isdir(home):
        raise InvalidArgumentError(
            f"the cache {home} is a file, not a directory: expected the directory the "
            f"stores are pulled into (--home, ${HOME_ENV}). Pass another one, or move the "
            f"file away."
        )


@dataclass(frozen=True)
class Request:
    """What a loader asks for: a game's run, whole or in part.

    Make one with :meth:`parse`. ``checkpoints`` are shard indices (checkpoint ``i`` of
    the run is shard ``i``); ``subset`` a rule of :mod:`atari_zarr.subsets`.
    """

    game: str
    run: str
    checkpoints: tuple[int, ...] | None = None
    subset: Subset | None = None
    #: The game as the loader spelled it (``"space_invaders"``), for files named that way.
    spelled: str = field(default="", compare=False, repr=False)

    @classmethod
    def parse(
        cls,
        dataset_id: str,
        *,
        run: int | str | None = None,
        checkpoints: str | Iterable[int] | None = None,
        fraction: float | None = None,
        order: str = PLAYED,
        subset: Subset | None = None,
        seed: int = 0,
    ) -> Request:
        """A request from the ids loaders take.

        ``dataset_id`` is TorchRL's ``"Pong/5"``, or a game alone (d3rlpy's
        ``"pong"``) with ``run`` (d3rlpy's ``index + 1``; default 1). ``fraction``
        is d3rlpy's subset, taken in ``order`` (default ``"played"``: a prefix of every
        checkpoint, the part of a shard that is fetched; ``"random"``: d3rlpy's
        shuffle, which needs every shard whole).

        Raises
        ------
        InvalidArgumentError
            A malformed id, run or checkpoint list, or two subsets.
        """
        text = str(dataset_id).strip()
        game, sep, found = text.partition("/")
        if sep:
            if run is not None and str(run) != found:
                raise InvalidArgumentError(
                    f"{text!r} names run {found} and run={run!r} another; pass one"
                )
            run = found
        if not game or "/" in str(found) or (sep and not found):
            raise InvalidArgumentError(
                f"dataset id {text!r} is not 'Game/run' (e.g. 'Pong/5') or a game name "
                f"(e.g. 'pong'); expected one of those"
            )
        run_s = _run_text(run, text)
        chosen: tuple[int, ...] | None = None
        known = GAMES.get(game_name(game))
        if checkpoints is not None:
            where = f"checkpoints of {text}"
            chosen = tuple(parse_indices(checkpoints, where, known.shards if known else None))
            if known is not None and chosen == tuple(range(known.shards)):
                chosen = None  # every checkpoint is the whole run: one store, not two
        if fraction is not None:
            if subset is not None:
                raise InvalidArgumentError(
                    f"fraction={fraction!r} and subset={subset!r} choose two subsets of {text}; "
                    f"pass one"
                )
            subset = Subset.fraction_of(fraction, seed=seed, order=order, where=text)
        if known is not None:
            _check_buffers(subset, chosen, known, text)
        return cls(game_name(game), str(int(run_s)), chosen, subset, spelled=game)

    @property
    def dataset_id(self) -> str:
        """``"Game/run"``, as TorchRL names it."""
        return f"{self.game}/{self.run}"

    @property
    def asked_game(self) -> str:
        """The game as the loader spelled it (else as the stores spell it)."""
        return self.spelled or self.game

    @property
    def whole(self) -> bool:
        """The whole run is asked for."""
        return self.checkpoints is None and self.subset is None

    @property
    def label(self) -> str:
        """The name of the part asked for (``""`` for a whole run), for the cache."""
        parts: list[str] = []
        if self.checkpoints is not None:
            parts.append("checkpoints-" + spans(self.checkpoints))
        subset = self.subset
        if subset is not None:
            if subset.rule == "fraction":
                # the float exactly (its shortest repr): two fractions never share a path
                assert subset.fraction is not None
                parts.append(f"fraction-{float(subset.fraction)!r}")
                if subset.order == PLAYED:
                    parts.append("played")
            else:
                parts.append(
                    f"dt-{subset.num_buffers}-{subset.num_steps}-{subset.trajectories_per_buffer}"
                )
            if subset.seed:
                parts.append(f"seed{subset.seed}")
        return "-".join(parts)

    def root(self, home: str) -> str:
        """The root under ``home`` whose ``{Game}/{run}.zarr`` holds this request."""
        return join(home, "subsets", self.label) if self.label else home

    def describe(self) -> str:
        """One line for messages."""
        what = [self.dataset_id]
        if self.checkpoints is not None:
            what.append(f"checkpoints {spans(self.checkpoints)}")
        if self.subset is not None:
            what.append(self.subset.describe())
        return ", ".join(what)

    def command(self, **where: Any) -> str:
        """The ``atari-zarr pull`` command that fetches this request (``where``: more
        options, such as ``home=``, given after the request's own)."""
        subset = self.subset
        options: dict[str, Any] = {
            "checkpoints": None if self.checkpoints is None else spans(self.checkpoints)
        }
        if subset is not None and subset.rule == "fraction":
            options["fraction"] = subset.fraction
            if subset.order != PLAYED:
                options["fraction_order"] = subset.order
        elif subset is not None:
            options.update(
                dt_buffers=subset.num_buffers,
                dt_steps=subset.num_steps,
                dt_trajectories=subset.trajectories_per_buffer,
            )
        if subset is not None and subset.seed:
            options["subset_seed"] = subset.seed
        return command_line("pull", self.dataset_id, **options, **where)

    def source_checkpoints(self) -> tuple[int, ...] | None:
        """The shards a pull converts (None: all): those asked for, or for the Decision
        Transformer's rule only its last ``num_buffers`` (the only ones it draws from)."""
        subset = self.subset
        if self.checkpoints is not None or subset is None or subset.rule == "fraction":
            return self.checkpoints
        shards = pullable(self).shards
        assert subset.num_buffers is not None
        return tuple(range(max(0, shards - subset.num_buffers), shards))


def _run_text(run: int | str | None, text: str) -> str:
    """``run`` as the digits of a positive integer, or one line (a run id too long to be
    one is refused before Python's limit on the digits it converts)."""
    try:
        run_s = str(1 if run is None else run).strip()
    except ValueError:  # an int past the digits str() converts: no run id
        run_s = ""
    if not (run_s.isascii() and run_s.isdigit()) or len(run_s.lstrip("0")) > MAX_RUN_DIGITS:
        shown = run_s if len(run_s) <= 20 else f"{run_s[:8]}...({len(run_s)} characters)"
        raise InvalidArgumentError(
            f"run {shown or type(run).__name__!r} of {text[:40]!r} is not a positive integer of "
            f"at most {MAX_RUN_DIGITS} digits; RL Unplugged's runs are 1 to 5 (d3rlpy's index "
            f"0 to 4)"
        )
    if int(run_s) < 1:
        raise InvalidArgumentError(
            f"run {run!r} of {text!r} is not a positive integer; RL Unplugged's runs are "
            f"1 to 5 (d3rlpy's index 0 to 4)"
        )
    return run_s


def _check_buffers(
    subset: Subset | None, checkpoints: tuple[int, ...] | None, game: Game, text: str
) -> None:
    """Refuse the Decision Transformer's rule asking for more checkpoints than the run
    has (the table knows how many), before anything is fetched."""
    if subset is None or subset.num_buffers is None:
        return
    there = game.shards if checkpoints is None else len(checkpoints)
    if subset.num_buffers > there:
        of = "checkpoints asked" if checkpoints is not None else f"checkpoints of {game.name}"
        raise InvalidArgumentError(
            f"num_buffers {subset.num_buffers} (--dt-buffers) for {text} is more than the "
            f"{there} {of}; expected at most {there}"
        )


def pullable(request: Request) -> Game:
    """The game of ``request`` in :data:`GAMES`, with its run and checkpoints checked:
    what a pull can fetch, or one line saying why nothing can be."""
    game = GAMES.get(request.game)
    if game is None:
        close = difflib.get_close_matches(request.game, list(GAMES), n=3, cutoff=0.5)
        raise StoreNotFoundError(
            f"{request.game} is not a game of RL Unplugged's Atari episodes (expected one of "
            f"its {len(GAMES)} games{', e.g. ' + ', '.join(close) if close else ''}): nothing "
            f"can be pulled for {request.dataset_id}. List them with `atari-zarr ls "
            f"--available`, or pass root= a directory of stores you converted."
        )
    if int(request.run) not in RUNS:
        raise StoreNotFoundError(
            f"{request.dataset_id}: RL Unplugged has runs 1 to 5 of {game.name}, not "
            f"{request.run}; expected one of those (d3rlpy's index 0 to 4)."
        )
    if request.checkpoints and max(request.checkpoints) >= game.shards:
        raise InvalidArgumentError(
            f"{request.dataset_id}: checkpoints {spans(request.checkpoints)} asked, but "
            f"{game.name} has {game.shards} shards (0 to {game.shards - 1}); choose among those"
        )
    _check_buffers(request.subset, request.checkpoints, game, request.dataset_id)
    return game


@dataclass(frozen=True)
class Resolved:
    """Where a request was found: a store, and what it holds of the request."""

    #: The store's URL.
    url: str
    #: The root it lies under (``{root}/{Game}/{run}.zarr``).
    root: str
    #: fsspec options to read it.
    storage_options: dict[str, Any] = field(default_factory=dict)
    #: ``"cache"``, ``"local"`` (the loader's own root), ``"mirror"``, ``"pulled"``, or
    #: ``"given"`` (a store the loader named).
    origin: str = "cache"
    #: The store holds exactly what was asked; False: it holds the whole run, of which
    #: the reader takes the part asked (the checkpoints, the subset's rule).
    exact: bool = True
    #: The root's catalog entry of the store, to check when it is opened.
    entry: CatalogEntry | None = None
