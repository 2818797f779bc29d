"""Benchmark conversion: throughput per worker against the gunzip floor, scaling, peak RSS.

    python benchmarks/bench_convert.py [--capacity 1000000] [--checkpoints 4] [--workers 1 2]
                                       [--game Pong] [--keep]

1. **Source.** A DQN Replay run of ``--checkpoints`` full-buffer checkpoints of
   ``--capacity`` rows each (the real data: 1,000,000) is written under
   ``benchmarks/.cache/bench_run/``. Frames are 20,000 real ALE frames
   (``ale_frames.record_frames``, random play) tiled along the stream; episodes
   end every 1,000-3,000 steps, followed by dopamine's 3 zero padding rows.
   Observation files are gzip'd with **isal level 1** (``isal.igzip``, fast to
   write; real DQN Replay files use a higher level, which only makes the floor
   slower, not the conversion relatively faster or slower). Built once, reused.
2. **Floor.** One process inflates and parses every observation file with isal
   and the same streaming ``.npy`` reader the converter uses
   (``RunSource.iter_observations``), touching each byte once: the fastest any
   conversion could read its input.
3. **Conversion.** ``atari-zarr convert --scheduler processes --workers W`` for each
   ``W``, in a fresh subprocess, into a fresh store (planning included). Peak
   RSS per worker is ``ru_maxrss`` of the subprocess's children (the Dask worker
   processes), read when the pool has exited.

Throughput is inflated observation bytes (``capacity * checkpoints * 7056``) per
second of wall time. The report is printed as a markdown table and as JSON.
Big files are deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
FRAME_BYTES = 84 * 84


def _save_gz(path: Path, array: np.ndarray) -> None:
    from isal import igzip

    with igzip.open(path, "wb", compresslevel=1) as f:
        np.lib.format.write_array(f, array, allow_pickle=False)


def build_run(
    root: Path, game: str, capacity: int, n_ckpt: int, seed: int = 0,
    frames: np.ndarray | None = None,
) -> Path:
    """Write the run (once); return its directory. ``frames`` are cycled along the stream
    (default: 20,000 frames of random play)."""
    from isal import igzip

    sys.path.insert(0, str(HERE))
    from ale_frames import record_frames

    run_dir = root / game / "1"
    logs = run_dir / "replay_logs"
    stamp = logs / "complete.json"
    want = {"capacity": capacity, "checkpoints": n_ckpt, "seed": seed,
            **({} if frames is None else {"frames": len(frames)})}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return run_dir
    shutil.rmtree(root, ignore_errors=True)
    logs.mkdir(parents=True)
    if frames is None:
        frames = record_frames(game, 20000, seed)
    rng = np.random.default_rng(seed)
    n_rows = n_ckpt * capacity  # source rows -1 .. n_rows - 2
    # the whole stream of per-step data (small: 9 bytes per row)
    action = rng.integers(0, 6, n_rows, dtype=np.int32)
    reward = (rng.random(n_rows) < 0.01).astype(np.float32)
    terminal = np.zeros(n_rows, dtype=np.uint8)
    pad = np.zeros(n_rows, dtype=bool)
    # arrays are indexed by stream position p = source row + 1 (row -1 is never written)
    pad[1:4] = True  # rows 0..2: the padding before the first episode
    row = 4
    while True:
        row += int(rng.integers(1000, 3000))
        if row + 4 >= n_rows:
            break
        terminal[row] = 1
        pad[row + 1 : row + 4] = True
        row += 4
    action[pad] = 0
    reward[pad] = 0
    for k in range(n_ckpt):
        # buffer index i holds source row k*C + i for i < C - 1, and row k*C - 1 at C - 1
        rows = np.concatenate([np.arange(k * capacity, (k + 1) * capacity - 1), [k * capacity - 1]])
        pos = rows + 1
        _save_gz(logs / f"$store$_action_ckpt.{k}.gz", action[pos])
        _save_gz(logs / f"$store$_reward_ckpt.{k}.gz", reward[pos])
        _save_gz(logs / f"$store$_terminal_ckpt.{k}.gz", terminal[pos])
        add_count = (k + 1) * capacity - 1
        _save_gz(logs / f"add_count_ckpt.{k}.gz", np.array(add_count, dtype=np.int64))
        invalid = np.arange(add_count - 1, add_count + 4) % capacity
        _save_gz(logs / f"invalid_range_ckpt.{k}.gz", invalid)
        path = logs / f"$store$_observation_ckpt.{k}.gz"
        t0 = time.perf_counter()
        with igzip.open(path, "wb", compresslevel=1) as f:
            header = {"descr": "|u1", "fortran_order": False, "shape": (capacity, 84, 84)}
            np.lib.format.write_array_header_1_0(f, header)
            block = 20000
            for a in range(0, capacity, block):
                r = rows[a : a + block]
                fr = frames[np.mod(r, len(frames))]
                fr[pad[r + 1]] = 0  # padding rows hold zero frames, as dopamine writes them
                f.write(fr.tobytes())
        print(f"  wrote {path.name}: {path.stat().st_size / 1e9:.2f} GB in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    stamp.write_text(json.dumps(want))
    return run_dir


def measure_floor(run_dir: Path, game: str) -> dict[str, float]:
    """Inflate + parse every observation file once in this process."""
    from atari_zarr.sources.dqn_replay.files import RunSource
    from atari_zarr.sources.dqn_replay.npy import gzip_backend

    src = RunSource(str(run_dir), game, "1")
    t0, c0 = time.perf_counter(), time.process_time()
    total = 0
    for s in src.suffixes:
        cap = src.read_small(s).capacity
        for _, block in src.iter_observations(s, cap, block_rows=1024):
            total += block.nbytes
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cpu_s": time.process_time() - c0, "bytes": total,
            "MBps": total / seconds / 1e6,
            "gzip": gzip_backend()}


def _convert_child(args: argparse.Namespace) -> None:
    """Run inside a fresh process: convert, then report times and children's peak RSS."""
    import resource

    from atari_zarr import convert

    t0 = time.perf_counter()
    [store] = convert(args.source, args.dest, scheduler="processes", workers=args.w,
                      progress=False)
    seconds = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "seconds": seconds,
        "transitions": store.transitions,
        # Linux reports kilobytes; children = the (exited) Dask worker processes.
        # (This process's own ru_maxrss is not reported: Linux carries it over from
        # the parent across fork + exec, so it would show the benchmark's, not ours.)
        "worker_peak_rss_MB": children.ru_maxrss / 1024,
        # CPU time is what a worker costs whatever else runs on the machine
        "worker_cpu_s": children.ru_utime + children.ru_stime,
    }))


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--game", default="Pong")
    p.add_argument("--keep", action="store_true", help="keep the source and stores")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--source", help=argparse.SUPPRESS)
    p.add_argument("--dest", help=argparse.SUPPRESS)
    p.add_argument("--w", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _convert_child(args)
        return

    root = CACHE / "bench_run"
    t0 = time.perf_counter()
    run_dir = build_run(root, args.game, args.capacity, args.checkpoints)
    print(f"source ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    source_gz = _du(run_dir)
    floor = measure_floor(run_dir, args.game)
    print(f"floor: {floor['MBps']:.0f} MB/s", file=sys.stderr)
    results = []
    try:
        for w in args.workers:
            dest = CACHE / f"bench_dest_{w}"
            shutil.rmtree(dest, ignore_errors=True)
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--source", str(run_dir), "--dest", str(dest),
                 "--w", str(w)],
                capture_output=True, text=True, check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["workers"] = w
            r["MBps"] = floor["bytes"] / r["seconds"] / 1e6
            r["MBps_per_worker"] = r["MBps"] / w
            r["store_bytes"] = _du(dest)
            r["MB_per_worker_cpu_s"] = floor["bytes"] / r["worker_cpu_s"] / 1e6
            results.append(r)
            print(f"workers={w}: {r['seconds']:.1f} s", file=sys.stderr)
            shutil.rmtree(dest, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    base = results[0]["MBps"] if results else float("nan")
    load = os.getloadavg()
    print(f"\nConversion of {args.checkpoints} × {args.capacity:,}-frame checkpoints of "
          f"{args.game} ({floor['bytes'] / 1e9:.1f} GB of frames inflated, {source_gz / 1e9:.2f} GB "
          f"gzip'd at isal level 1); {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load average {load[0]:.1f} at the end.\n")
    print("| | wall s | MB/s | MB/s per worker | vs floor | scaling | worker CPU s | "
          "MB per worker CPU s | peak RSS per worker |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| floor (isal gunzip + .npy parse, 1 process) | {floor['seconds']:.1f} | "
          f"{floor['MBps']:.0f} | {floor['MBps']:.0f} | 100% | | {floor['cpu_s']:.1f} | "
          f"{floor['bytes'] / floor['cpu_s'] / 1e6:.0f} | |")
    for r in results:
        print(f"| convert, {r['workers']} worker(s) | {r['seconds']:.1f} | {r['MBps']:.0f} | "
              f"{r['MBps_per_worker']:.0f} | {r['MBps_per_worker'] / floor['MBps']:.0%} | "
              f"{r['MBps'] / base:.2f}× | {r['worker_cpu_s']:.1f} | "
              f"{r['MB_per_worker_cpu_s']:.0f} | {r['worker_peak_rss_MB']:.0f} MB |")
    print()
    print(json.dumps({"floor": floor, "convert": results, "source_gz_bytes": source_gz}, indent=1))


if __name__ == "__main__":
    main()
