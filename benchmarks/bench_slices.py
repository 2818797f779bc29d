"""TorchRL's slice samplers over the drop-in's storage, at real size, against ``windows(K)``.

One command::

    python benchmarks/bench_slices.py --sizes 5,50 --torchrl-size 1000000

Data: the stores ``benchmarks/bench_fullsize.py --keep`` leaves in
``benchmarks/.cache/fullsize/zarr_{S}`` (``S`` checkpoints of 1,000,000 transitions of
Pong frames: ``--checkpoints 50 --sizes 5,50 --keep``), and for TorchRL's own storage the
run ``benchmarks/bench_random.py`` builds and caches at ``--torchrl-size`` transitions
(our store of it and TorchRL's ``_AtariStorage``, by TorchRL's own preprocessing).

Each measure runs in a fresh process, torch at one intra-op thread, and reports the time
from opening the store to the first batch, then batches per second over ``--seconds``
(after one second of warm-up), the process's peak RSS growth over its RSS once the store
is open, the read budget (the decoded-frame cache), and the time TorchRL's sampler takes
alone per batch (its indices and priority updates, no row read):

* ``slice``: ``SliceSampler(slice_len=30)`` as the drop-in builds it (``trajectories`` =
  the episode ids, ``cache_values=True``), batches of 32 x 30 at frame stack 4;
* ``slice-traj-key`` and ``slice-end-key``: ``SliceSampler(slice_len=30,
  traj_key="episode")`` and ``(end_key=("next", "done"))``, with ``cache_values=True``:
  the trajectories found through ``storage[:][key]``, what a user's own sampler does;
* ``prioritized-slice``: ``PrioritizedSliceSampler(slice_len=30)`` with its priorities
  updated after every batch (random values), in ``.venv-torchrl`` (torch 2.14, which
  TorchRL 0.14's C++ extension needs; ``--prioritized-python``);
* ``windows``: ``AtariZarrDataset(frame_stack=4).windows(30).sample(32)``, the reference;
* at ``--torchrl-size``: ``slice`` at frame stack 1 over our store and over TorchRL's
  ``_AtariStorage`` with the sampler TorchRL's ``AtariDQNExperienceReplay`` builds.

Each at the default read budget and at a frame cache of 2% of the run's frames. Results
go to ``benchmarks/results/slices-<time>.json`` and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
FULLSIZE = HERE / ".cache" / "fullsize"
RANDOM = HERE / ".cache" / "random"
K, SLICES, STACK = 30, 32, 4
FRAME_BYTES = 84 * 84


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _rss_mb() -> float:
    return _status_mb("VmRSS")


def _peak_mb() -> float:
    # this process's own peak: ru_maxrss carries the parent's over fork and exec
    return _status_mb("VmHWM")


def child(kind: str, url: str, cache: str, seconds: float, stack: int) -> dict:
    """One measure, in this (fresh) process."""
    import torch

    torch.set_num_threads(1)
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers import SliceSampler

    from atari_zarr import AtariZarrDataset, ReadOptions

    t0 = time.perf_counter()
    rss0 = _rss_mb()
    if kind == "torchrl":
        from torchrl.data.datasets.atari_dqn import _AtariStorage

        storage = _AtariStorage(url)
        n, budget = len(storage), 0
    else:
        options = ReadOptions()
        n_rows = len(AtariZarrDataset(url))
        budget = options.frame_cache_limit()
        if cache != "default":
            budget = min(budget, int(float(cache) / 100 * n_rows * FRAME_BYTES))
            options = ReadOptions(frame_cache_bytes=budget)
        dataset = AtariZarrDataset(url, frame_stack=stack, options=options)
        n = len(dataset)
    if kind == "windows":
        windows = dataset.windows(K)
        generator = torch.Generator().manual_seed(0)

        def batch() -> int:
            return int(windows.sample(SLICES, generator=generator).batch_size.numel())

    else:
        from atari_zarr.torchrl import AtariZarrStorage

        if kind != "torchrl":
            storage = AtariZarrStorage(dataset)
        done = ("next", "done")
        update = kind == "prioritized-slice"
        if kind in ("slice", "torchrl"):
            sampler = SliceSampler(slice_len=K, trajectories=storage.episodes, cache_values=True)
        elif kind == "slice-traj-key":
            sampler = SliceSampler(slice_len=K, traj_key="episode", cache_values=True)
        elif kind == "slice-end-key":
            sampler = SliceSampler(slice_len=K, end_key=done, cache_values=True)
        elif kind == "prioritized-slice":
            from torchrl.data.replay_buffers import PrioritizedSliceSampler

            sampler = PrioritizedSliceSampler(
                max_capacity=n,
                alpha=0.7,
                beta=0.9,
                slice_len=K,
                trajectories=storage.episodes,
                cache_values=True,
            )
        else:
            raise SystemExit(f"unknown kind {kind}")
        rb = TensorDictReplayBuffer(
            storage=storage,
            sampler=sampler,
            batch_size=SLICES * K,
            **({"collate_fn": lambda x: x} if kind == "torchrl" else {}),
        )
        rng = torch.Generator().manual_seed(0)

        def batch() -> int:
            sample = rb.sample()
            if update:
                rb.update_priority(sample["index"], torch.rand(len(sample), generator=rng))
            return len(sample)

    opened = time.perf_counter() - t0
    rss_open = _rss_mb()
    batch()
    first = time.perf_counter() - t0
    warm_end = time.perf_counter() + 1.0
    while time.perf_counter() < warm_end:
        batch()
    count, t1 = 0, time.perf_counter()
    while time.perf_counter() - t1 < seconds:
        batch()
        count += 1
    wall = time.perf_counter() - t1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sampler_ms = None
    if kind != "windows":  # TorchRL's sampler alone: its indices, no row read
        t2, calls = time.perf_counter(), 0
        while time.perf_counter() - t2 < min(seconds, 5.0):
            index, _ = rb.sampler.sample(storage, SLICES * K)
            if update:
                rows = index[0] if isinstance(index, tuple) else index
                rb.update_priority(rows, torch.rand(len(rows), generator=rng))
            calls += 1
        sampler_ms = round((time.perf_counter() - t2) / calls * 1e3, 2)
    return {
        "kind": kind,
        "rows": n,
        "stack": stack,
        "cache": cache,
        "budget_MB": round(budget / 1e6),
        "open_s": round(opened, 2),
        "first_batch_s": round(first, 2),
        "batches_per_s": round(count / wall, 2),
        "transitions_per_s": round(count * SLICES * K / wall),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "rss_at_open_MB": round(rss_open - rss0),
        "peak_growth_MB": round(_peak_mb() - rss_open),
        "sampler_ms": sampler_ms,
    }


def _run(python: str, argv: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [python, __file__, *argv], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"{argv} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _store(path: Path) -> str:
    found = sorted(path.glob("*/*.zarr"))
    if not found:
        raise SystemExit(f"no store under {path}: run benchmarks/bench_fullsize.py --keep first")
    return str(found[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="5,50", help="checkpoints of the kept fullsize stores")
    p.add_argument("--caches", default="default,2", help="'default' or a percent of frames")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--torchrl-size", type=int, default=1_000_000, help="0: not measured")
    p.add_argument(
        "--prioritized-python",
        default=str(REPO / ".venv-torchrl" / "bin" / "python"),
        help="a Python whose torch loads TorchRL's C++ extension ('' to skip)",
    )
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, url, cache, seconds, stack = args.child
        print(json.dumps(child(kind, url, cache, float(seconds), int(stack))))
        return
    kinds = ["slice", "slice-traj-key", "slice-end-key", "windows"]
    runs: list[tuple[str, str, str, str, int]] = []  # python, kind, url, cache, stack
    for size in [int(s) for s in args.sizes.split(",") if s]:
        url = _store(FULLSIZE / f"zarr_{size}")
        for cache in args.caches.split(","):
            runs += [(sys.executable, kind, url, cache, STACK) for kind in kinds]
            if args.prioritized_python:
                runs.append((args.prioritized_python, "prioritized-slice", url, cache, STACK))
    if args.torchrl_size:
        from bench_random import build

        env = build(RANDOM / str(args.torchrl_size), args.torchrl_size)
        runs.append((sys.executable, "slice", env["store"], "default", 1))
        runs.append((sys.executable, "torchrl", str(env["trl_path"]), "default", 1))
        runs.append((sys.executable, "slice", env["store"], "default", STACK))
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.processor()}",
        "seconds": args.seconds,
        "runs": [],
    }
    for _ in range(args.rounds):
        for python, kind, url, cache, stack in runs:
            r = _run(python, ["--child", kind, url, cache, str(args.seconds), str(stack)])
            results["runs"].append(r)
            print(json.dumps(r), flush=True)
    out = HERE / "results" / f"slices-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"results: {out}")
    print(
        "| rows | kind | stack | cache | first batch s | batches/s | sampler ms | peak growth MB |"
    )
    print("|--:|---|--:|---|--:|--:|--:|--:|")
    groups: dict[tuple, list[dict]] = {}
    for r in results["runs"]:
        groups.setdefault((r["rows"], r["kind"], r["stack"], r["cache"]), []).append(r)
    for (rows, kind, stack, cache), rs in groups.items():
        rate = statistics.median(r["batches_per_s"] for r in rs)
        first = statistics.median(r["first_batch_s"] for r in rs)
        growth = max(r["peak_growth_MB"] for r in rs)
        sampler = rs[0]["sampler_ms"]
        print(
            f"| {rows:,} | {kind} | {stack} | {cache} | {first} | {rate} | {sampler} | {growth} |"
        )


if __name__ == "__main__":
    main()
