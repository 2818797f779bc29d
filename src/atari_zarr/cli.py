"""The ``atari-zarr`` command line: parse, call the library, print.

Errors raised on purpose by the library (every :class:`~atari_zarr.errors.AtariZarrError`)
are printed as one line on stderr with exit code 1; usage errors exit with 2
(argparse's convention), an interrupt with 130. Any other exception is a bug and
keeps its traceback.

Everything a verb writes (stdout, stderr, progress bars, log records at ``-v``,
tracebacks) goes through one redaction (:func:`~atari_zarr.redaction.redact`,
with the ``--storage-option`` values), so no credential of a URL or an option is
ever printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from atari_zarr._version import __version__
from atari_zarr.commands import command_line
from atari_zarr.errors import AtariZarrError, InvalidArgumentError
from atari_zarr.redaction import RedactRecords
from atari_zarr.storage.paths import parse_storage_options, redact

#: dopamine's episode limit (108,000 frames), the default of ``collect --max-episode-steps``.
_MAX_EPISODE_STEPS = 27_000


def _add_source_options(p: argparse.ArgumentParser) -> None:
    """``--source`` and ``--source-storage-option``: where RL Unplugged's episodes are
    (``-s`` is the cache's, or ROOT's)."""
    p.add_argument(
        "--source",
        default=None,
        metavar="URL",
        help="where RL Unplugged's episodes are (default gs://rl_unplugged/atari_episodes_ordered)",
    )
    p.add_argument(
        "--source-storage-option",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="fsspec option for the source (default token=anon)",
    )


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        "-s",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="fsspec option for URLs, repeatable (e.g. token=anon, endpoint_url=http://...)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        default=None,
        help="time each request to a remote store may take, retries included "
        "(default $ATARI_ZARR_TIMEOUT, else 60; 0 for no limit)",
    )


def _add_subset_options(p: argparse.ArgumentParser, order: str = "random") -> None:
    """The options of a subset (``convert`` and ``pull``): ``--fraction``, ``--dt-*``."""
    p.add_argument(
        "--fraction",
        type=float,
        metavar="F",
        help="d3rlpy's subset: from every checkpoint (shard), episodes until F x 1,000,000 "
        "transitions (a DQN Replay run: F x its capacity), the last one trimmed",
    )
    p.set_defaults(fraction_order_default=order)
    p.add_argument(
        "--fraction-order",
        choices=("random", "played"),
        help="the order --fraction takes each checkpoint's episodes in: random (d3rlpy's "
        "shuffle) or played (a prefix of every checkpoint: a remote shard is read only that "
        f"far) (default {order})",
    )
    p.add_argument(
        "--dt-buffers",
        type=int,
        metavar="N",
        help="Decision Transformer sampling: draw among the last N checkpoints (default 50 "
        "when any --dt-* is given)",
    )
    p.add_argument(
        "--dt-steps",
        type=int,
        metavar="N",
        help="Decision Transformer sampling: transitions to take (default 500000)",
    )
    p.add_argument(
        "--dt-trajectories",
        type=int,
        metavar="N",
        help="Decision Transformer sampling: whole trajectories taken per draw (default 10)",
    )
    p.add_argument(
        "--subset-seed",
        type=int,
        default=0,
        metavar="S",
        help="seed of the subset's random choices (default 0)",
    )


def _add_scheduler_options(p: argparse.ArgumentParser) -> None:
    """Where conversion tasks run (``convert``, ``pull``)."""
    p.add_argument(
        "--scheduler",
        metavar="S",
        help="synchronous, threads, processes (default; threads for a memory:// location, "
        "which lives in this process) or a dask.distributed scheduler address such as "
        "tcp://host:8786",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="workers of a local scheduler (default: one per core)",
    )


def _timeout(args: argparse.Namespace) -> float | None:
    """``--timeout``, else ``$ATARI_ZARR_TIMEOUT``, else 60 s; 0 for no limit."""
    from atari_zarr.storage.deadline import resolve_timeout, timeout_from_environment

    given = getattr(args, "timeout", None)
    return timeout_from_environment() if given is None else resolve_timeout(given)


def _scheduler(args: argparse.Namespace, *locations: str) -> str:
    """``--scheduler``, else the default for ``locations`` (processes; threads for a
    location in this process's memory)."""
    from atari_zarr.conversion.scheduling import default_scheduler

    given: str | None = args.scheduler
    return default_scheduler(locations) if given is None else given


def _cmd_convert(args: argparse.Namespace) -> int:
    from atari_zarr.conversion.converter import convert

    done = convert(
        args.source,
        args.dest,
        games=args.games,
        runs=args.runs,
        checkpoints=args.checkpoints,
        overwrite=args.overwrite,
        progress=not args.quiet and not args.no_progress,
        storage_options=parse_storage_options(args.storage_option),
        scheduler=_scheduler(args, args.source, args.dest),
        workers=args.workers,
        max_transitions=args.max_transitions,
        max_episodes=args.max_episodes,
        full_action_space=args.full_action_space,
        return_to_go=args.return_to_go,
        source_kind=args.source_kind,
        subset=_subset(args),
        timeout=_timeout(args),
    )
    if not args.quiet:
        for store in done:
            print(
                f"{store.game}/{store.run}: {store.transitions:,} transitions, "
                f"{store.episodes:,} episodes, {store.gaps} gaps -> {_shown(store.url)}"
            )
    if args.index:
        _write_index(args.dest, args, sizes=True)
    return 0


def _write_index(root: str, args: argparse.Namespace, *, sizes: bool) -> None:
    """``ROOT/catalog.json`` (``index``, ``convert --index``), and one line saying so."""
    from atari_zarr.catalog import CATALOG, write_catalog

    doc = write_catalog(
        root, parse_storage_options(args.storage_option), sizes=sizes, timeout=_timeout(args)
    )
    if not args.quiet:
        where = _shown(f"{root.rstrip('/')}/{CATALOG}")
        print(f"{len(doc['stores'])} complete stores -> {where}")


def _subset(args: argparse.Namespace) -> Any:
    """The subset the options ask for (None: every episode)."""
    from atari_zarr.subsets import Subset

    dt = [args.dt_buffers, args.dt_steps, args.dt_trajectories]
    if args.fraction is not None and any(v is not None for v in dt):
        raise InvalidArgumentError(
            "--fraction and --dt-buffers/--dt-steps/--dt-trajectories choose two different "
            "subsets; pass one rule"
        )
    if args.fraction is None and args.fraction_order is not None:
        raise InvalidArgumentError(
            f"--fraction-order {args.fraction_order} orders the episodes --fraction takes, and "
            f"no --fraction was given; pass --fraction F with it, or leave it out"
        )
    if args.fraction is not None:
        order = args.fraction_order or args.fraction_order_default
        return Subset.fraction_of(
            args.fraction, seed=args.subset_seed, order=order, where="--fraction"
        )
    if any(v is not None for v in dt):
        defaults = (50, 500_000, 10)  # kzl/decision-transformer's run_dt_atari.py
        return Subset.decision_transformer(
            *(d if v is None else v for v, d in zip(dt, defaults, strict=True)),
            seed=args.subset_seed,
            where="--dt-*",
        )
    return None


def _cmd_verify(args: argparse.Namespace) -> int:
    from atari_zarr.verify import verify_store

    report = verify_store(
        args.store,
        source=args.source,
        storage_options=parse_storage_options(args.storage_option),
        progress=not args.quiet and not args.no_progress,
        timeout=_timeout(args),
        workers=args.workers,
    )
    if not report.ok or not args.quiet:
        print(report.format(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


def _cmd_info(args: argparse.Namespace) -> int:
    import json

    from atari_zarr.info import format_info, store_info

    info = store_info(
        args.store, parse_storage_options(args.storage_option), timeout=_timeout(args)
    )
    print(
        json.dumps(info, indent=2)
        if args.json
        else format_info(info, episodes=args.episodes, checkpoints=args.checkpoints)
    )
    return 0


def _cmd_video(args: argparse.Namespace) -> int:
    from atari_zarr.explore.video import check_fps, check_scale, video_codec
    from atari_zarr.read.dataset import AtariZarrDataset

    # a suffix, a rate or a scale that cannot be written: said before anything is read
    gif = video_codec(args.out) == "gif"
    check_fps(args.fps, args.out, gif=gif)
    check_scale(args.scale, args.out)
    if args.quiet:
        from atari_zarr.ale import quiet_ale

        quiet_ale()  # the action names come from ale-py, which prints a banner
    ds = AtariZarrDataset(
        args.store,
        storage_options=parse_storage_options(args.storage_option),
        timeout=_timeout(args),
    )
    try:
        out = ds.episode_video(
            args.episode, args.out, scale=args.scale, fps=args.fps, caption=not args.no_caption
        )
    except IndexError as exc:  # the episode number: its message gives the valid range
        raise InvalidArgumentError(f"--episode {args.episode}: {exc}") from None
    if not args.quiet:
        print(f"episode {args.episode} of {_shown(ds.where)} -> {_shown(out)}")
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from atari_zarr.explore.viewer import view

    def say(url: str) -> None:
        print(
            url if args.quiet else f"viewer of {args.store} at {url} (Ctrl-C stops it)", flush=True
        )

    view(args.store, port=args.port, browser=not args.no_browser, print_url=say)
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from atari_zarr.ale import make_dqn_env, quiet_ale
    from atari_zarr.record.collector import collect

    if args.quiet:
        quiet_ale()
    # make_dqn_env parses --env (game_of_env_id), before anything is written.
    env = make_dqn_env(args.env, max_episode_steps=args.max_episode_steps)
    done = collect(
        env,
        args.dest,
        steps=args.steps,
        seed=args.seed,
        progress=not args.quiet and not args.no_progress,
        max_buffer_steps=args.buffer_steps,
        overwrite=args.overwrite,
        storage_options=parse_storage_options(args.storage_option),
        timeout=_timeout(args),
        command=command_line(
            "collect",
            args.dest,
            env=args.env,
            steps=args.steps,
            seed=args.seed,
            max_episode_steps=(
                None if args.max_episode_steps == _MAX_EPISODE_STEPS else args.max_episode_steps
            ),
            overwrite=True,  # what an unfinished recording needs to be made again
        ),
    )
    if not args.quiet:
        print(
            f"{done.transitions:,} transitions, {done.episodes:,} episodes -> {_shown(args.dest)}"
        )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from atari_zarr.demo import run_demo

    run_demo(
        args.dest,
        game=args.game,
        steps=args.steps,
        capacity=args.capacity,
        seed=args.seed,
        progress=not args.quiet and not args.no_progress,
        echo=not args.quiet,
        source_kind=args.source_kind,
        shards=args.shards,
    )
    return 0


def _cmd_index(args: argparse.Namespace) -> int:
    _write_index(args.root, args, sizes=not args.no_size)
    return 0


def _cmd_card(args: argparse.Namespace) -> int:
    from atari_zarr.explore.card import write_card

    where = write_card(
        args.root,
        parse_storage_options(args.storage_option),
        public_url=args.public_url,
        reader_options=parse_storage_options(args.reader_option, "--reader-option"),
        license=args.license,
        timeout=_timeout(args),
        overwrite=args.overwrite,
    )
    if not args.quiet:
        print(f"dataset card -> {_shown(where)}")
    return 0


def _cmd_publish(args: argparse.Namespace) -> int:
    from atari_zarr.publish import publish

    done = publish(
        args.root,
        args.repo,
        names=args.names or None,
        storage_options=parse_storage_options(args.storage_option),
        private=True if args.private else None,
        license=args.license,
        message=args.message,
        progress=not args.no_progress,
        overwrite=args.overwrite,
    )
    if not args.quiet:
        print(
            f"published {len(done.stores)} store{'s' if len(done.stores) != 1 else ''} "
            f"({done.files:,} files, {done.bytes / 2**20:,.1f} MiB; {done.commits} commit"
            f"{'s' if done.commits != 1 else ''}) -> {_shown(done.url)}"
        )
    return 0


def _cmd_pull(args: argparse.Namespace) -> int:
    from atari_zarr.listing import loading_line, takes_part
    from atari_zarr.pull import RLU_URL, Request, pull, resolve
    from atari_zarr.storage.paths import cache_home

    subset = _subset(args)
    requests = [
        Request.parse(
            dataset_id,
            run=None if args.index is None else args.index + 1,
            checkpoints=args.checkpoints,
            subset=subset,
        )
        for dataset_id in args.dataset_id
    ]
    options = parse_storage_options(args.storage_option)
    where: dict[str, Any] = {
        "home": args.home,
        "home_options": options,
        "source": args.source or RLU_URL,
        "source_options": parse_storage_options(
            args.source_storage_option, "--source-storage-option"
        )
        or None,
        "scheduler": _scheduler(args, cache_home(args.home), args.source or RLU_URL),
        "workers": args.workers,
        "progress": not args.quiet and not args.no_progress,
        "timeout": _timeout(args),
    }
    for request in requests:  # each run's shards spread over the scheduler's workers
        # as the drop-ins resolve it: the cache, $ATARI_ZARR_MIRRORS, then the public copy
        found = resolve(
            request,
            mirror_options=options,
            download="force" if args.force else True,
            **where,
        )
        if not found.exact and not takes_part(request):
            # a whole run serves it, but no reader's call takes this part from one
            found = pull(request, part_of_whole=False, **where)
        line = loading_line(request, found, home_given=args.home is not None)
        if args.quiet:  # what opens the part: its store, else the line that takes it
            print(_shown(found.url) if found.exact else line)
            continue
        if found.exact:
            print(f"{request.describe()} -> {_shown(found.url)}")
        else:
            print(
                f"{request.describe()} -> taken from the whole run {_shown(found.url)} "
                f"({found.origin}; nothing fetched) by the line below"
            )
        print(line)
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:

    from atari_zarr.catalog import list_stores
    from atari_zarr.info import format_store_list

    if args.available:
        return _ls_available(args)
    if args.root is None:
        raise InvalidArgumentError(
            "ls needs ROOT (a directory or URL of stores), or --available for what "
            "`atari-zarr pull` can fetch"
        )
    rows = list_stores(
        args.root,
        parse_storage_options(args.storage_option),
        sizes=not args.no_size,
        timeout=_timeout(args),
        use_catalog=not args.no_index,
    )
    return _print_rows(args, rows, "url", format_store_list)


def _ls_available(args: argparse.Namespace) -> int:
    from atari_zarr.listing import format_available
    from atari_zarr.pull import RLU_URL, available

    rows = available(
        home=args.home,
        home_options=parse_storage_options(args.storage_option),
        source_sizes=args.source_sizes,
        source=args.source or RLU_URL,
        source_options=parse_storage_options(args.source_storage_option, "--source-storage-option")
        or None,
        timeout=_timeout(args),
    )
    return _print_rows(args, rows, "id", format_available)


def _print_rows(args: argparse.Namespace, rows: list[Any], key: str, table: Any) -> int:
    """``ls``'s rows: JSON (``--json``), ``key`` of each (``-q``), or ``table(rows)``."""
    import json

    if args.json:
        print(json.dumps(rows, indent=2))  # JSON escapes control characters itself
        return 0
    rows = [{**row, key: _shown(row[key])} for row in rows]
    if args.quiet:
        for row in rows:
            print(row[key])
    else:
        print(table(rows))
    return 0


def _convert_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert",
        help="convert DQN Replay or RL Unplugged runs into stores",
        description="Convert {Game}/{run}/replay_logs (DQN Replay) or {Game}/run_{r}-*-of-* "
        "shards (RL Unplugged) under SOURCE into DEST/{Game}/{run}.zarr.",
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="dataset root, run directory (DQN Replay) or game directory (RL Unplugged); "
        "path or URL",
    )
    p.add_argument("dest", metavar="DEST", help="destination root (path or URL)")
    p.add_argument("--games", nargs="+", metavar="G", help="only these games (default: all)")
    p.add_argument(
        "--runs", nargs="+", metavar="R", help="only these runs, e.g. 1 for run_1-* (default: all)"
    )
    p.add_argument(
        "--source-kind",
        choices=("dqn-replay", "rl-unplugged"),
        help="the source's kind (default: recognised by its layout)",
    )
    p.add_argument(
        "--checkpoints",
        metavar="SPEC",
        help="checkpoint suffixes (RL Unplugged: shard indices), e.g. '0-9,50', or a preset: "
        "mixed (1), medium (10), expert (50; RL Unplugged: the last shard) (default: all)",
    )
    p.add_argument("--max-transitions", type=int, metavar="N", help="keep at most N transitions")
    p.add_argument("--max-episodes", type=int, metavar="N", help="keep at most N episodes")
    _add_subset_options(p)
    p.add_argument(
        "--full-action-space",
        action="store_true",
        help="also write action_full: actions as ALE's 18 actions (needs ale-py)",
    )
    p.add_argument(
        "--return-to-go",
        action="store_true",
        help="also write return_to_go: sum of rewards to the episode's end",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start over: replace complete stores and discard unfinished ones "
        "(without it, an unfinished store is resumed)",
    )
    p.add_argument(
        "--index",
        action="store_true",
        help="then write DEST/catalog.json, the index of DEST's complete stores (see `index`)",
    )
    _add_scheduler_options(p)
    return p


def _verify_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "verify",
        help="check a store: completeness, counts, checksums, optionally against the source",
        description="Check that STORE is complete and consistent, and that every chunk passes "
        "its crc32c checksum; with --source, also compare every transition with the source. "
        "Exit status 0 when sound, 1 with a report otherwise.",
    )
    p.add_argument("store", metavar="STORE", help="store path or URL (.../Pong/1.zarr)")
    p.add_argument(
        "--source",
        metavar="SOURCE",
        help="what it was converted from: the dataset root, a game or a run directory",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes that decode the frames (default: one per core; 1: this process)",
    )
    return p


def _info_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("info", help="summarise a store", description="Summarise a store.")
    p.add_argument("store", metavar="STORE", help="store path or URL (.../Pong/1.zarr)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--episodes", action="store_true", help="list every episode")
    p.add_argument(
        "--checkpoints",
        action="store_true",
        help="episode statistics per source checkpoint (RL Unplugged: per shard): the "
        "learning curve of the agent that logged the data",
    )
    return p


def _video_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "video",
        help="write an episode as an MP4 or a GIF",
        description="Write one episode of a store as a video (MP4 or GIF, by OUT's suffix), "
        "frames upscaled, with a caption of step, action, reward and return so far.",
    )
    p.add_argument("store", metavar="STORE", help="store path or URL (.../Pong/1.zarr)")
    p.add_argument("out", metavar="OUT", help="the video to write: .mp4 or .gif")
    p.add_argument("--episode", type=int, default=0, metavar="N", help="episode (default 0)")
    p.add_argument("--scale", type=int, default=4, help="upscale factor (default 4)")
    p.add_argument("--fps", type=float, default=15.0, help="frames per second (default 15)")
    p.add_argument("--no-caption", action="store_true", help="frames only")
    return p


