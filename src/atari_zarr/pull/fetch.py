"""A pull: RL Unplugged's public copy converted into the cache, with its locking and wait.

:func:`pull` converts only the shards a request needs and, where its rule takes a prefix
of each checkpoint (:meth:`~atari_zarr.subsets.Subset.prefix_rows`), only that prefix of
each shard's bytes, each byte fetched once. It is a conversion: it resumes, locks the
store (a second process waits for the first), and DataLoader workers and DDP ranks other
than 0 on their machine (:func:`~atari_zarr.place.current_place`) only wait for it
(``docs/guides/pull.md``: what is safe, and how). :func:`available` lists what can be
pulled.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from atari_zarr.arguments import spans
from atari_zarr.catalog import refresh_catalog, store_state
from atari_zarr.errors import (
    RemoteAccessError,
    SourceChangedError,
    SourceNotFoundError,
    StoreExistsError,
    StoreIncompleteError,
    StoreLockedError,
    StoreNotFoundError,
)
from atari_zarr.layout import store_path
from atari_zarr.place import current_place
from atari_zarr.pull.request import (
    GAMES,
    MIRRORS_ENV,
    RUNS,
    Game,
    Request,
    Resolved,
    cache_home,
    check_home,
    pullable,
)
from atari_zarr.storage.deadline import TIMEOUT_ENV, Timeout, resolve_timeout
from atari_zarr.storage.paths import join, redact

__all__ = [
    "POLL_S",
    "RLU_STORAGE_OPTIONS",
    "RLU_URL",
    "TELL_S",
    "available",
    "pull",
    "source_sizes",
]

log = logging.getLogger("atari_zarr")

#: RL Unplugged's ordered Atari episodes: ``{Game}/run_{r}-{i:05d}-of-{N:05d}``.
RLU_URL = "gs://rl_unplugged/atari_episodes_ordered"
#: The bucket is public: no credentials.
RLU_STORAGE_OPTIONS: dict[str, Any] = {"token": "anon"}
#: Seconds between two looks at a store another process is pulling.
POLL_S = 1.0
#: Seconds between two "still waiting" messages.
TELL_S = 60.0


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
    from atari_zarr.conversion.workdir import WorkDir

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
            # the knob the caller turned: the environment's only when none was given
            more = (
                f"${TIMEOUT_ENV}"
                if timeout == "default"
                else "a larger timeout (--timeout, or the loader's timeout=)"
            )
            raise StoreNotFoundError(
                f"{request.describe()}: {who} waited {limit:g} s for rank 0 (or the main "
                f"process) to pull it into {redact(url)}, but no process is pulling it: rank 0 "
                f"did not start the pull, or its pull failed (its error says why). Pull it "
                f"before starting the job with `{request.command()}`, or allow more time with "
                f"{more}."
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
    part_of_whole: bool = True,
) -> Resolved:
    """Convert ``request`` from RL Unplugged's copy into the cache (unless it is there).

    Only the shards the request needs are read (:meth:`Request.source_checkpoints`),
    and of each only the prefix a prefix rule needs; each byte is fetched once (the
    scans keep the frames for the write pass). The store is ``{home}/{Game}/{run}.zarr``
    for a whole run, ``{home}/subsets/{label}/{Game}/{run}.zarr`` otherwise; a part of a
    run whose whole run is in the cache is that store (``exact=False``: the reader takes
    the part), and nothing is fetched; ``part_of_whole=False`` converts the part's own
    store even then (for a part no reader's call takes from a whole run).

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
    from atari_zarr.conversion.converter import convert  # dask: only for a pull

    game = pullable(request)
    cache = cache_home(home)
    check_home(cache)
    root = request.root(cache)
    options = dict(home_options or {})
    url = store_path(root, request.game, request.run)
    if not overwrite and store_state(url, options, timeout=timeout) == "complete":
        return Resolved(url, root, options)
    whole = store_path(cache, request.game, request.run)
    if (
        not overwrite
        and part_of_whole
        and whole != url
        and store_state(whole, options, timeout=timeout) == "complete"
    ):
        # the whole run in the cache serves every part of it: nothing is fetched
        return Resolved(whole, cache, options, exact=False)
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
            # the run as checked is the run converted: nothing is listed again
            run = _check_source(request, game, game_url, source_options, checkpoints, timeout)
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
                listed=[run],
                # the command that pulls it again (a damaged store's remedy), credentials out
                command=request.command(
                    home=redact(cache),
                    source=None if source == RLU_URL else redact(source.rstrip("/")),
                ),
            )
            _check_converted(store.url, options, request, game, checkpoints, timeout)
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
) -> Any:
    """Refuse a pull whose source lacks a shard it needs (one listing, before any fetch):
    a run pulled whole is whole, and a part has every checkpoint it names. The run as
    listed, which the conversion then reads."""
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
        return run
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
        f"shards {spans(needed)} of {game.shards}. Nothing was fetched (a partial run is "
        f"never stored as the run): {advice}."
    )


def _check_converted(
    url: str,
    options: dict[str, Any],
    request: Request,
    game: Game,
    checkpoints: tuple[int, ...] | None,
    timeout: Timeout,
) -> None:
    """What was converted is what the request needs, before it is served: every shard
    asked for (a whole run: every shard, none missing)."""
    from atari_zarr.opening import open_store

    source = open_store(url, options, timeout=timeout).metadata.get("source") or {}
    needed = list(range(game.shards) if checkpoints is None else checkpoints)
    selected = sorted(int(i) for i in source.get("shards_selected") or [])
    missing = list(source.get("shards_missing") or []) if checkpoints is None else []
    if selected != needed or missing:
        raise SourceChangedError(
            f"{redact(url)} holds shards {spans(selected)} of {request.describe()}, with "
            f"{spans(missing) if missing else 'none'} missing from its source; expected "
            f"shards {spans(needed)}. The source changed during the pull: run "
            f"`{request.command()} --force` to pull it again."
        )


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
    home_options: dict[str, Any] | None = None,
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
                    "cached": store_state(url, home_options, timeout=timeout) == "complete",
                }
            )
    return rows


_source_sizes = source_sizes
