"""Grain's source against the dataset it wraps: ``AtariZarrSource._getitems`` vs ``sample()``.

One command::

    python benchmarks/bench_grain.py              # 100k real Pong rows, batches of 256

Data: the real Pong play that ``benchmarks/stream_data.py`` builds and caches (its store
of 100,000 transitions). Random TED batches of 256 with 4-frame stacks, the same index
batches on both sides:

* ``sample()``: ``AtariZarrDataset.__getitems__`` (what ``sample`` reads once it has drawn
  its rows), a TensorDict;
* ``_getitems``: ``AtariZarrSource._getitems`` (Grain's batched read of a
  ``RandomAccessDataSource``), records as nested dicts of numpy arrays (views of one
  batch); ``_getitems+batch``: then stacked into one batch as Grain's ``Batch`` does (a
  copy of every frame stack: what the record protocol costs);
* ``read_batch``: ``AtariZarrSource.read_batch``, the batch as one nested dict, what
  ``grain.MapDataset.range(n).shuffle(...).batch(256).map(source.read_batch)`` reads;
* the same through Grain's own ``MapDataset.source(...).batch(256)``: in grain 0.2.18
  its batch pushdown is switched off, so it reads record by record (``__getitem__``);
  shown for what that pipeline gets today.

At 1 worker one process reads; at 2, two processes (spawned) read at once, each its
share of the batches. In each process the sides read batch by batch in turn, so that
each meets the same caches and the same other process beside it; every round starts in
fresh processes, each reader warmed as a trained-on reader is. Items per second (wall)
and CPU milliseconds per 1,000 items are medians over rounds.

Figures go to ``benchmarks/results/grain-<date>.json`` and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BATCH = 256
STACK = 4


def _stack(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Records into one batch, key by key (what Grain's ``Batch`` does to a tree)."""
    first = records[0]
    return {
        k: _stack([r[k] for r in records])
        if isinstance(v, dict)
        else np.stack([r[k] for r in records])
        for k, v in first.items()
    }


def _reader(side: str, store: str) -> Any:
    from atari_zarr import AtariZarrDataset
    from atari_zarr.grain import AtariZarrSource

    if side == "sample":
        ds = AtariZarrDataset(store, frame_stack=STACK)
        return lambda idx: ds[idx]
    source = AtariZarrSource(store, frame_stack=STACK)
    if side == "getitems":
        return lambda idx: source._getitems(list(idx))
    if side == "getitems+batch":
        return lambda idx: _stack(source._getitems(list(idx)))
    if side == "read_batch":
        return lambda idx: source.read_batch(idx)
    import grain

    # per record, as MapDataset.batch reads in grain 0.2.18
    records = grain.MapDataset.source(source)
    return lambda idx: _stack([records[int(i)] for i in idx])


def _work(args: tuple[list[str], str, list[list[int]], int]) -> dict[str, tuple[float, float, int]]:
    """Read ``batches`` with every side, batch by batch in turn (after ``warm`` of them):
    per side (wall s, CPU s, items). In turn, so that each side meets the same state of
    the machine: the same caches, the same other process beside it."""
    sides, store, batches, warm = args
    readers = {side: _reader(side, store) for side in sides}
    for idx in batches[:warm]:
        for read in readers.values():
            read(np.asarray(idx))
    spent = {side: [0.0, 0.0, 0] for side in sides}
    for idx in batches[warm:]:
        for side, read in readers.items():
            cpu0, t0 = time.process_time(), time.perf_counter()
            read(np.asarray(idx))
            s = spent[side]
            s[0] += time.perf_counter() - t0
            s[1] += time.process_time() - cpu0
            s[2] += len(idx)
    return {side: (s[0], s[1], int(s[2])) for side, s in spent.items()}


def _round(
    sides: list[str], store: str, batches: list[list[int]], workers: int, warm: int
) -> dict[str, dict[str, float]]:
    ctx = mp.get_context("spawn")
    shares = [batches[w::workers] for w in range(workers)]
    with ctx.Pool(workers) as pool:
        # the workers read at once, each its share, every side in turn
        results = pool.map(_work, [(sides, store, share, warm) for share in shares])
    out = {}
    for side in sides:
        wall = max(r[side][0] for r in results)
        cpu = sum(r[side][1] for r in results)
        items = sum(r[side][2] for r in results)
        out[side] = {"items_per_s": items / wall, "cpu_ms_per_1k": cpu / items * 1e6}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=120, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    from stream_data import build_run

    built = build_run("Pong", args.rows)
    store = built["store"] if isinstance(built, dict) else str(built)
    from atari_zarr import AtariZarrDataset

    n = len(AtariZarrDataset(store))
    rng = np.random.default_rng(0)
    warm = 40  # the frame cache filled as a warm reader's is
    batches = [rng.integers(0, n, BATCH).tolist() for _ in range(args.batches + warm)]
    # each reader against sample() in the same processes, batch by batch in turn
    others = ["getitems", "read_batch", "getitems+batch", "grain-per-record"]
    figures: dict[str, dict[int, list[dict]]] = {s: {1: [], 2: []} for s in others}
    slow = max(4, args.batches // 10)  # Grain's per-record path: fewer batches
    for r in range(args.rounds):
        for workers in (1, 2):
            for side in others:
                count = args.batches if side != "grain-per-record" else slow
                share = [b for _ in range(workers) for b in batches[: warm + count]]
                figures[side][workers].append(_round(["sample", side], store, share, workers, warm))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    summary: dict[str, Any] = {}
    lines = [
        "| reader | workers | items/s | CPU ms / 1k items | sample() beside it | vs sample() |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for workers in (1, 2):
        for side in others:
            rounds = figures[side][workers]
            rate = statistics.median(x[side]["items_per_s"] for x in rounds)
            cpu = statistics.median(x[side]["cpu_ms_per_1k"] for x in rounds)
            base = statistics.median(x["sample"]["items_per_s"] for x in rounds)
            ratio = statistics.median(
                x[side]["items_per_s"] / x["sample"]["items_per_s"] for x in rounds
            )
            summary[f"{side}@{workers}"] = {
                "items_per_s": rate,
                "cpu_ms_per_1k": cpu,
                "sample_items_per_s": base,
                "ratio": ratio,
            }
            lines.append(
                f"| {side} | {workers} | {rate:,.0f} | {cpu:,.1f} | {base:,.0f} | {ratio:.2f}x |"
            )
    print("\n".join(lines))
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "rows": n,
        "batch": BATCH,
        "frame_stack": STACK,
        "rounds": args.rounds,
        "batches": args.batches,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "summary": summary,
        "raw": figures,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"grain-{time.strftime('%Y%m%dT%H%M')}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"-> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