def _view_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "view",
        help="watch a store's episodes in the browser",
        description="Serve the episode viewer (a static page: runs, episodes, frames, a "
        "timeline of actions and rewards) and STORE on 127.0.0.1, and open it in the browser. "
        "A URL (https://, gs://, s3://, hf://) is read by the page from its host, which must "
        "allow it (CORS); a local store or root is served beside the page.",
    )
    p.add_argument(
        "store", metavar="STORE", help="a store (.../Pong/1.zarr) or a root with catalog.json"
    )
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--no-browser", action="store_true", help="only print the page's URL")
    return p


def _collect_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "collect",
        help="record play in an Atari env into a store",
        description="Play an ALE game with DQN Replay's preprocessing (sticky actions 0.25, "
        "frame skip 4, 84x84 grayscale, no-op starts) and a random policy, recording every "
        "step into the store DEST.",
    )
    p.add_argument("dest", metavar="DEST", help="store to create (path or URL), e.g. pong.zarr")
    p.add_argument(
        "--env",
        required=True,
        help="game or Atari env id, e.g. Pong, ALE/Pong-v5 or PongNoFrameskip-v4 (only the game "
        "is taken from an id; the settings are DQN Replay's)",
    )
    p.add_argument("--steps", type=int, required=True, help="transitions to record")
    p.add_argument("--seed", type=int, help="seed of the env and the policy")
    p.add_argument(
        "--max-episode-steps",
        type=int,
        default=_MAX_EPISODE_STEPS,
        help=f"episode limit (default {_MAX_EPISODE_STEPS})",
    )
    p.add_argument(
        "--buffer-steps", type=int, default=4096, help="flush every N steps (default 4096)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace DEST")
    return p


