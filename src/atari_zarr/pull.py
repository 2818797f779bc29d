"""Dataset ids to stores: the local cache, mirrors, and RL Unplugged's public copy.

The loaders this project replaces took a dataset id and downloaded what was missing:
TorchRL's ``AtariDQNExperienceReplay("Pong/5")``, d3rlpy's
``get_atari_transitions("pong", fraction=0.01, index=0)``, the Decision Transformer's
``create_dataset(..., game, ...)``. Their bucket is gone, but the same runs are
public as RL Unplugged's ordered episodes (:data:`RLU_URL`). :func:`resolve` turns
such an id, a :class:`Request`, into a store, looking in this order:

1. **the cache**, ``$ATARI_ZARR_HOME`` (default ``~/.cache/atari_zarr``): a whole run
   is ``{Game}/{run}.zarr``, a part of one (some checkpoints, a subset)
   ``subsets/{label}/{Game}/{run}.zarr``, where the label spells the request
   (:attr:`Request.label`); a whole run in the cache serves any part of it;
2. **mirrors** (``mirrors=``, or ``$ATARI_ZARR_MIRRORS``, comma-separated): roots of
   stores, local or any fsspec URL, asked with one request each (their
   ``catalog.json``, else the store's ``zarr.json``) and read in place, never copied;
3. **RL Unplugged's public copy**, converted into the cache (:func:`pull`): only the
   shards the request needs and, where the rule takes a prefix of each checkpoint
   (:meth:`~atari_zarr.subsets.Subset.prefix_rows`), only that prefix of each shard's
   bytes. Each shard's bytes are fetched once, streamed into the conversion.

``download`` says how far to go: ``True`` fetches what is missing, ``"force"`` fetches
again, ``False`` never touches the network (only the cache and local mirrors), and
says in one line what is missing and the command that fetches it.

A pull is a conversion: it resumes after a crash, locks the store so that two
processes pulling the same id convert it once (the second waits, and says so), and
never presents an unfinished store as complete. DataLoader workers and DDP ranks
other than 0 on their machine (:func:`~atari_zarr.place.current_place`: ``LOCAL_RANK``,
else ``torch.distributed``'s rank, else ``RANK``) never start a pull: they wait for the
store to be complete, and give up in one line once no process has been pulling it for
``timeout`` seconds.

:data:`GAMES` is the one table of what exists, from TFDS's
``rlu_atari_checkpoints_ordered`` builder: 46 games, runs 1 to 5, 50 shards a run (49
for Carnival, Gravitar and StarGunner), and the size of a run where TFDS's catalog
gives it.

Examples
--------
>>> request = Request.parse("pong", run=5, fraction=0.01)
>>> request.dataset_id, request.label
('Pong/5', 'fraction-0.01-played')
>>> request.command()
'atari-zarr pull Pong/5 --fraction 0.01'
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from atari_zarr.catalog import (
    CatalogEntry,
    complete_stores,
    find_store,
    refresh_catalog,
    store_state,
)
from atari_zarr.commands import command_line
from atari_zarr.conversion.converter import convert
from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    RemoteAccessError,
    SourceNotFoundError,
    StoreExistsError,
    StoreIncompleteError,
    StoreLockedError,
    StoreNotFoundError,
)
from atari_zarr.layout import store_path
from atari_zarr.place import current_place
from atari_zarr.storage.deadline import TIMEOUT_ENV, Timeout, resolve_timeout
from atari_zarr.storage.paths import is_url, join, redact
from atari_zarr.subsets import PLAYED, Subset

__all__ = [
    "GAMES",
    "HOME_ENV",
    "MIRRORS_ENV",
    "RLU_STORAGE_OPTIONS",
    "RLU_URL",
    "Download",
    "Game",
    "Request",
    "Resolved",
    "available",
    "cache_home",
    "format_available",
    "game_name",
    "loading_line",
    "mirror_roots",
    "pull",
    "resolve",
]

log = logging.getLogger("atari_zarr")

#: RL Unplugged's ordered Atari episodes: ``{Game}/run_{r}-{i:05d}-of-{N:05d}``.
RLU_URL = "gs://rl_unplugged/atari_episodes_ordered"
#: The bucket is public: no credentials.
RLU_STORAGE_OPTIONS: dict[str, Any] = {"token": "anon"}
#: Where pulled stores go (default ``~/.cache/atari_zarr``).
HOME_ENV = "ATARI_ZARR_HOME"
#: Roots of stores read in place before anything is pulled, comma-separated.
MIRRORS_ENV = "ATARI_ZARR_MIRRORS"
#: Runs of every game.
RUNS = (1, 2, 3, 4, 5)
#: Seconds between two looks at a store another process is pulling.
POLL_S = 1.0
#: Seconds between two "still waiting" messages.
TELL_S = 60.0

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


def cache_home(home: str | os.PathLike[str] | None = None) -> str:
    """The cache's root: ``home``, else ``$ATARI_ZARR_HOME``, else ``~/.cache/atari_zarr``.

    A leading ``~`` of a local path is the user's home directory.

    Examples
    --------
    >>> cache_home("~/stores") == os.path.expanduser("~/stores")
    True
    >>> cache_home("gs://bucket/~x")
    'gs://bucket/~x'
    """
    if home is not None:
        found = os.fspath(home)
    else:
        found = os.environ.get(HOME_ENV, "").strip() or os.path.join("~", ".cache", "atari_zarr")
    # "~/x" is the user's home, never a directory named "~" in the working directory
    return found if is_url(found) else os.path.expanduser(found)


def mirror_roots(mirrors: str | Sequence[str] | None = None) -> list[str]:
    """The mirrors asked: ``mirrors`` (a list, or one comma-separated string), else
    ``$ATARI_ZARR_MIRRORS``.

    Examples
    --------
    >>> mirror_roots("gs://a/atari, https://b.org/atari")
    ['gs://a/atari', 'https://b.org/atari']
    """
    if mirrors is None:
        mirrors = os.environ.get(MIRRORS_ENV, "")
    if isinstance(mirrors, str):
        mirrors = mirrors.split(",")
    return [m.strip().rstrip("/") for m in mirrors if m and m.strip()]


def _spans(values: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2,5"``."""
    out: list[str] = []
    items = sorted(set(values))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


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
        run_s = str(1 if run is None else run).strip()
        if not run_s.isdigit() or int(run_s) < 1:
            raise InvalidArgumentError(
                f"run {run!r} of {text!r} is not a positive integer; RL Unplugged's runs are "
                f"1 to 5 (d3rlpy's index 0 to 4)"
            )
        chosen: tuple[int, ...] | None = None
        known = GAMES.get(game_name(game))
        if checkpoints is not None:
            chosen = _parse_checkpoints(checkpoints, text, known.shards if known else None)
            if known is not None and chosen == tuple(range(known.shards)):
                chosen = None  # every checkpoint is the whole run: one store, not two
        if fraction is not None:
            if subset is not None:
                raise InvalidArgumentError(
                    f"fraction={fraction!r} and subset={subset!r} choose two subsets of {text}; "
                    f"pass one"
                )
            subset = Subset.fraction_of(fraction, seed=seed, order=order, where=text)
        return cls(game_name(game), str(int(run_s)), chosen, subset)

    @property
    def dataset_id(self) -> str:
        """``"Game/run"``, as TorchRL names it."""
        return f"{self.game}/{self.run}"

    @property
    def whole(self) -> bool:
        """The whole run is asked for."""
        return self.checkpoints is None and self.subset is None

    @property
    def label(self) -> str:
        """The name of the part asked for (``""`` for a whole run), for the cache."""
        parts: list[str] = []
        if self.checkpoints is not None:
            parts.append("checkpoints-" + _spans(self.checkpoints))
        subset = self.subset
        if subset is not None:
            if subset.rule == "fraction":
                parts.append(f"fraction-{subset.fraction:g}")
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
            what.append(f"checkpoints {_spans(self.checkpoints)}")
        if self.subset is not None:
            what.append(self.subset.describe())
        return ", ".join(what)

    def command(self) -> str:
        """The ``atari-zarr pull`` command that fetches this request."""
        subset = self.subset
        options: dict[str, Any] = {
            "checkpoints": None if self.checkpoints is None else _spans(self.checkpoints)
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
        return command_line("pull", self.dataset_id, **options)

    def source_checkpoints(self) -> tuple[int, ...] | None:
        """The shards a pull converts (None: all): those asked for, or for the Decision
        Transformer's rule only its last ``num_buffers`` (the only ones it draws from)."""
        subset = self.subset
        if self.checkpoints is not None or subset is None or subset.rule == "fraction":
            return self.checkpoints
        shards = _game(self).shards
        assert subset.num_buffers is not None
        return tuple(range(max(0, shards - subset.num_buffers), shards))


#: Shard indices have five digits in RL Unplugged's names: no run has more shards.
MAX_SHARDS = 100_000


def _parse_checkpoints(
    spec: str | Iterable[int], where: str, shards: int | None = None
) -> tuple[int, ...]:
    """Shard indices from ``"0-9,49"`` or a list; each below ``shards`` (when known), and
    never more than :data:`MAX_SHARDS`, checked before a range is spelled out."""
    limit = MAX_SHARDS if shards is None else shards
    pairs: list[tuple[int, int]] = []
    try:
        if isinstance(spec, str):
            for piece in spec.split(","):
                a, dash, b = piece.strip().partition("-")
                pairs.append((int(a), int(b)) if dash else (int(a), int(a)))
        else:
            pairs = [(int(v), int(v)) for v in spec]
    except (TypeError, ValueError):
        pairs = []
    if not pairs or min(a for a, _ in pairs) < 0 or any(b < a for a, b in pairs):
        raise InvalidArgumentError(
            f"checkpoints {spec!r} of {where} are not shard indices; expected e.g. '0-9,49' "
            f"or [0, 1] (shard i holds checkpoint i, 0 to 49)"
        )
    top = max(b for _, b in pairs)
    if top >= limit:
        raise InvalidArgumentError(
            f"checkpoints {spec!r} of {where} go up to {top}, but the run has "
            f"{'at most ' if shards is None else ''}{limit} shards (0 to {limit - 1}); "
            f"choose among those"
        )
    return tuple(sorted({v for a, b in pairs for v in range(a, b + 1)}))


def _game(request: Request) -> Game:
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
            f"{request.dataset_id}: checkpoints {_spans(request.checkpoints)} asked, but "
            f"{game.name} has {game.shards} shards (0 to {game.shards - 1}); choose among those"
        )
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
    #: ``"cache"``, ``"mirror"`` or ``"pulled"``.
    origin: str = "cache"
    #: The store holds exactly what was asked; False: it holds the whole run, of which
    #: the reader takes the part asked (the checkpoints, the subset's rule).
    exact: bool = True
    #: The root's catalog entry of the store, to check when it is opened.
    entry: CatalogEntry | None = None


