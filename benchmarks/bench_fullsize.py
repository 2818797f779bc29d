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
``benchmarks/.cache/fullsize``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import shutil
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


def _timed(fn, seconds: float, batch: int) -> float:
    rng = np.random.default_rng(0)
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
    default = ReadOptions().frame_cache_limit()
    cache = min(default, int(0.02 * n * FRAME_BYTES))
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
    out["random_stack4"] = round(_timed(lambda g: ds[g.integers(0, n, 256)], seconds, 256))
    stream = itertools.chain.from_iterable(ds.stream(256, seed=0, epoch=e) for e in itertools.count())
    out["stream"] = round(_timed(lambda g: next(stream), seconds, 256))
    windows = ds.windows(8)
    m = len(windows)
    out["windows8"] = round(_timed(lambda g: windows[g.integers(0, m, 64)], seconds, 64) * 8)
    out["rss_end_MB"] = round(_rss_mb())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", type=int, default=50)
    p.add_argument("--sizes", default="1,5,20,50")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    source = CACHE / "dqn"
    if args.child:
        dest = CACHE / f"zarr_{args.child}"
        shutil.rmtree(dest, ignore_errors=True)
        try:
            print(json.dumps(child(source / "Pong" / "1", dest, args.child, args.seconds)))
        finally:
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
    for size in [int(s) for s in args.sizes.split(",")]:
        run = subprocess.run([sys.executable, __file__, "--child", str(size),
                              "--seconds", str(args.seconds)],
                             capture_output=True, text=True)
        if run.returncode:
            print(run.stderr[-3000:])
            raise SystemExit(f"size {size} failed")
        r = json.loads(run.stdout.strip().splitlines()[-1])
        results["sizes"].append(r)
        print(json.dumps(r), flush=True)
    out = HERE / "results" / f"fullsize-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