def _demo_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="play Atari into a small DQN Replay (or RL Unplugged) run, convert, read back, plot",
        description="Play a real Atari game (random policy) into DQN Replay checkpoint files "
        "(or RL Unplugged shards, --source-kind rl-unplugged), convert them to a store, read it "
        "back, and write frames.png and returns.png to DEST.",
    )
    p.add_argument(
        "dest",
        metavar="DEST",
        nargs="?",
        default="atari-zarr-demo",
        help="output directory (default: atari-zarr-demo)",
    )
    p.add_argument(
        "--source-kind",
        choices=("dqn-replay", "rl-unplugged"),
        default="dqn-replay",
        help="the format to record into: DQN Replay checkpoints, or RL Unplugged's GZIP "
        "TFRecord shards of PNG frames (default: dqn-replay)",
    )
    p.add_argument("--game", help="ALE game to play (default: Breakout; Asterix for rl-unplugged)")
    p.add_argument("--steps", type=int, default=3000, help="transitions to record (dqn-replay)")
    p.add_argument(
        "--capacity", type=int, default=1000, help="replay capacity of the recording (dqn-replay)"
    )
    p.add_argument(
        "--shards",
        type=int,
        default=5,
        help="shards of the run, the middle one left out as a gap (rl-unplugged; default 5)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the play and the samples")
    return p