def _local(root: str) -> bool:
    return not is_url(root)


def _find(
    request: Request, root: str, options: dict[str, Any], origin: str, timeout: Timeout
) -> Resolved | None:
    """The request under ``root``: the store of exactly what is asked, else the whole run."""
    name = request.dataset_id
    if not request.whole:
        found = find_store(request.root(root), name, options, timeout=timeout)
        if found is not None:
            return Resolved(found[0], request.root(root), options, origin, True, found[1])
    found = find_store(root, name, options, timeout=timeout)
    if found is not None:
        return Resolved(found[0], root, options, origin, request.whole, found[1])
    return None


def resolve(
    request: Request,
    *,
    home: str | os.PathLike[str] | None = None,
    home_options: dict[str, Any] | None = None,
    mirrors: str | Sequence[str] | None = None,
    download: Download = True,
    mirror_options: dict[str, Any] | None = None,
    source: str = RLU_URL,
    source_options: dict[str, Any] | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    progress: bool = False,
    timeout: Timeout = "default",
) -> Resolved:
    """Find the store of ``request``: the cache, then mirrors, then a pull.

    Parameters
    ----------
    request : Request
        What is asked for.
    home : str or path, optional
        The cache (default :func:`cache_home`), local or a URL.
    home_options : dict, optional
        fsspec options for a ``home`` URL.
    mirrors : str or list of str, optional
        Roots of stores read in place (default ``$ATARI_ZARR_MIRRORS``).
    download : bool or "force"
        ``True``: pull what is missing; ``"force"``: pull again, into the cache, even
        when it is there; ``False``: never touch the network.
    mirror_options : dict, optional
        fsspec options for the mirrors (e.g. ``{"token": "anon"}``).
    source, source_options :
        Where a pull reads (default RL Unplugged's public bucket, anonymously).
    scheduler, workers, progress, timeout :
        As :func:`~atari_zarr.convert` takes them, for a pull.

    Raises
    ------
    StoreNotFoundError
        ``download=False`` and the request is neither in the cache nor in a local
        mirror; or a game or run RL Unplugged does not have.
    RemoteAccessError
        The source or a mirror cannot be reached: the message names the URL and
        says how to work without it.

    Examples
    --------
    >>> # dest_root: a directory holding the converted fixture store Pong/1
    >>> found = resolve(Request.parse("Pong/1"), home=dest_root, download=False)
    >>> found.origin, found.url.endswith("Pong/1.zarr")
    ('cache', True)
    """
    if download not in (True, False, "force"):
        raise InvalidArgumentError(
            f"download={download!r} for {request.dataset_id}; expected True (fetch what is "
            f"missing), 'force' (fetch again) or False (never touch the network)"
        )
    root = cache_home(home)
    if download != "force":
        found = _find(request, root, dict(home_options or {}), "cache", timeout)
        if found is not None:
            return found
        roots = mirror_roots(mirrors)
        for mirror in roots:
            if download is False and not _local(mirror):
                continue
            try:
                found = _find(request, mirror, dict(mirror_options or {}), "mirror", timeout)
            except RemoteAccessError as exc:
                log.warning("mirror %s not reachable, skipped: %s", redact(mirror), exc)
                continue
            if found is not None:
                return found
        if download is False:
            where = [redact(root)] + [redact(m) for m in roots if _local(m)]
            try:
                _game(request)
                advice = (
                    f"download=False never touches the network: fetch it with "
                    f"`{request.command()}`, or pass download=True."
                )
            except AtariZarrError as exc:  # nothing to pull: say why, advise no pull
                advice = f"It cannot be pulled either: {exc}"
            raise StoreNotFoundError(
                f"{request.describe()} is not in {' nor in '.join(where)}: expected a complete "
                f"store {store_path(request.root(root), request.game, request.run)}"
                f"{_close_matches(request, root, home_options, timeout)}. {advice}"
            )
    return pull(
        request,
        home=root,
        home_options=home_options,
        overwrite=download == "force",
        source=source,
        source_options=source_options,
        scheduler=scheduler,
        workers=workers,
        progress=progress,
        timeout=timeout,
    )


