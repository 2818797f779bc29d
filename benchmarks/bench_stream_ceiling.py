"""The epoch stream against 10x TorchRL's random-256, beside what the machine's memory allows.

One command::

    python benchmarks/bench_stream_ceiling.py --torchrl-rate 54457

It measures, on this machine:

* how fast memory copies: ``np.copyto`` of 256 MB on one thread and on two;
* the stream's gather alone: batches of 256 transitions (2 frames each, frame stack 1)
  taken out of a slab the size and kind of the stream's (260 MB, ``resident``), into
  memory reused from batch to batch, as the stream gathers them: with ``np.take`` on
  the calling thread, and
  with the gathering thread of ``atari_zarr.storage.row_gather`` while the calling
  thread waits (and so copies rows too: two threads);
* the slab made resident: one ``MAP_POPULATE`` mapping (one thread) against
  ``atari_zarr.read.pool.resident`` (a thread per core);
* the stream itself: ``stream(256)`` over the real Pong play of
  ``benchmarks/stream_data.py`` (``--steps`` transitions), ``--epochs`` epochs, each
  epoch's time and how long its first batch waited, and the CPU each of its threads
  used in the epochs after the first (Linux).

From these it prints the bytes ``--epochs`` epochs move through memory (their gathers,
and the decoded frames written into the slab), the time that takes at the two-thread
copy rate, and the time 10x ``--torchrl-rate`` (TorchRL's random-256 in transitions
per second, as ``bench_cores.py`` measures it) leaves for those epochs. The result goes
to ``benchmarks/results/stream-ceiling-<time>.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
FRAME = (84, 84)
FRAME_BYTES = 84 * 84


def copy_rate(threads: int, nbytes: int = 256 << 20, repeats: int = 7) -> float:
    """Bytes per second ``np.copyto`` copies, split between ``threads`` threads."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    dst[:] = 0  # its pages resident before the clock starts
    cuts = np.linspace(0, nbytes, threads + 1).astype(np.int64)

    def part(i: int) -> None:
        np.copyto(dst[cuts[i] : cuts[i + 1]], src[cuts[i] : cuts[i + 1]])

    times = []
    for _ in range(repeats):
        others = [threading.Thread(target=part, args=(i,)) for i in range(1, threads)]
        t = time.perf_counter()
        for th in others:
            th.start()
        part(0)
        for th in others:
            th.join()
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times)