def _ls_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "ls",
        help="list the stores under a directory or URL",
        description="List the {Game}/{run}.zarr stores under ROOT: transitions, episodes, "
        "size, and whether each is complete.",
    )
    p.add_argument(
        "root", metavar="ROOT", nargs="?", help="destination root of convert (path or URL)"
    )
    p.add_argument("--no-size", action="store_true", help="skip adding up sizes (faster remotely)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--no-index", action="store_true", help="list ROOT even if it has a catalog.json"
    )
    p.add_argument(
        "--available",
        action="store_true",
        help="list what `pull` can fetch instead: RL Unplugged's games and runs, their size "
        "(TFDS's figure where it gives one) and whether the cache holds them",
    )
    p.add_argument(
        "--home",
        metavar="DIR",
        help="with --available: the cache (default $ATARI_ZARR_HOME or ~/.cache/atari_zarr)",
    )
    p.add_argument(
        "--source-sizes",
        action="store_true",
        help="with --available: list the source's shards for every run's size (one request "
        "per game)",
    )
    _add_source_options(p)
    return p


def _pull_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "pull",
        help="fetch a run (or a part of one) from RL Unplugged's public copy into the cache",
        description="Convert a game/run from RL Unplugged's public copy "
        "(gs://rl_unplugged/atari_episodes_ordered) into the cache, $ATARI_ZARR_HOME or "
        "~/.cache/atari_zarr, unless it is there: only the shards asked for, and for "
        "--fraction (in the order played) only that prefix of each shard. What the TorchRL, "
        "d3rlpy and Decision Transformer drop-ins do on first use; run it once before a "
        "job with many processes (DDP ranks wait for it otherwise).",
    )
    p.add_argument(
        "dataset_id",
        metavar="ID",
        nargs="+",
        help="'Game/run' as TorchRL names it (e.g. Pong/5), or a game (e.g. pong: run 1, or "
        "--index I for d3rlpy's run index); several are pulled one after the other",
    )
    p.add_argument("--index", type=int, metavar="I", help="d3rlpy's run index: run I + 1 (0 to 4)")
    p.add_argument(
        "--checkpoints",
        metavar="SPEC",
        help="shards (checkpoints) to fetch, e.g. '0-9,49' (default: all)",
    )
    _add_subset_options(p, order="played")
    p.add_argument("--home", metavar="DIR", help="the cache (default $ATARI_ZARR_HOME)")
    p.add_argument("--force", action="store_true", help="fetch again, even when the cache holds it")
    _add_source_options(p)
    _add_scheduler_options(p)
    return p