def _close_matches(
    request: Request, root: str, options: dict[str, Any] | None, timeout: Timeout
) -> str:
    """``"; close matches there: [...], of N stores"``: the stores under ``root`` whose
    names are near the request's (for a message; empty when ``root`` cannot be listed)."""
    try:
        available = complete_stores(root, options, timeout=timeout)
    except (OSError, ValueError):
        return ""
    close = difflib.get_close_matches(request.dataset_id, available, n=5, cutoff=0.6)
    return f"; close matches there: {close or 'none'}, of {len(available)} stores"


def _follower() -> str | None:
    """Who this process is when it must not start a pull itself (None: it may)."""
    place = current_place()
    return None if place.pulls else place.describe()


def _wait(
    url: str, options: dict[str, Any], request: Request, who: str | None, timeout: Timeout
) -> None:
    """Wait until ``url`` is complete, or (``who`` None) until nobody holds its lock.

    A follower (``who``) waits as long as some process holds the lock; once nobody
    has held it for ``timeout`` seconds (rank 0 never started the pull, or its pull
    failed), it gives up in one line.
    """
    work = WorkDir(url, options, timeout=timeout)
    limit = resolve_timeout(timeout)
    told = -TELL_S
    idle_since = time.monotonic()
    while True:
        if store_state(url, options, timeout=timeout) == "complete":
            return
        holder = work.holder()
        if holder is None and who is None:
            return  # released, or its holder died: the caller converts (and resumes)
        now = time.monotonic()
        if holder is not None:
            idle_since = now
        elif limit is not None and now - idle_since > limit:
            raise StoreNotFoundError(
                f"{request.describe()}: {who} waited {limit:g} s for rank 0 (or the main "
                f"process) to pull it into {redact(url)}, but no process is pulling it: rank 0 "
                f"did not start the pull, or its pull failed (its error says why). Pull it "
                f"before starting the job with `{request.command()}`, or allow more time with "
                f"${TIMEOUT_ENV}."
            )
        if now - told >= TELL_S:
            if who is not None:
                log.warning(
                    "%s: %s waits for rank 0 (or the main process) to pull %s into %s; pull it "
                    "before starting the job with `%s` to skip this wait",
                    request.dataset_id,
                    who,
                    request.describe(),
                    url,
                    request.command(),
                )
            else:
                assert holder is not None
                log.warning(
                    "%s is being pulled into %s by another process (pid %s on host %s); "
                    "waiting for it to finish",
                    request.describe(),
                    url,
                    holder.get("pid"),
                    holder.get("host"),
                )
            told = now
        time.sleep(POLL_S)


