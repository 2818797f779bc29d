"""From nothing to a first batch: a pull from RL Unplugged's public layout at 20 ms a request.

Writes ``--shards`` shards of real ALE Pong play (``run_1-{i:05d}-of-00050``, about
``--frames`` frames each; the same episodes in every shard, each shard its own
checkpoint), serves them from fake-gcs-server under the public layout
(``rl_unplugged/atari_episodes_ordered/Pong``) behind ``CountingProxy`` with
``--delay`` seconds per request, points gcsfs at it with ``STORAGE_EMULATOR_HOST`` (the
code keeps its public URL), and times, each into an empty cache:

* ``fraction``: d3rlpy's ``fraction=F`` in the order played, ``resolve`` + open + the
  first random batch of 256;
* ``checkpoint``: one whole checkpoint (``--checkpoints K``), the same;
* ``every_shard``: every shard written, whole (the conversion's throughput with
  ``--workers`` workers, start-up and the network included).

For each: seconds to the first batch, bytes fetched (response bodies of the shard
objects), the source bytes of what was asked for (each shard's compressed bytes up to
the end of the last record the request needs), their ratio, and frames converted per
second and per worker (worker start-up and the network included). Then the same
conversions on one core in this process, the network left out (``one_core_*``).

Usage::

    python benchmarks/bench_pull.py --shards 10 --frames 30000 --delay 0.02 --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

# Before anything imports gcsfs (see docs/gcs-emulator.md).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import gcsfs
import numpy as np
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer
from atari_zarr_testkit.rl_unplugged import read_shard_records

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.pull import Request, resolve
from atari_zarr.record.rl_unplugged import Played, played_episodes, shard_name, write_shard
from atari_zarr.sources.rl_unplugged.example import Episode, encode_episode
from atari_zarr.sources.rl_unplugged.png import encode_frame
from atari_zarr.subsets import Subset

CACHE = Path(__file__).parent / ".cache"


def corpus_episodes(frames: int, seed: int = 0) -> tuple[list[Played], list[list[bytes]]]:
    """Episodes of 1,000-3,000 steps, about ``frames`` frames in all, whose frames cycle
    through the six-game corpus's Pong (``ale_frames.record_frames(..., policy="repeat")``,
    the frames of ``bench_fullsize.py``'s run), and their PNGs (each distinct frame
    encoded once)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from ale_frames import record_frames

    corpus = record_frames("Pong", 50_000, seed=0, policy="repeat")
    rng = np.random.default_rng(seed)
    cache: dict[int, bytes] = {}
    played, pngs, at = [], [], 0
    while at < frames:
        n = int(rng.integers(1_000, 3_001))
        idx = (at + np.arange(n + 1)) % len(corpus)
        rewards = np.zeros(n, np.float32)
        rewards[rng.integers(0, n, size=max(1, n // 100))] = 1.0
        # the shards are written from the PNGs: frames left empty (a shard of 1M frames
        # would hold 7 GB of them)
        none = np.empty((0, 84, 84), np.uint8)
        played.append(Played(none, rng.integers(0, 6, size=n), rewards, True))
        pngs.append([cache.setdefault(k, encode_frame(corpus[k])) for k in idx.tolist()])
        at += n
    return played, pngs


def write_shards(
    root: Path, shards: int, frames: int, seed: int = 0, corpus: bool = False
) -> dict[int, Path]:
    """``shards`` shards of about ``frames`` frames of Pong each (cached between runs)."""
    game_dir = root / "Pong"
    paths = {i: game_dir / shard_name(1, i, 50) for i in range(shards)}
    if all(p.exists() for p in paths.values()):
        return paths
    if corpus:
        played, pngs = corpus_episodes(frames, seed)
    else:
        played = []
        total = 0
        while total < frames:  # whole games of random play, about 800 steps each
            [episode] = played_episodes("Pong", seed + len(played), (None,), cap=27_000)
            played.append(episode)
            total += len(episode.actions)
        pngs = [[encode_frame(f) for f in p.frames] for p in played]
    for i, path in paths.items():
        records = []
        for k, (p, images) in enumerate(zip(played, pngs, strict=True)):
            n = len(p.actions)
            rewards = np.append(p.rewards, 0.0).astype(np.float32)
            discounts = np.append(np.ones(n, np.float32), 0.0 if p.terminated else 1.0)
            keep = n + 1 if p.terminated else n
            records.append(
                encode_episode(
                    Episode(
                        checkpoint_idx=i,
                        episode_idx=k,
                        episode_return=float(p.rewards.sum()),
                        clipped_episode_return=None,
                        observations=images[:keep],
                        actions=np.append(p.actions, 0)[:keep].astype(np.int64),
                        unclipped_rewards=rewards[:keep],
                        clipped_rewards=None,
                        discounts=discounts[:keep].astype(np.float32),
                    )
                )
            )
        write_shard(path, records)
    return paths


def needed_bytes(path: Path, rows: int | None) -> int:
    """Compressed bytes of ``path`` up to the end of the record in which its real steps
    reach ``rows`` (None: the whole file)."""
    raw = path.read_bytes()
    if rows is None:
        return len(raw)
    from atari_zarr.sources.rl_unplugged.example import parse_episode

    need, real = 0, 0
    for data in read_shard_records(path):
        need += 12 + len(data) + 4
        real += parse_episode(data, str(path), 0, observations=False).real_steps
        if real >= rows:
            break
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = 0
    for at in range(0, len(raw), 1024):
        out += len(inflate.decompress(raw[at : at + 1024]))
        if out >= need:
            return min(len(raw), at + 1024)
    return len(raw)


def _children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--frames", type=int, default=30_000)
    ap.add_argument("--fraction", type=float, default=0.01)
    ap.add_argument("--checkpoint", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.02)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--scheduler",
        default="threads",
        help="threads (what the drop-ins use: convert's default without a dask Client) or "
        "processes (the CLI's default)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--corpus",
        action="store_true",
        help="frames cycled from the corpus's Pong (as bench_fullsize.py's run), episodes "
        "of 1,000-3,000 steps, instead of whole games of random play",
    )
    ap.add_argument(
        "--cases",
        default="fraction,checkpoint,every_shard",
        help="which pulls to time (comma-separated)",
    )
    ap.add_argument("--no-one-core", action="store_true", help="skip the one-core conversions")
    args = ap.parse_args()

    src = CACHE / (f"pull-src-{args.shards}x{args.frames}" + ("-corpus" if args.corpus else ""))
    t = time.perf_counter()
    paths = write_shards(src, args.shards, args.frames, corpus=args.corpus)
    made = time.perf_counter() - t
    sizes = {i: p.stat().st_size for i, p in paths.items()}
    out: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor()}",
        "shards": args.shards,
        "frames_per_shard": args.frames,
        "shard_mb": round(float(np.mean(list(sizes.values()))) / 1e6, 2),
        "delay_s": args.delay,
        "workers": args.workers,
        "scheduler": args.scheduler,
        "fixture_s": round(made, 1),
        "frames": "corpus Pong, cycled" if args.corpus else "random play, whole games",
    }
    with FakeGCSServer() as server:
        server.create_bucket("rl_unplugged")
        fs = gcsfs.GCSFileSystem(**server.storage_options())
        for path in paths.values():
            fs.put_file(str(path), f"rl_unplugged/atari_episodes_ordered/Pong/{path.name}")
        with CountingProxy(server.endpoint_url, delay=args.delay) as proxy:
            os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint_url
            cases = {
                "fraction": (
                    Request.parse("Pong/1", fraction=args.fraction),
                    {i: int(args.fraction * 1_000_000) for i in paths},
                ),
                "checkpoint": (
                    Request.parse("Pong/1", checkpoints=[args.checkpoint]),
                    {args.checkpoint: None},
                ),
                # every shard written (the source holds no others)
                "every_shard": (
                    Request.parse("Pong/1", checkpoints=list(paths)),
                    dict.fromkeys(paths),
                ),
            }
            wanted = args.cases.split(",")
            for label, (request, asked) in cases.items():
                if label not in wanted:
                    continue
                home = tempfile.mkdtemp(prefix="bench-pull-")
                proxy.reset()
                cpu0 = _children_cpu()
                t0 = time.perf_counter()
                found = resolve(
                    request, home=home, scheduler=args.scheduler, workers=args.workers
                )
                pulled = time.perf_counter() - t0
                ds = AtariZarrDataset(found.url)
                batch = ds.sample(256)
                first = time.perf_counter() - t0
                fetched = sum(
                    n for m, p, _, n in proxy.log if m == "GET" and "run_1-" in p
                )
                source = sum(needed_bytes(paths[i], rows) for i, rows in asked.items())
                out[label] = {
                    "request": request.describe(),
                    "transitions": len(ds),
                    "first_batch_s": round(first, 2),
                    "pull_s": round(pulled, 2),
                    "requests": proxy.requests,
                    "fetched_mb": round(fetched / 1e6, 2),
                    "source_mb_asked": round(source / 1e6, 2),
                    "fetched_over_asked": round(fetched / source, 3),
                    "frames_per_s_per_worker": round(len(ds) / pulled / args.workers),
                    "batch": list(batch["observation"].shape),
                }
                if args.scheduler == "processes":
                    # the workers are this process's children: their CPU and largest RSS
                    cpu = _children_cpu() - cpu0
                    out[label]["worker_cpu_s"] = round(cpu, 1)
                    out[label]["frames_per_worker_cpu_s"] = round(len(ds) / cpu)
                    out[label]["worker_peak_rss_MB"] = round(
                        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
                    )
                out[label]["disk_MB"] = round(_du(Path(home)) / 1e6, 1)
                del ds
                shutil.rmtree(home, ignore_errors=True)
                print(label, out[label], flush=True)
    # conversion on one core, the network left out: the same shards converted in this
    # process (synchronous), scans keeping their frames as a pull's do
    for label, kwargs in () if args.no_one_core else (
        ("one_core_fraction", {"subset": Subset.fraction_of(args.fraction, order="played")}),
        ("one_core_whole_shards", {}),
    ):
        dest = tempfile.mkdtemp(prefix="bench-pull-local-")
        t0 = time.perf_counter()
        [store] = convert(
            str(src / "Pong"),
            dest,
            scheduler="synchronous",
            progress=False,
            keep_frames=True,
            **kwargs,
        )
        seconds = time.perf_counter() - t0
        out[label] = {
            "transitions": store.transitions,
            "seconds": round(seconds, 2),
            "frames_per_s": round(store.transitions / seconds),
        }
        print(label, out[label], flush=True)
    if args.json:
        print(json.dumps(out, indent=2))
        stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
        results = Path(__file__).parent / "results" / f"pull-{args.scheduler}-{stamp}.json"
        results.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
