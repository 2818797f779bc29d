"""Random TED-256 (stack 4) against Lance 2.1's ``take`` of the same frames, at millions of rows.

The six-game corpus (``bench_corpus.py``) compares the two on 50,000 frames. This
builds Lance 2.1 from the first ``--transitions`` frames of the kept 50-checkpoint store
of ``bench_fullsize.py --keep`` (the same frames, read back from the store, in order, by
``bench_corpus.build_lance``; cached under ``benchmarks/.cache/fullsize/lance21_<n>``) and
times, in turn and ``--rounds`` times:

* ours: ``AtariZarrDataset(frame_stack=4)`` at random batches of 256 rows below
  ``--transitions`` (at most the store's rows), its decoded-frame cache 2% of those
  rows' frames, at most the default (a quarter of memory);
* Lance 2.1: ``take`` of the same 5 frames per transition (stack 4 and the next frame),
  as in ``bench_corpus.py``.

Both are warm in the page cache: every file of the Lance dataset and of the store is
read once before the rounds.

Each reader runs ``--warmup`` seconds before it is timed for ``--seconds``::

    python benchmarks/bench_lance_scale.py --transitions 5000000 --rounds 3

``--checkpoints 5`` reads the store of ``bench_fullsize.py --checkpoints 5 --sizes 5
--keep`` instead (5M transitions, built in minutes).

Results go to ``benchmarks/results/lance-scale-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CACHE = HERE / ".cache" / "fullsize"

def store_of(checkpoints: int) -> Path:
    """The store of the first ``checkpoints`` checkpoints kept by ``bench_fullsize.py``."""
    return CACHE / f"zarr_{checkpoints}" / "Pong" / "1.zarr"
FRAME_BYTES = 84 * 84


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transitions", type=int, default=5_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--checkpoints", type=int, default=50,
                   help="the kept store of this many checkpoints (bench_fullsize.py --keep)")
    args = p.parse_args()
    STORE = store_of(args.checkpoints)
    if not STORE.exists():
        raise SystemExit(
            f"{STORE} is missing: run bench_fullsize.py --checkpoints {args.checkpoints} "
            f"--sizes {args.checkpoints} --keep first"
        )
    import torch

    torch.set_num_threads(1)
    import zarr
    from bench_corpus import build_lance, dir_bytes, lance_take, rate

    from atari_zarr import AtariZarrDataset, ReadOptions

    frames = zarr.open_group(str(STORE), mode="r")["observation"]
    n = min(args.transitions, frames.shape[0])  # the whole run: --transitions 50000000
    t0 = time.perf_counter()
    root = CACHE / f"lance21_{n}"
    cached = (root / "frames-2.1.lance" / "_versions").exists()
    uri = build_lance(root, frames, "2.1", rows=n)
    build_s = None if cached else round(time.perf_counter() - t0, 1)  # None: built before
    lance_bytes = dir_bytes(uri)
    # both warm in the page cache: every file of the Lance dataset and of the store read
    # once (a dataset just written, or read at random for seconds, is only partly there)
    t1 = time.perf_counter()
    for path in [*Path(uri).rglob("*"), *STORE.rglob("*")]:
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
    warm_s = round(time.perf_counter() - t1, 1)
    print(f"read {lance_bytes + dir_bytes(STORE):,} bytes into the page cache in {warm_s} s")
    cache = min(ReadOptions().frame_cache_limit(), int(0.02 * n * FRAME_BYTES))
    ds = AtariZarrDataset(str(STORE), frame_stack=4,
                          options=ReadOptions(frame_cache_bytes=cache))
    ours, take = (lambda rows: ds[rows]), lance_take(uri)
    runs: dict[str, list[float]] = {"ours": [], "Lance 2.1 take": []}
    for r in range(args.rounds):
        for name, fn in (("ours", ours), ("Lance 2.1 take", take)):
            runs[name].append(round(rate(fn, n, args.seconds, seed=r, warmup=args.warmup)))
            print(name, runs[name][-1], flush=True)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "store": str(STORE),
        "transitions": n, "cache_bytes": cache, "seconds": args.seconds, "warmup": args.warmup,
        "lance_build_s": build_s, "lance_bytes_per_frame": round(lance_bytes / n, 1),
        "page_cache_warm_s": warm_s,
        "random_stack4": {k: round(statistics.median(v)) for k, v in runs.items()},
        "runs": runs,
    }
    out = HERE / "results" / f"lance-scale-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps({k: results[k] for k in ("random_stack4", "lance_bytes_per_frame")}))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