def pull(
    request: Request,
    *,
    home: str | os.PathLike[str] | None = None,
    home_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    source: str = RLU_URL,
    source_options: dict[str, Any] | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    progress: bool = True,
    timeout: Timeout = "default",
) -> Resolved:
    """Convert ``request`` from RL Unplugged's copy into the cache (unless it is there).

    Only the shards the request needs are read (:meth:`Request.source_checkpoints`),
    and of each only the prefix a prefix rule needs; each byte is fetched once (the
    scans keep the frames for the write pass). The store is ``{home}/{Game}/{run}.zarr``
    for a whole run, ``{home}/subsets/{label}/{Game}/{run}.zarr`` otherwise.

    A pull that finds another process pulling the same store waits for it; one that
    finds an unfinished store resumes it. DataLoader workers and DDP ranks other than
    0 never pull: they wait until the store is complete.

    Raises
    ------
    RemoteAccessError
        The source cannot be reached (offline, refused): the message names the URL
        and how to work without it.
    SourceFormatError
        A shard is damaged: the message names the shard and the record; the store
        stays unfinished (never presented as complete) and a later pull resumes it.
    StoreWriteError
        The cache's disk is full: run the same pull again once there is room.
    """
    game = _game(request)
    root = request.root(cache_home(home))
    options = dict(home_options or {})
    url = store_path(root, request.game, request.run)
    if not overwrite and store_state(url, options, timeout=timeout) == "complete":
        return Resolved(url, root, options)
    who = _follower()
    if who is not None:
        _wait(url, options, request, who, timeout)
        return Resolved(url, root, options)
    game_url = join(source.rstrip("/"), game.name)
    checkpoints = request.source_checkpoints()
    if source_options is None:  # anonymous Cloud Storage, for the public copy and its kin
        source_options = RLU_STORAGE_OPTIONS if source.startswith(("gs://", "gcs://")) else {}
    source_options = dict(source_options)
    while True:
        try:
            _check_source(request, game, game_url, source_options, checkpoints, timeout)
            [store] = convert(
                game_url,
                root,
                runs=[request.run],
                checkpoints=None if checkpoints is None else list(checkpoints),
                subset=request.subset,
                source_kind="rl-unplugged",
                overwrite=overwrite,
                storage_options=options,
                source_storage_options=source_options,
                scheduler=scheduler,
                workers=workers,
                progress=progress,
                timeout=timeout,
            )
        except StoreExistsError:  # finished by another process meanwhile
            return Resolved(url, root, options)
        except StoreIncompleteError:
            if overwrite:
                raise
            # begun from other objects (a shard republished since): never mix the two
            log.warning(
                "%s: the source changed since the unfinished pull into %s began; starting over",
                request.describe(),
                redact(url),
            )
            overwrite = True
            continue
        except StoreLockedError:
            _wait(url, options, request, None, timeout)
            if store_state(url, options, timeout=timeout) == "complete" and not overwrite:
                return Resolved(url, root, options)
            overwrite = False  # what the other process wrote meanwhile is fresh enough
            continue
        except RemoteAccessError as exc:
            raise type(exc)(
                f"{request.describe()} could not be fetched from {redact(game_url)}: {exc} "
                f"To work without it: pass root= a directory of stores you converted, or a "
                f"mirror (mirrors= or ${MIRRORS_ENV}); or run `{request.command()}` on a "
                f"machine that reaches it and copy {redact(root)}."
            ) from None
        # a root someone indexed lists what was just pulled (available_datasets, ls)
        refresh_catalog(root, options, timeout=timeout)
        return Resolved(store.url, root, options, origin="pulled")


