"""The stream's first epoch in a fresh process, on memory the machine has to back first.

One command::

    python benchmarks/bench_fresh_memory.py --runs 6

A stream's first epoch makes its slab of decoded units resident (260 MB by default,
``atari_zarr.read.pool.resident``); later epochs reuse it. How long that takes is the
machine's: on a virtual machine whose guest reports free memory to its host (Linux's
free page reporting, ``page_reporting.page_reporting_order`` on the kernel command
line), memory a process frees goes back to the host within seconds, and the next
first touch of it waits for the host to back it again.

Each run is a fresh process, as ``bench_cores.py`` measures the stream, started
``--pause`` seconds after the one before (long enough for freed memory to be
reported), and the kinds alternate:

* ``touch``: 1 GiB mapped and made resident (``madvise(MADV_POPULATE_WRITE)`` on one
  thread), the first time in the process (``fresh``), then again after it was
  unmapped (``again``: the pages the process has just freed, still backed);
* ``stream fresh``: ``stream(256)``, defaults, ``--epochs`` epochs over the real Pong
  play of ``benchmarks/stream_data.py`` (``--steps`` transitions), each epoch's time,
  its first batch's wait, and how long the slab took to be made resident (timed around
  ``resident``);
* ``stream backed``: the same after the process touched and freed 1 GiB (so the slab
  is made of pages the machine has backed): the difference in the first epoch is what
  fresh memory costs here.

The result goes to ``benchmarks/results/fresh-memory-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
GIB = 1 << 30


def touch(nbytes: int) -> float:
    """Seconds to map ``nbytes`` and make it resident on one thread (then unmapped)."""
    from atari_zarr.read.pool import _MADV_POPULATE_WRITE, _libc

    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(memory, dtype=np.uint8).ctypes.data
    t = time.perf_counter()
    if _libc().madvise(base, nbytes, _MADV_POPULATE_WRITE):
        raise OSError("madvise(MADV_POPULATE_WRITE) refused: Linux 5.14 or later")
    seconds = time.perf_counter() - t
    memory.close()
    return seconds


def child(kind: str, store: str, epochs: int) -> dict:
    """One run of ``kind`` in this process."""
    if kind == "touch":
        fresh = touch(GIB)
        again = touch(GIB)
        return {"fresh_gb_per_s": GIB / fresh / 1e9, "again_gb_per_s": GIB / again / 1e9}
    import torch

    torch.set_num_threads(1)
    import atari_zarr.read.units as units
    from atari_zarr import AtariZarrDataset

    if kind == "stream backed":
        touch(GIB)
    made: list[float] = []
    real = units.resident

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = real(*args, **kwargs)
        made.append(time.perf_counter() - t)
        return out

    units.resident = timed
    stream = AtariZarrDataset(store).stream(256, seed=0)
    seconds, firsts, items = [], [], 0
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        t, first = time.perf_counter(), None
        for batch in stream:
            if first is None:
                first = time.perf_counter() - t
            items += len(batch)
        seconds.append(time.perf_counter() - t)
        firsts.append(first or 0.0)
    return {
        "epoch_seconds": seconds,
        "first_batch_seconds": firsts,
        "slab_seconds": made,
        "rate": items / sum(seconds),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=6, help="runs of each kind")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--pause", type=float, default=4.0, help="seconds between runs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.store, args.epochs)))
        return
    from stream_data import build_run

    store = str(build_run("Pong", args.steps)["store"])
    kinds = ("touch", "stream fresh", "stream backed")
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for _ in range(args.runs):
        for kind in kinds:
            time.sleep(args.pause)
            cmd = [sys.executable, __file__, "--child", kind, "--store", store]
            cmd += ["--epochs", str(args.epochs)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[kind].append(json.loads(out.strip().splitlines()[-1]))
    med = statistics.median
    touched = runs["touch"]
    print(
        f"1 GiB made resident: fresh {med(r['fresh_gb_per_s'] for r in touched):.2f} GB/s, "
        f"again {med(r['again_gb_per_s'] for r in touched):.2f} GB/s (medians of {args.runs})"
    )
    for kind in kinds[1:]:
        rs = runs[kind]
        print(
            f"{kind}: slab {med(r['slab_seconds'][0] for r in rs) * 1e3:.0f} ms, "
            f"first epoch {med(r['epoch_seconds'][0] for r in rs) * 1e3:.0f} ms "
            f"(first batch {med(r['first_batch_seconds'][0] for r in rs) * 1e3:.0f} ms), "
            f"later epochs {med(med(r['epoch_seconds'][1:]) for r in rs) * 1e3:.0f} ms, "
            f"{args.epochs} epochs {med(r['rate'] for r in rs):,.0f}/s (medians of {args.runs})"
        )
    cmdline = Path("/proc/cmdline").read_text() if Path("/proc/cmdline").exists() else ""
    from result_file import save_result

    out = save_result(
        "fresh-memory",
        args={k: v for k, v in vars(args).items() if k not in ("child", "store")},
        page_reporting=[w for w in cmdline.split() if w.startswith("page_reporting")],
        runs=runs,
    )
    print(out)


if __name__ == "__main__":
    main()
