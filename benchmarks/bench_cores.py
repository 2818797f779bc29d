"""Random access on every core: the targets of one table, both sides of each in one run.

One command::

    python benchmarks/bench_cores.py --rounds 3

Data: the real Pong play of ``benchmarks/stream_data.py`` (``--steps`` transitions;
random policy, DQN Replay's preprocessing), its store, TorchRL's AtariDQN storage of
it, a Lance 2.1 dataset of its frames and a root of hard-linked copies of the store
with a catalog (``bench_before_after.build``), all cached under ``benchmarks/.cache/``.

Each measure runs in a fresh process with torch at one intra-op thread, the rounds
alternating the measures, so both sides of a ratio see the same machine; both sides
may use every core. Beside each rate, the CPU seconds the process used per million
items (so a side that gains by using a second core shows it):

* ``random 2%``: random TED-256 (frame stack 4, with the next observation),
  ``ds[rows]``, a decoded-frame cache of 2% of the run's frames, default threads;
  ``random 2% 1 thread`` and ``random 2% 2 threads`` the same with
  ``ReadOptions(threads=1)`` and ``threads=2``;
* ``lance 2.1``: Lance 2.1's ``take`` of the same 5 frames per transition
  (``bench_corpus.lance_take``), warm;
* ``mixture``: ``MultiGameDataset.from_root`` of ``--stores`` copies through the catalog,
  ``sample(256)``, a 1 GiB decoded-frame budget among them; ``one store at the share``:
  ``AtariZarrDataset.sample(256)`` of one copy with 1/``--stores`` of that budget;
* ``stream``: ``stream(256)``, defaults, ``--epochs`` epochs with the first, the store
  opened before the clock starts; ``torchrl random-256``: TorchRL's ``_AtariStorage.get``
  of 256 random rows (its files read into the page cache first);
* ``drop-in prefetch``: ``AtariZarrExperienceReplay(batch_size=256, prefetch=4)``'s
  ``sample()``; ``dataset sample``: ``AtariZarrDataset.sample(256)``, both at frame
  stack 1 and a decoded-frame cache of 2% of the frames (what the default gives a 50M
  run: every batch decodes); ``... warm``: the same with the default cache, which
  holds the whole store (every batch gathers from it); ``... 50M``: the same on a
  store of a whole 50M run (``--fullsize``, built by ``bench_fullsize.py --checkpoints
  50 --sizes 50 --keep``; left out where it is missing), default options. These
  measures also count the process's voluntary context switches per batch over 500
  more batches (``switches``): how often its threads wait for each other.
* ``paired drop-in 50M`` (and ``paired drop-in``, at a 2% cache): both sides of the
  drop-in's ratio in one process over one dataset (the drop-in's own, so one cache),
  in blocks of a quarter of a second that take turns, the drop-in's block ending once
  the batches it drew ahead are in: the same warm-up, cache and moment of the machine
  on both sides. A 50M store's first seconds learn shard indexes and fill the cache,
  and this VM's speed moves by up to 40% between processes. A third side takes its
  turn too: TorchRL's own ``TensorDictReplayBuffer`` over the same storage, without
  ``prefetch`` (``no prefetch``): what TorchRL's ``sample()`` costs around the read,
  apart from the hand-over of batches drawn ahead.
* ``thread hand-over``: two threads passing one turn back and forth through a
  ``threading.Event`` each, hand-overs per second: what each of those waits costs
  here (the prefetch thread's batch reaches the caller through such a wait).

The result goes to ``benchmarks/results/cores-<time>.json`` and a markdown table of
the ratios to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
SRC = HERE.parent / "src"
MEASURES = (
    "random 2%",
    "random 2% 1 thread",
    "random 2% 2 threads",
    "lance 2.1",
    "mixture",
    "one store at the share",
    "stream",
    "torchrl random-256",
    "drop-in prefetch",
    "dataset sample",
    "drop-in prefetch warm",
    "dataset sample warm",
    "drop-in prefetch 50M",
    "dataset sample 50M",
    "paired drop-in",
    "paired drop-in 50M",
    "thread hand-over",
)
#: The measures that read the 50M store of ``--fullsize``.
FULLSIZE = ("drop-in prefetch 50M", "dataset sample 50M", "paired drop-in 50M")
#: Measures of both sides at once: (row, measure, ratio it must reach).
PAIRED = (
    (
        "drop-in prefetch vs AtariZarrDataset.sample, a 2% cache, in one process",
        "paired drop-in",
        0.9,
    ),
    ("the same on a 50M store, default options, in one process", "paired drop-in 50M", 0.9),
)
#: Each target: (name, numerator, denominator, ratio it must reach).
TARGETS = (
    ("random TED-256 at a 2% cache vs Lance 2.1 take", "random 2%", "lance 2.1", 2.0),
    ("the same, 2 decode threads vs 1", "random 2% 2 threads", "random 2% 1 thread", 1.7),
    (
        "random over the mixture vs one store at the same share",
        "mixture",
        "one store at the share",
        0.7,
    ),
    (
        "local stream, defaults, first epoch included, vs TorchRL random-256",
        "stream",
        "torchrl random-256",
        10.0,
    ),
    (
        "TorchRL drop-in sample() with prefetch vs AtariZarrDataset.sample, a 2% cache",
        "drop-in prefetch",
        "dataset sample",
        0.9,
    ),
    ("the same, the store in the cache", "drop-in prefetch warm", "dataset sample warm", 0.9),
    (
        "the same on a 50M store, default options",
        "drop-in prefetch 50M",
        "dataset sample 50M",
        0.9,
    ),
)
BUDGET = 1 << 30  # the mixture's decoded-frame budget
FRAME_BYTES = 84 * 84


def child(measure: str, data: dict[str, Any], seconds: float, warm: float, epochs: int) -> dict:
    """One measure in this process."""
    import numpy as np
    import torch
    from bench_before_after import _epochs, _timed

    torch.set_num_threads(1)
    from atari_zarr import AtariZarrDataset, MultiGameDataset, ReadOptions

    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    n = int(data["n"])
    two_percent = ReadOptions(frame_cache_bytes=int(0.02 * n * FRAME_BYTES))
    if measure.startswith("random") or measure == "lance 2.1":
        if measure == "lance 2.1":
            from bench_corpus import lance_take

            read = lance_take(Path(data["lance"]))
        else:
            threads = {"1 thread": 1, "2 threads": 2}.get(measure.removeprefix("random 2% "))
            opts = two_percent.replace(threads=threads)
            read = AtariZarrDataset(data["store"], frame_stack=4, options=opts).__getitem__

        def step() -> int:
            read(rng.integers(3, n - 1, 256))
            return 256

        rate, cpu = _timed(step, seconds, warm)
    elif measure == "mixture":
        names = [f"Pong/{i}" for i in range(1, int(data["stores"]) + 1)]
        mix = MultiGameDataset.from_root(
            data["root"], names, options=ReadOptions(frame_cache_bytes=BUDGET)
        )
        rate, cpu = _timed(lambda: len(mix.sample(256, generator=gen)), seconds, warm)
    elif measure == "one store at the share":
        share = ReadOptions(frame_cache_bytes=BUDGET // int(data["stores"]))
        one = AtariZarrDataset(data["store"], options=share)
        rate, cpu = _timed(lambda: len(one.sample(256, generator=gen)), seconds, warm)
    elif measure == "stream":
        rate, cpu = _epochs(AtariZarrDataset(data["store"]).stream(256, seed=0), epochs)
    elif measure == "torchrl random-256":
        from bench_stream import warm_page_cache
        from torchrl.data.datasets.atari_dqn import _AtariStorage

        warm_page_cache(data["trl_path"])
        storage = _AtariStorage(data["trl_path"])
        size = len(storage)

        def trl() -> int:
            rows = torch.from_numpy(rng.integers(0, size, 256))
            return int(storage.get(rows).batch_size[0])

        rate, cpu = _timed(trl, seconds, warm)
    elif measure.startswith("drop-in prefetch"):
        from atari_zarr.torchrl import AtariZarrExperienceReplay

        full = measure in FULLSIZE
        root = Path(data["fullsize" if full else "store"]).parents[1]
        opts = ReadOptions() if full or measure.endswith("warm") else two_percent
        rb = AtariZarrExperienceReplay(
            "Pong/1", batch_size=256, root=root, download=False, prefetch=4, options=opts
        )
        rate, cpu = _timed(lambda: len(rb.sample()), seconds, warm)
        return {"rate": rate, "cpu_s_per_1m": cpu, "switches": _switches(rb.sample)}
    elif measure.startswith("paired drop-in"):
        from atari_zarr.torchrl import AtariZarrExperienceReplay

        full = measure in FULLSIZE
        root = Path(data["fullsize" if full else "store"]).parents[1]
        rb = AtariZarrExperienceReplay(
            "Pong/1",
            batch_size=256,
            root=root,
            download=False,
            prefetch=4,
            options=ReadOptions() if full else two_percent,
        )
        ds = rb.storage.dataset

        def drop_in() -> int:
            return len(rb.sample())

        def drained() -> int:  # the batches it drew ahead are in: its block paid for them
            for queued in list(rb._prefetch_queue):
                queued.result()
            return 0

        from torchrl.data import TensorDictReplayBuffer

        # TorchRL's own buffer over the same storage, drawing on the caller's thread
        plain = TensorDictReplayBuffer(storage=rb.storage, batch_size=256)
        sides: dict[str, Any] = {
            "drop-in": (drop_in, drained),
            "sample": (lambda: len(ds.sample(256, generator=gen)), lambda: 0),
            "no prefetch": (lambda: len(plain.sample()), lambda: 0),
        }
        spent = {name: [0, 0.0, 0.0] for name in sides}  # items, wall, cpu
        block = 0.25  # short blocks: both sides see the same seconds of this VM
        for timed in (False, True):  # warm, then measured
            for i in range(max(3, int(len(sides) * (seconds if timed else warm) / block))):
                name = list(sides)[i % len(sides)]
                step, finish = sides[name]
                items, t0, c0 = 0, time.perf_counter(), time.process_time()
                while time.perf_counter() - t0 < block:
                    items += step()
                finish()
                if timed:
                    spent[name][0] += items
                    spent[name][1] += time.perf_counter() - t0
                    spent[name][2] += time.process_time() - c0
        rates = {name: v[0] / v[1] for name, v in spent.items()}
        return {
            "rate": rates["drop-in"],
            "peer_rate": rates["sample"],
            "cpu_s_per_1m": spent["drop-in"][2] / spent["drop-in"][0] * 1e6,
            "peer_cpu_s_per_1m": spent["sample"][2] / spent["sample"][0] * 1e6,
            "no_prefetch_rate": rates["no prefetch"],
        }
    elif measure == "thread hand-over":
        import threading

        turns = 4000
        mine, theirs = threading.Event(), threading.Event()

        def other() -> None:
            for _ in range(turns):
                theirs.wait()
                theirs.clear()
                mine.set()

        th = threading.Thread(target=other)
        th.start()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(turns):
            theirs.set()
            mine.wait()
            mine.clear()
        wall, used = time.perf_counter() - t0, time.process_time() - c0
        th.join()
        return {"rate": 2 * turns / wall, "cpu_s_per_1m": used / (2 * turns) * 1e6}
    else:  # dataset sample
        full = measure in FULLSIZE
        opts = ReadOptions() if full or measure.endswith("warm") else two_percent
        ds = AtariZarrDataset(data["fullsize" if full else "store"], options=opts)
        rate, cpu = _timed(lambda: len(ds.sample(256, generator=gen)), seconds, warm)
        return {
            "rate": rate,
            "cpu_s_per_1m": cpu,
            "switches": _switches(lambda: ds.sample(256, generator=gen)),
        }
    return {"rate": rate, "cpu_s_per_1m": cpu}


def _switches(step: Any, batches: int = 500) -> float:
    """Voluntary context switches of this process per ``step()`` (a batch), over
    ``batches`` more of them: how often its threads wait for each other (the GIL, a
    batch handed over)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for _ in range(batches):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before) / batches


