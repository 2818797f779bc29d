"""A run at real size: conversion, verify, opening, tables, random access, stream, windows.

One command::

    python benchmarks/bench_fullsize.py --checkpoints 50 --sizes 1,5,20,50

It writes, once, a DQN Replay run of ``--checkpoints`` full checkpoints of 1,000,000
transitions (``bench_convert.build_run``: dopamine's file layout, episodes of
1,000-3,000 steps and their padding, observation files gzip'd at isal level 1) whose
frames are the six-game corpus's Pong (``ale_frames.record_frames(..., policy="repeat")``,
50,000 frames cycled along the stream). Then, for each size ``S`` (checkpoints), in a
fresh process each:

* ``convert`` of the first ``S`` checkpoints (``checkpoints="0-{S-1}"``), 2 worker
  processes: wall time, frames per second per worker CPU second, peak RSS per worker
  (the workers' ``ru_maxrss``), the store's bytes;
* ``verify`` (every chunk decoded and checked): wall time;
* opening the store (``AtariZarrDataset``): time and the process's RSS growth;
* the episode table and ``info --checkpoints``: time;
* random TED batches of 256 at frame stack 4 with a decoded-frame cache of 2% of the
  run's frames (at most the default), the stream (``stream(256)``, one process) and
  windows of 8 steps (``windows(8)[rows]``, batches of 64): transitions per second.

Results go to ``benchmarks/results/fullsize-<time>.json`` and a table is printed. The
stores are deleted after their size is measured (the source stays cached in
``benchmarks/.cache/fullsize``), unless ``--keep``.

The reads again, in their steady state::

    python benchmarks/bench_fullsize.py --sizes 1,50 --reads --warmup 30 --rounds 3

times only the reads of stores kept by an earlier ``--keep`` run: each size in a fresh
process per round (the rounds alternate the sizes), every reader first run for
``--warmup`` seconds (the page cache and the decoded-frame cache filled, the shards
mapped), then timed for ``--seconds``; the stream starts from a fresh dataset, as a
training job's would. Results go to ``benchmarks/results/fullsize-reads-<time>.json``
with every round and the medians, and what a reader holds besides its frame budget
(RSS growth in a fresh process: the episode table, the per-step columns once every row
is read, the return-to-go).

``verify`` of the kept stores, on one process and on its default of one per core::

    python benchmarks/bench_fullsize.py --sizes 1,50 --verify --rounds 2

each in a fresh process, alternating; the ratio to the conversion is taken against the
newest ``fullsize-*.json`` that converted the same size. Results go to
``benchmarks/results/fullsize-verify-<time>.json``.

Full-size pulls from RL Unplugged's layout are ``bench_pull.py --corpus``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CACHE = HERE / ".cache" / "fullsize"
CAPACITY = 1_000_000
FRAME_BYTES = 84 * 84


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _timed(fn, seconds: float, batch: int, warmup: float = 0.0) -> float:
    rng = np.random.default_rng(0)
    fn(rng)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        fn(rng)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or done < 3 * batch:
        fn(rng)
        done += batch
    return done / (time.perf_counter() - t0)


def child(source: Path, dest: Path, size: int, seconds: float) -> dict:
    """Everything for one size, in this (fresh) process."""
    import torch

    torch.set_num_threads(1)
    from atari_zarr import AtariZarrDataset, ReadOptions, convert
    from atari_zarr.verify import verify_store

    out: dict = {"checkpoints": size}
    t0 = time.perf_counter()
    [store] = convert(str(source), str(dest), checkpoints=f"0-{size - 1}", scheduler="processes",
                      workers=2, progress=False)
    wall = time.perf_counter() - t0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = kids.ru_utime + kids.ru_stime
    n = int(store.transitions)
    out["convert"] = {
        "seconds": round(wall, 1), "transitions": n, "worker_cpu_s": round(cpu, 1),
        "frames_per_s": round(n / wall), "frames_per_worker_cpu_s": round(n / cpu),
        "worker_peak_rss_MB": round(kids.ru_maxrss / 1024),
        "store_bytes": _du(Path(store.url)),
        "bytes_per_frame": round(_du(Path(store.url) / "observation") / n, 1),
    }
    t0 = time.perf_counter()
    report = verify_store(store.url)
    out["verify"] = {"seconds": round(time.perf_counter() - t0, 1), "ok": bool(report.ok)}
    rss0, t0 = _rss_mb(), time.perf_counter()
    cache = _cache_bytes(n)
    ds = AtariZarrDataset(store.url, frame_stack=4, options=ReadOptions(frame_cache_bytes=cache))
    out["open"] = {"seconds": round(time.perf_counter() - t0, 3),
                   "rss_growth_MB": round(_rss_mb() - rss0, 1)}
    t0 = time.perf_counter()
    table = ds.episode_table
    out["episode_table"] = {"seconds": round(time.perf_counter() - t0, 3), "episodes": len(table)}
    t0 = time.perf_counter()
    info = subprocess.run([sys.executable, "-m", "atari_zarr", "info", "--checkpoints", store.url],
                          capture_output=True, text=True, check=True)
    out["info_checkpoints"] = {"seconds": round(time.perf_counter() - t0, 2),
                               "lines": len(info.stdout.splitlines())}
    out["cache_bytes"] = cache
    out.update(_reads(ds, seconds))
    out["rss_end_MB"] = round(_rss_mb())
    return out


def _cache_bytes(n: int) -> int:
    """The decoded-frame cache: 2% of the run's frames, at most the default."""
    from atari_zarr import ReadOptions

    return min(ReadOptions().frame_cache_limit(), int(0.02 * n * FRAME_BYTES))