def _check_source(
    request: Request,
    game: Game,
    game_url: str,
    options: dict[str, Any],
    checkpoints: tuple[int, ...] | None,
    timeout: Timeout,
) -> None:
    """Refuse a pull whose source lacks a shard it needs (one listing, before any fetch):
    a run pulled whole is whole, and a part has every checkpoint it names."""
    from atari_zarr.sources.registry import get_kind

    kind = get_kind("rl-unplugged")
    try:
        [run] = kind.find_runs(
            game_url, runs=[request.run], storage_options=options, timeout=timeout
        )
    except FileNotFoundError:
        run = None
    needed = range(game.shards) if checkpoints is None else checkpoints
    present = set() if run is None or run.num_shards != game.shards else set(run.suffixes)
    missing = [i for i in needed if i not in present]
    if not missing:
        return
    assert kind.part_file is not None
    name = join(redact(game_url), kind.part_file(request.run, missing[0], game.shards))
    more = f" (and {len(missing) - 1} more of its {len(needed)})" if len(missing) > 1 else ""
    there = [i for i in needed if i in present]
    advice = f"read the run from a mirror that holds it (mirrors= or ${MIRRORS_ENV})"
    if there and request.whole:
        part = Request(request.game, request.run, tuple(there))
        advice = f"pull the shards that are there with `{part.command()}`, or {advice}"
    raise SourceNotFoundError(
        f"{request.describe()} needs {name}{more}, which the source does not hold: expected "
        f"shards {_spans(needed)} of {game.shards}. Nothing was fetched (a partial run is "
        f"never stored as the run): {advice}."
    )


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