def _index_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "index",
        help="write ROOT/catalog.json, the index of its complete stores",
        description="Write ROOT/catalog.json: one entry per complete {Game}/{run}.zarr store "
        "under ROOT (game, run, kind, transitions, episodes, size, returns, content id). "
        "`ls`, MultiGameDataset.from_root and the TorchRL drop-in read it with one request; "
        "over https it is how a root is listed.",
    )
    p.add_argument("root", metavar="ROOT", help="destination root of convert (path or URL)")
    p.add_argument("--no-size", action="store_true", help="do not record sizes (faster remotely)")
    return p


def _card_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "card",
        help="write ROOT/README.md, a dataset card (Hugging Face convention)",
        description="Write ROOT/README.md, a dataset card in the Hugging Face convention "
        "(YAML front matter, the games/runs, where the data came from, the lines that load "
        "it, learning curves), and ROOT/learning_curves.png.",
    )
    p.add_argument("root", metavar="ROOT", help="destination root of convert (path or URL)")
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the URL readers use for ROOT in the loading lines (default ROOT), e.g. "
        "https://storage.googleapis.com/BUCKET/atari",
    )
    p.add_argument(
        "--reader-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a storage option of the loading lines, repeatable (e.g. token=anon)",
    )
    p.add_argument("--license", default="cc-by-4.0", help="license of the front matter")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace ROOT/README.md even when `card` did not write it",
    )
    return p