def _reads(ds, seconds: float, warmup: float = 0.0, fresh=None, stream_only=False) -> dict:
    """Random TED-256 at stack 4, the stream, windows of 8: transitions per second.

    ``fresh`` (a function opening the dataset again) gives the stream a dataset of
    its own, as a training job's would have. ``stream_only``: the stream alone.
    """
    n = len(ds)
    out = {}
    if not stream_only:
        out["random_stack4"] = round(_timed(lambda g: ds[g.integers(0, n, 256)], seconds, 256,
                                            warmup))
    sds = fresh() if fresh is not None else ds
    stream = itertools.chain.from_iterable(sds.stream(256, seed=0, epoch=e)
                                           for e in itertools.count())
    out["stream"] = round(_timed(lambda g: next(stream), seconds, 256, warmup))
    if stream_only:
        return out
    windows = ds.windows(8)
    m = len(windows)
    out["windows8"] = round(_timed(lambda g: windows[g.integers(0, m, 64)], seconds, 64,
                                   warmup) * 8)
    return out


def reads_child(dest: Path, seconds: float, warmup: float, stream_only: bool = False) -> dict:
    """The reads of kept store ``dest`` only, after ``warmup`` seconds of each."""
    import torch

    torch.set_num_threads(1)
    from atari_zarr import AtariZarrDataset, ReadOptions

    url = str(dest / "Pong" / "1.zarr")

    def open_ds(cache: int | None = None) -> AtariZarrDataset:
        options = ReadOptions() if cache is None else ReadOptions(frame_cache_bytes=cache)
        return AtariZarrDataset(url, frame_stack=4, options=options)

    rss0 = _rss_mb()
    ds = open_ds(_cache_bytes(len(open_ds())))
    rss1 = _rss_mb()
    table = ds.episode_table
    out = {"transitions": len(ds), "cache_bytes": _cache_bytes(len(ds)),
           "open_rss_MB": round(rss1 - rss0, 1),
           "episode_table_rss_MB": round(_rss_mb() - rss1, 1), "episodes": len(table)}
    out.update(_reads(ds, seconds, warmup, fresh=open_ds, stream_only=stream_only))
    out["rss_end_MB"] = round(_rss_mb())
    return out


def memory_child(dest: Path) -> dict:
    """What a reader of kept store ``dest`` holds besides its frame budget (RSS growth):
    the episode table, the per-step columns once every row is read, the return-to-go."""
    import pandas  # noqa: F401  (imported first: its import is not the table's memory)

    from atari_zarr import AtariZarrDataset

    ds = AtariZarrDataset(str(dest / "Pong" / "1.zarr"))
    store, n = ds._store, len(ds)
    r0 = _rss_mb()
    episodes = len(ds.episode_table)
    r1 = _rss_mb()
    for lo in range(0, n, 1 << 20):
        store.step_values(np.arange(lo, min(n, lo + (1 << 20))), False)
    r2 = _rss_mb()
    store.return_to_go(np.arange(0, n, 997))
    r3 = _rss_mb()
    return {"transitions": n, "episodes": episodes, "episode_table_MB": round(r1 - r0, 1),
            "step_columns_MB": round(r2 - r1, 1),
            "step_columns_MB_per_1M": round((r2 - r1) / n * 1e6, 2),
            "return_to_go_MB": round(r3 - r2, 1)}


def reads(sizes: list[int], seconds: float, warmup: float, rounds: int,
          stream_only: bool = False) -> None:
    """Time the reads of kept stores, ``rounds`` fresh processes per size, alternating
    (``stream_only``: the stream alone, into ``fullsize-stream-<time>.json``)."""
    runs: dict[int, list[dict]] = {s: [] for s in sizes}
    for _ in range(rounds):
        for size in sizes:
            if not (CACHE / f"zarr_{size}").exists():
                raise SystemExit(f"no kept store of {size} checkpoints: run with --keep first")
            r = _run_child(["--reads-child", str(size), "--seconds", str(seconds),
                            "--warmup", str(warmup)] + ["--stream-only"] * stream_only)
            runs[size].append(r)
            print(size, json.dumps(r), flush=True)
    keys = ("stream",) if stream_only else ("random_stack4", "stream", "windows8")
    memory = {s: None if stream_only else _run_child(["--memory-child", str(s)])
              for s in sizes}
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "seconds": seconds, "warmup": warmup,
        "sizes": [{"checkpoints": s, "transitions": runs[s][0]["transitions"],
                   **{k: round(statistics.median(r[k] for r in runs[s])) for k in keys},
                   "runs": runs[s], "memory": memory[s]} for s in sizes],
    }
    kind = "stream" if stream_only else "reads"
    out = HERE / "results" / f"fullsize-{kind}-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(results, indent=1))
    for r in results["sizes"]:
        print(r["checkpoints"], {k: r[k] for k in keys})
    print(f"results: {out}")