def cache_root(found: Resolved) -> str:
    """The cache a store found in it belongs to (its root, less ``subsets/{label}``)."""
    parts = found.root.rstrip("/").rsplit("/", 2)
    return parts[0] if len(parts) == 3 and parts[1] == "subsets" else found.root


def source_sizes(
    games: Iterable[str],
    *,
    source: str = RLU_URL,
    source_options: dict[str, Any] | None = None,
    timeout: Timeout = "default",
) -> dict[tuple[str, str], int]:
    """Bytes of every run of ``games`` at ``source``, listed (one request per game)."""
    from atari_zarr.sources.registry import get_kind
    from atari_zarr.storage.filesystem import get_fs

    run_of = get_kind("rl-unplugged").run_of_file
    assert run_of is not None

    out: dict[tuple[str, str], int] = {}
    for game in games:
        url = join(source.rstrip("/"), game)
        options = dict(RLU_STORAGE_OPTIONS if source_options is None else source_options)
        fs, path = get_fs(url, options, timeout=timeout)
        try:
            entries = fs.ls(path.rstrip("/"), detail=True)
        except FileNotFoundError:
            continue
        for entry in entries:
            name = str(entry.get("name", "")).rstrip("/").rsplit("/", 1)[-1]
            run = run_of(name)
            if run is not None and entry.get("size") is not None:
                out[(game, run)] = out.get((game, run), 0) + int(entry["size"])
    return out


def available(
    *,
    home: str | os.PathLike[str] | None = None,
    source_sizes: bool = False,
    source: str = RLU_URL,
    source_options: dict[str, Any] | None = None,
    timeout: Timeout = "default",
) -> list[dict[str, Any]]:
    """What :func:`pull` can fetch: a row per game and run of :data:`GAMES`.

    Each row: ``id`` (``"Pong/5"``), ``game``, ``run``, ``shards``, ``gib`` (TFDS's
    figure, None where it was not taken), ``source_bytes`` (listed from ``source``
    with ``source_sizes=True``, else None), ``cached`` (the cache holds the whole run).

    Examples
    --------
    >>> rows = available(home="/nonexistent")
    >>> len(rows), rows[0]["id"], rows[0]["gib"], rows[0]["cached"]
    (230, 'Alien/1', 74.09, False)
    """
    root = cache_home(home)
    listed = (
        _source_sizes(GAMES, source=source, source_options=source_options, timeout=timeout)
        if source_sizes
        else {}
    )
    rows = []
    for game in GAMES.values():
        for run in RUNS:
            url = store_path(root, game.name, str(run))
            rows.append(
                {
                    "id": f"{game.name}/{run}",
                    "game": game.name,
                    "run": run,
                    "shards": game.shards,
                    "gib": game.sizes[run - 1],
                    "source_bytes": listed.get((game.name, str(run))),
                    "cached": store_state(url, timeout=timeout) == "complete",
                }
            )
    return rows


_source_sizes = source_sizes


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