def _publish_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "publish",
        help="upload ROOT's complete stores, catalog and card to a Hugging Face dataset repo",
        description="Upload the complete stores under the local ROOT to a Hugging Face Hub "
        "dataset repo, then its catalog.json and a dataset card (in the last commit: a "
        "reader never sees a store before all of it is there). Within the Hub's limits "
        "(checked first); files already there are not sent again, so an interrupted "
        "publish resumes when run again. The token is $HF_TOKEN or huggingface-cli login's "
        "(or --storage-option token=...); the endpoint $HF_ENDPOINT.",
    )
    p.add_argument("root", metavar="ROOT", help="local destination root of convert")
    p.add_argument(
        "repo", metavar="REPO", help="hf://datasets/ORG/NAME (@BRANCH, /FOLDER optional)"
    )
    p.add_argument(
        "--names", nargs="+", metavar="GAME/RUN", help="only these stores (default: all)"
    )
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--license", default="cc-by-4.0", help="license of the card's front matter")
    p.add_argument("--message", help="the commits' message")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the repo's README.md even when `card` or `publish` did not write it",
    )
    return p


#: Each verb: what builds its parser and what runs it, in the order ``--help`` lists them.
_VERBS: tuple[tuple[Callable[[Any], argparse.ArgumentParser], Callable[..., int]], ...] = (
    (_convert_parser, _cmd_convert),
    (_verify_parser, _cmd_verify),
    (_info_parser, _cmd_info),
    (_video_parser, _cmd_video),
    (_view_parser, _cmd_view),
    (_collect_parser, _cmd_collect),
    (_demo_parser, _cmd_demo),
    (_ls_parser, _cmd_ls),
    (_pull_parser, _cmd_pull),
    (_index_parser, _cmd_index),
    (_card_parser, _cmd_card),
    (_publish_parser, _cmd_publish),
)
#: Verbs that show progress bars.
_PROGRESS = {"convert", "verify", "collect", "demo", "pull", "publish"}
#: What ``-q`` leaves of a verb's output, where it is not the same for every verb.
_QUIET = {
    "verify": "print only problems",
    "ls": "print only the store URLs",
    "pull": "print only the store's path (for a part a whole run there serves, the line "
    "that takes it), no progress",
    "view": "print only the page's URL",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atari-zarr",
        description="Convert the Atari DQN Replay Dataset into Zarr v3 stores and inspect them.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--verbose", "-v", dest="verbose_all", action="store_true", help="log progress details"
    )
    parser.add_argument(
        "--quiet",
        "-q",
        dest="quiet_all",
        action="store_true",
        help="print nothing but errors and what was asked for; no progress bars",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for build, command in _VERBS:
        verb = build(sub)
        verb.set_defaults(func=command)
        _add_shared_options(verb, verb.prog.split()[-1])
    return parser


def _add_shared_options(verb: argparse.ArgumentParser, name: str) -> None:
    """What verbs share, after each verb's own options."""
    if name in _PROGRESS:
        verb.add_argument("--no-progress", action="store_true", help="no progress bars")
    quiet = _QUIET.get(name, "print nothing but errors and what was asked for")
    verb.add_argument("--quiet", "-q", action="store_true", help=quiet)  # after the verb too
    verb.add_argument("--verbose", "-v", action="store_true", help="log progress details")
    if name not in ("demo", "view"):  # local files only; the viewer's browser reads the rest
        _add_storage_option(verb)


def _shown(text: object) -> str:
    """``text`` as the command line prints a path or URL: its control characters
    escaped (a newline as ``\\n``, an escape as ``\\x1b``, a direction override as
    ``\\u202e``), so that it stays on its line and the terminal shows it as it is.

    Examples
    --------
    >>> print(_shown("/tmp/a\\nb\\x1b[31m/Pong/1.zarr"))
    /tmp/a\\nb\\x1b[31m/Pong/1.zarr
    >>> _shown("/données/Pong 1.zarr")
    '/données/Pong 1.zarr'
    """
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
        for ch in str(text)
    )