def gather_seconds(slab_frames: int, batch: int = 256, batches: int = 400) -> dict[str, float]:
    """Median seconds of one batch's gather, ``np.take`` and the gathering thread (the
    caller waiting): ``batch`` items of 2 frames each out of a slab of ``slab_frames``
    frames, into reused memory."""
    from atari_zarr.read.pool import resident
    from atari_zarr.storage.row_gather import gatherer

    # memory as the stream's slab is (4 KB pages, made resident at once): np.ones of
    # this size may get transparent huge pages, on which a random row is cheaper to find
    slab = resident((slab_frames, *FRAME))
    slab[:] = 1
    out = np.empty((2 * batch, *FRAME), dtype=np.uint8)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {"np.take": [], "gathering thread": []}
    with gatherer() as rows:
        for _ in range(batches):
            first = rng.integers(0, slab_frames - 1, batch)
            at = np.concatenate([first, first + 1])  # observations, then next ones
            t = time.perf_counter()
            np.take(slab, at, axis=0, out=out, mode="clip")
            times["np.take"].append(time.perf_counter() - t)
            t = time.perf_counter()
            rows.submit(slab, at, out).wait()
            times["gathering thread"].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def thread_cpu() -> dict[str, float]:
    """CPU seconds each thread of this process used so far, by thread (Linux's
    ``/proc/self/task``; empty elsewhere). A thread that ended is not there."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for task in Path("/proc/self/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Python's own threads keep the process's name: the stream's are those that decode
        role = "loop" if task.name == str(os.getpid()) else name.replace("python", "decoding")
        out[f"{role} {task.name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def resident_seconds(nbytes: int, repeats: int = 5) -> dict[str, float]:
    """Median seconds to make ``nbytes`` resident: one ``MAP_POPULATE`` mapping (one
    thread), and ``atari_zarr.read.pool.resident`` (a thread per core where it can)."""
    import mmap

    from atari_zarr.read.pool import resident

    times: dict[str, list[float]] = {"MAP_POPULATE, one thread": [], "resident": []}
    for _ in range(repeats):
        t = time.perf_counter()
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        times["MAP_POPULATE, one thread"].append(time.perf_counter() - t)
        m.close()
        t = time.perf_counter()
        a = resident((nbytes,))
        times["resident"].append(time.perf_counter() - t)
        del a
    return {name: statistics.median(v) for name, v in times.items()}


def stream_epochs(store: str, epochs: int) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Each epoch of ``stream(256)``: its seconds and its first batch's wait; and the CPU
    seconds of the epochs after the first, by thread (the loop's, the gathering thread
    ``atari_zarr-rows``, the decoding threads), summed over those epochs. A thread's CPU is
    read every 10 ms by a watcher (the threads of an epoch end with it)."""
    import torch

    torch.set_num_threads(1)
    from atari_zarr import AtariZarrDataset

    stream = AtariZarrDataset(store).stream(256, seed=0)
    seen: dict[str, float] = {}  # the last CPU seen of each thread
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.01):
            seen.update(thread_cpu())

    out = []
    start: dict[str, float] = {}
    watcher = threading.Thread(target=watch, name="watcher", daemon=True)
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        if epoch == 1:
            seen.update(thread_cpu())
            start = dict(seen)
            watcher.start()
        t = time.perf_counter()
        first, items = None, 0
        for batch in stream:
            if first is None:
                first = time.perf_counter() - t
            items += len(batch)
        out.append({"seconds": time.perf_counter() - t, "first_batch": first or 0.0})
    stop.set()
    if watcher.is_alive():
        watcher.join()
    seen.update(thread_cpu())
    cpu: dict[str, float] = {}
    for key, used in seen.items():
        role = key.rsplit(" ", 1)[0]
        if role != "watcher":
            cpu[role] = cpu.get(role, 0.0) + used - start.get(key, 0.0)
    return out, cpu


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument(
        "--torchrl-rate",
        type=float,
        required=True,
        help="TorchRL's random-256, transitions/s (bench_cores.py's 'torchrl random-256')",
    )
    args = p.parse_args(argv)
    from stream_data import build_run

    meta = build_run("Pong", args.steps)
    n = int(meta["n"])
    from atari_zarr.read.units import DEFAULT_SHUFFLE_BUFFER, DEFAULT_UNITS_AHEAD, slot_frames

    one, two = copy_rate(1), copy_rate(2)
    # the default stream's slab: (window + 1 + units ahead) slots, each a unit (a shard
    # of 4,096 rows) with the frames just outside it
    unit_rows = 4096
    window = max(1, DEFAULT_SHUFFLE_BUFFER // unit_rows)
    gather = gather_seconds((window + 1 + DEFAULT_UNITS_AHEAD) * slot_frames(unit_rows))
    slab_bytes = (window + 1 + DEFAULT_UNITS_AHEAD) * slot_frames(unit_rows) * FRAME_BYTES
    populate = resident_seconds(slab_bytes)
    epochs, cpu = stream_epochs(str(meta["store"]), args.epochs)
    batches = -(-n // 256)
    moved = args.epochs * (batches * 256 * 2 * FRAME_BYTES + n * FRAME_BYTES)
    budget = args.epochs * n / (10 * args.torchrl_rate)
    wall = sum(e["seconds"] for e in epochs)
    print(f"copy: {one / 1e9:.1f} GB/s on one thread, {two / 1e9:.1f} GB/s on two")
    for name, seconds in gather.items():
        print(
            f"the stream's gather alone, {name}: {seconds * 1e3:.3f} ms a batch "
            f"({2 * 256 * FRAME_BYTES / seconds / 1e9:.1f} GB/s)"
        )
    for name, seconds in populate.items():
        print(f"the slab ({slab_bytes / 1e6:.0f} MB) made resident, {name}: {seconds * 1e3:.0f} ms")
    later = max(1, args.epochs - 1)
    print(
        f"CPU a later epoch: {sum(cpu.values()) / later * 1e3:.0f} ms, "
        + ", ".join(f"{role} {used / later * 1e3:.0f} ms" for role, used in sorted(cpu.items()))
    )
    for i, e in enumerate(epochs):
        print(
            f"epoch {i}: {e['seconds'] * 1e3:.0f} ms, its first batch after "
            f"{e['first_batch'] * 1e3:.0f} ms"
        )
    print(
        f"{args.epochs} epochs: {wall * 1e3:.0f} ms ({args.epochs * n / wall:,.0f}/s, "
        f"{args.epochs * n / wall / args.torchrl_rate:.2f}x TorchRL); they move "
        f"{moved / 1e9:.1f} GB through memory, {moved / two * 1e3:.0f} ms at the two-thread "
        f"copy rate, of the {budget * 1e3:.0f} ms that 10x TorchRL allows"
    )
    from result_file import save_result

    out = save_result(
        "stream-ceiling",
        args=vars(args),
        copy_bytes_per_s={"1 thread": one, "2 threads": two},
        gather_seconds_per_batch=gather,
        slab_bytes=slab_bytes,
        resident_seconds=populate,
        epochs=epochs,
        later_epochs_cpu_s_by_thread=cpu,
        bytes_moved=moved,
        seconds_at_two_thread_copy=moved / two,
        seconds_allowed_at_10x=budget,
    )
    print(out)


if __name__ == "__main__":
    main()