def run_child(measure: str, data: dict, args: argparse.Namespace) -> dict:
    from bench_before_after import run_in_child

    return run_in_child(SRC, "bench_cores", measure, data, args)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--stores", type=int, default=240, help="copies in the mixture")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warm", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=5, help="stream epochs, the first included")
    p.add_argument("--measures", default=",".join(MEASURES))
    p.add_argument(
        "--fullsize",
        default=str(HERE / ".cache" / "fullsize" / "zarr_50" / "Pong" / "1.zarr"),
        help="a store of a whole 50M run, for the measures that name 50M",
    )
    args = p.parse_args(argv)
    from bench_before_after import build

    data = build(args.steps, args.stores)
    meta = json.loads((Path(data["store"]).parents[2] / "built.json").read_text())
    data.update(trl_path=meta["trl_path"], stores=args.stores, fullsize=args.fullsize)
    measures = [m for m in args.measures.split(",") if m]
    if not (Path(args.fullsize) / "zarr.json").is_file():
        left = [m for m in measures if m in FULLSIZE]
        measures = [m for m in measures if m not in FULLSIZE]
        if left:
            print(
                f"{args.fullsize}: no store there, so {', '.join(left)} are left out; build "
                "it with `python benchmarks/bench_fullsize.py --checkpoints 50 --sizes 50 --keep`",
                file=sys.stderr,
            )
    runs: dict[str, list[dict]] = {m: [] for m in measures}
    for r in range(args.rounds):
        order = measures if r % 2 == 0 else measures[::-1]
        for m in order:
            got = run_child(m, data, args)
            runs[m].append(got)
            print(f"round {r + 1} {m}: {got['rate']:,.0f}/s", file=sys.stderr)
    med = {m: statistics.median(x["rate"] for x in v) for m, v in runs.items()}
    cpu = {m: statistics.median(x["cpu_s_per_1m"] for x in v) for m, v in runs.items()}
    print("| measure | ours, items/s (median; rounds) | peer | ratio | target | CPU s per 1M |")
    print("|---|---|---|---|---|---|")
    for name, ours, peer, want in TARGETS:
        if ours in med and peer in med:
            rounds = ", ".join(f"{x['rate']:,.0f}" for x in runs[ours])
            print(
                f"| {name} | {med[ours]:,.0f} ({rounds}) | {med[peer]:,.0f} | "
                f"{med[ours] / med[peer]:.2f}x | >= {want}x | {cpu[ours]:.1f} / {cpu[peer]:.1f} |"
            )
    for name, measure, want in PAIRED:
        if measure in runs:
            ratios = [x["rate"] / x["peer_rate"] for x in runs[measure]]
            peer = statistics.median(x["peer_rate"] for x in runs[measure])
            print(
                f"| {name} | {med[measure]:,.0f} (ratios {', '.join(f'{r:.2f}' for r in ratios)}) "
                f"| {peer:,.0f} | {statistics.median(ratios):.2f}x | >= {want}x | "
                f"{cpu[measure]:.1f} / "
                f"{statistics.median(x['peer_cpu_s_per_1m'] for x in runs[measure]):.1f} |"
            )
            plain = [x["no_prefetch_rate"] / x["peer_rate"] for x in runs[measure]]
            print(
                f"| ... TorchRL's buffer without prefetch | (ratios "
                f"{', '.join(f'{r:.2f}' for r in plain)}) | | {statistics.median(plain):.2f}x | | |"
            )
    if "thread hand-over" in med:
        print(f"a hand-over between two threads: {1e6 / med['thread hand-over']:.0f} us")
    from result_file import save_result

    out = save_result("cores", args=vars(args), data=data, runs=runs, medians=med, cpu_s_per_1m=cpu)
    print(out)


if __name__ == "__main__":
    main()