def verify_child(dest: Path, workers: int) -> dict:
    """``verify_store`` of a kept store on ``workers`` processes, in this fresh process."""
    from atari_zarr.verify import verify_store

    [url] = [str(p) for p in dest.glob("*/*.zarr")]
    t0 = time.perf_counter()
    report = verify_store(url, workers=workers)
    wall = time.perf_counter() - t0
    return {"workers": workers, "seconds": round(wall, 1), "ok": bool(report.ok),
            "chunks": report.checked.get("chunks")}


def verify(sizes: list[int], rounds: int) -> None:
    """Time ``verify`` of kept stores on 1 process and on one per core, alternating."""
    converted = {}
    for path in sorted((HERE / "results").glob("fullsize-2*.json")):
        for r in json.loads(path.read_text())["sizes"]:
            converted[r["checkpoints"]] = (r["convert"]["seconds"], path.name)
    cores = os.cpu_count() or 1
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{cores} cores, {platform.machine()}",
        "sizes": [],
    }
    for size in sizes:
        runs = [_run_child(["--verify-child", str(size), "--workers", str(w)])
                for _ in range(rounds) for w in (1, cores)]
        for r in runs:
            print(size, json.dumps(r), flush=True)
        row: dict = {"checkpoints": size, "runs": runs}
        for w in (1, cores):
            best = min(r["seconds"] for r in runs if r["workers"] == w)
            row[f"seconds_{w}_workers"] = best
            if size in converted:
                row[f"of_conversion_{w}_workers"] = round(best / converted[size][0], 3)
        if size in converted:
            row["conversion_seconds"], row["conversion_file"] = converted[size]
        results["sizes"].append(row)
    out = HERE / "results" / f"fullsize-verify-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"results: {out}")


def _run_child(argv: list[str]) -> dict:
    run = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if run.returncode:
        print(run.stderr[-3000:])
        raise SystemExit(f"{' '.join(argv)} failed")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", type=int, default=50)
    p.add_argument("--sizes", default="1,5,20,50")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--keep", action="store_true", help="keep the stores for --reads")
    p.add_argument("--reads", action="store_true", help="time the reads of kept stores only")
    p.add_argument("--warmup", type=float, default=30.0, help="--reads: seconds before timing")
    p.add_argument("--rounds", type=int, default=3, help="--reads: processes per size")
    p.add_argument("--stream-only", action="store_true", help="--reads: the stream alone")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--reads-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--verify", action="store_true", help="time verify of kept stores only")
    p.add_argument("--verify-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    source = CACHE / "dqn"
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.reads_child:
        print(json.dumps(reads_child(CACHE / f"zarr_{args.reads_child}", args.seconds,
                                     args.warmup, args.stream_only)))
        return
    if args.memory_child:
        print(json.dumps(memory_child(CACHE / f"zarr_{args.memory_child}")))
        return
    if args.verify_child:
        print(json.dumps(verify_child(CACHE / f"zarr_{args.verify_child}", args.workers)))
        return
    if args.reads:
        reads(sizes, args.seconds, args.warmup, args.rounds, args.stream_only)
        return
    if args.verify:
        verify(sizes, args.rounds)
        return
    if args.child:
        dest = CACHE / f"zarr_{args.child}"
        shutil.rmtree(dest, ignore_errors=True)
        try:
            print(json.dumps(child(source / "Pong" / "1", dest, args.child, args.seconds)))
        finally:
            if not args.keep:
                shutil.rmtree(dest, ignore_errors=True)
        return
    from ale_frames import record_frames
    from bench_convert import build_run

    frames = record_frames("Pong", 50_000, seed=0, policy="repeat")
    t0 = time.perf_counter()
    build_run(source, "Pong", CAPACITY, args.checkpoints, frames=frames)
    print(f"source ready in {time.perf_counter() - t0:.0f} s ({_du(source) / 1e9:.1f} GB)",
          flush=True)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "source_bytes": _du(source), "sizes": [],
    }
    for size in sizes:
        r = _run_child(["--child", str(size), "--seconds", str(args.seconds)]
                       + (["--keep"] if args.keep else []))
        results["sizes"].append(r)
        print(json.dumps(r), flush=True)
    out = HERE / "results" / f"fullsize-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