def _one_line(exc: BaseException) -> str:
    """An error's message on one line: runs of white space as one space, other control
    characters (of a path in it) escaped as :func:`_shown` does."""
    return _shown(" ".join(str(exc).split())) or type(exc).__name__


class _Redacted(io.TextIOBase):
    """A text stream that writes through another with credentials removed."""

    def __init__(self, stream: Any, options: dict[str, Any]) -> None:
        self._stream = stream
        self._options = options

    def write(self, text: str) -> int:
        self._stream.write(redact(text, self._options))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return bool(getattr(self._stream, "isatty", lambda: False)())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._stream, "encoding", "utf-8"))


@contextlib.contextmanager
def _redacting(options: dict[str, Any]) -> Iterator[None]:
    """stdout, stderr and log records of this command, credentials removed."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Redacted(out, options), _Redacted(err, options)
    # log records are redacted by a filter on every handler, whatever stream it writes to
    records = RedactRecords(options)
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(records)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(records)
        sys.stdout, sys.stderr = out, err


@contextlib.contextmanager
def _one_line_warnings(verb: str) -> Iterator[None]:
    """Warnings of this command as ``atari-zarr VERB: warning: ...``, one line each, not
    Python's ``file:line: UserWarning`` with the source line under it."""
    previous = warnings.showwarning

    def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        text = _shown(" ".join(str(message).split()))
        print(f"atari-zarr {verb}: warning: {text}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def _not_the_hubs(record: logging.LogRecord) -> bool:
    return not record.name.startswith("huggingface_hub")


@contextlib.contextmanager
def _hub_records(verbose: bool) -> Iterator[None]:
    """huggingface_hub's records (a 429's "Rate limited. Waiting ...") with -v only: it
    sets its loggers' own level (WARNING), which the root's does not lower."""
    handlers = [] if verbose else list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(_not_the_hubs)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_not_the_hubs)


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C's KeyboardInterrupt is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: Signals that stop a command as Ctrl-C does: ``kill``'s default, and a closed terminal.
_STOPPING = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop the command as Ctrl-C does: its ``finally`` blocks run (a
    process pool shut down, a work area's lock released). Killed by the signal's default
    action instead, a conversion left its worker pool's queues, named semaphores, to
    Python's resource tracker, which warned "leaked semaphore objects" after the process
    ended. A signal the caller ignores (``nohup``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def stop(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    previous = {s: signal.getsignal(s) for s in _STOPPING}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in previous.items():  # None: a handler not set from Python
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``atari-zarr``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # `atari-zarr -q VERB` and `atari-zarr VERB -q` mean the same; so do -v's.
    if args.quiet_all or getattr(args, "quiet", False):
        args.quiet = True
        args.no_progress = True
    args.verbose = args.verbose_all or getattr(args, "verbose", False)
    quiet = bool(args.quiet)
    # our own records at WARNING (ERROR with -q); other libraries' (fsspec's, gcsfs's,
    # aiohttp's retries) only when asked, with -v
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.CRITICAL + 1,
        format="%(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("atari_zarr").setLevel(
        logging.INFO if args.verbose else logging.ERROR if quiet else logging.WARNING
    )

    secrets: dict[str, Any] = {}
    for name in ("storage_option", "source_storage_option"):
        with contextlib.suppress(AtariZarrError):  # a malformed pair is reported below
            secrets[name] = parse_storage_options(getattr(args, name, None) or [])
    with (
        _terminate_as_interrupt(),
        _redacting(secrets),
        _one_line_warnings(args.command),
        _hub_records(args.verbose),
    ):
        try:
            code = int(args.func(args))
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            return code
        except BrokenPipeError:  # `atari-zarr ls | head`: the reader left, nothing is wrong
            if sys.__stdout__ is not None:  # so the flush at exit raises nothing
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
            return 141  # as a process ended by SIGPIPE
        except AtariZarrError as exc:  # every failure raised on purpose; anything else is a bug
            print(f"atari-zarr {args.command}: error: {_one_line(exc)}", file=sys.stderr)
            return 1
        except _Terminated as stopped:
            name = signal.Signals(stopped.signum).name
            print(f"atari-zarr {args.command}: terminated ({name})", file=sys.stderr)
            return 128 + stopped.signum
        except KeyboardInterrupt:
            print(f"atari-zarr {args.command}: interrupted", file=sys.stderr)
            return 130
        except Exception:  # a bug: its traceback, with credentials removed
            traceback.print_exc(file=sys.stderr)
            return 1
