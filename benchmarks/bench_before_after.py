"""The reading core before and after a change, in one run, with Lance beside.

One command, with the code before checked out beside this one::

    git worktree add /tmp/before <revision>
    python benchmarks/bench_before_after.py --before /tmp/before/src --rounds 3

Data: the real Pong play of ``benchmarks/stream_data.py`` (``--steps`` transitions,
random policy, DQN Replay's preprocessing; cached under ``benchmarks/.cache/``), its
store, a Lance 2.1 dataset of its frames (``bench_corpus.build_lance``) and a root of
``--stores`` hard-linked copies of the store with a catalog (``bench_mixture.build_root``).

Each measure runs in a fresh process with torch at one intra-op thread, importing
``atari_zarr`` from the tree it is given; the rounds alternate the trees (the one
first in a round is last in the next), so both see the same machine:

* ``random``: random TED-256 batches (frame stack 4, with the next observation), the
  default options, after ``--warm`` seconds (``bench_random``'s ours);
* ``random 8 MB``: the same with an 8 MB decoded-frame cache, a store far larger than
  its cache, and **Lance 2.1** ``take`` of the same 5 frames per transition, the peer
  (``bench_corpus``'s reader; its figure does not depend on the tree);
* ``stream``: ``stream(256)`` for ``--epochs`` epochs, the first included, defaults
  (``bench_stream``'s local stream);
* ``windows``: ``windows(30).sample(128)``, frame stack 4 (``bench_windows``'s sample);
* ``mixture random`` and ``mixture stream``: ``MultiGameDataset.from_root`` of the
  copies (through the catalog), ``sample(256)`` and ``stream(256)``
  (``bench_mixture``'s local rows);
* ``remote random`` and ``remote stream``: the store in fake-gcs-server on 127.0.0.1,
  read through the test kit's proxy holding every request ``--delay`` seconds (one
  round trip): ``sample_iter(256, prefetch=4)`` and ``--epochs`` epochs of
  ``stream(256)``, the store opened before the clock starts (``bench_stream``'s
  remote rows).

Rates are items per second; beside each, the process's CPU seconds per million items
(user and system time over the timed part). The result goes to
``benchmarks/results/before-after-<time>.json`` and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
AFTER = HERE.parent / "src"
MEASURES = (
    "random",
    "random 8 MB",
    "lance 2.1",
    "stream",
    "windows",
    "mixture random",
    "mixture stream",
    "remote random",
    "remote stream",
)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # an emulator's bucket


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _timed(step: Any, seconds: float, warm: float) -> tuple[float, float]:
    """Items per second of ``step()`` (it returns the items it read) over ``seconds``,
    after ``warm`` seconds, and CPU seconds per million items."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm:
        step()
    items, t0, c0 = 0, time.perf_counter(), _cpu()
    while time.perf_counter() - t0 < seconds:
        items += step()
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return items / wall, cpu / items * 1e6


def _epochs(stream: Any, epochs: int) -> tuple[float, float]:
    """Items per second of ``epochs`` epochs of ``stream`` (its store opened before the
    clock starts; the first epoch included), and CPU seconds per million items."""
    items, t0, c0 = 0, time.perf_counter(), _cpu()
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        items += sum(len(b) for b in stream)
    wall, used = time.perf_counter() - t0, _cpu() - c0
    return items / wall, used / items * 1e6


def child(measure: str, data: dict[str, Any], seconds: float, warm: float, epochs: int) -> dict:
    """One measure in this process (``atari_zarr`` from the tree on ``sys.path``)."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from atari_zarr import AtariZarrDataset, MultiGameDataset, ReadOptions

    rng = np.random.default_rng(0)
    n = int(data["n"])
    if measure.startswith("remote"):
        ds = AtariZarrDataset(data["remote"], storage_options=data["remote_options"])
        if measure == "remote random":
            gen = torch.Generator().manual_seed(0)
            batches = ds.sample_iter(256, prefetch=4, generator=gen)
            rate, cpu = _timed(lambda: len(next(batches)), seconds, 1.0)
        else:
            rate, cpu = _epochs(ds.stream(256, seed=0), epochs)
    elif measure.startswith("random") or measure == "lance 2.1":
        if measure == "lance 2.1":
            from bench_corpus import lance_take

            read = lance_take(Path(data["lance"]))
        else:
            cache = {"frame_cache_bytes": 8 << 20} if measure == "random 8 MB" else {}
            ds = AtariZarrDataset(data["store"], frame_stack=4, options=ReadOptions(**cache))
            read = ds.__getitem__

        def step() -> int:
            read(rng.integers(3, n - 1, 256))
            return 256

        rate, cpu = _timed(step, seconds, warm)
    elif measure == "windows":
        wins = AtariZarrDataset(data["store"], frame_stack=4).windows(30)
        gen = torch.Generator().manual_seed(0)
        rate, cpu = _timed(lambda: len(wins.sample(128, generator=gen)), seconds, warm)
    elif measure == "stream":
        rate, cpu = _epochs(AtariZarrDataset(data["store"]).stream(256, seed=0), epochs)
    else:
        mix = MultiGameDataset.from_root(data["root"])
        if measure == "mixture random":
            gen = torch.Generator().manual_seed(0)
            rate, cpu = _timed(lambda: len(mix.sample(256, generator=gen)), seconds, warm)
        else:
            batches = iter(mix.stream(256, seed=0))
            rate, cpu = _timed(lambda: len(next(batches)), seconds, 1.0)
    return {"rate": rate, "cpu_s_per_1m": cpu}


def run_child(tree: Path, measure: str, data: dict, args: argparse.Namespace) -> dict:
    return run_in_child(tree, "bench_before_after", measure, data, args)


def run_in_child(
    tree: Path, module: str, measure: str, data: dict, args: argparse.Namespace
) -> dict:
    """``module.child(measure, data, ...)`` in a fresh process importing ``atari_zarr``
    from ``tree``: its result."""
    code = (
        f"import sys, json; sys.path[:0] = [{str(tree)!r}, {str(HERE)!r}]\n"
        f"from {module} import child\n"
        f"print(json.dumps(child({measure!r}, {data!r}, {args.seconds!r}, {args.warm!r}, "
        f"{args.epochs!r})))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode:
        raise RuntimeError(f"{measure} with {tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build(steps: int, stores: int) -> dict[str, Any]:
    from bench_corpus import build_lance
    from bench_mixture import build_root
    from stream_data import build_run

    meta = build_run("Pong", steps)
    root = build_root(steps, stores)
    import zarr

    frames = zarr.open_group(meta["store"], mode="r")["observation"]
    lance = build_lance(Path(meta["store"]).parents[2], frames, "2.1", rows=int(meta["n"]))
    return {"store": meta["store"], "n": meta["n"], "root": str(root), "lance": str(lance)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help="the src/ of the code before")
    p.add_argument("--after", type=Path, default=AFTER, help="the src/ of the code after")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--stores", type=int, default=60, help="copies in the mixture")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warm", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=5, help="stream epochs, the first included")
    p.add_argument("--measures", default=",".join(MEASURES))
    p.add_argument("--delay", type=float, default=0.02, help="seconds the proxy holds a request")
    args = p.parse_args(argv)
    data = build(args.steps, args.stores)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    with contextlib.ExitStack() as servers:
        if any(m.startswith("remote") for m in args.measures.split(",")):
            data.update(servers.enter_context(_bucket(data["store"], args.delay)))
        runs = _rounds(args, data, trees)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M", time.gmtime()),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "args": {k: str(v) for k, v in vars(args).items()},
        "data": data,
        "runs": runs,
    }
    out = HERE / "results" / time.strftime("before-after-%Y%m%dT%H%M.json", time.gmtime())
    out.write_text(json.dumps(result, indent=1))
    print(table(runs))
    print(f"\n{out}")


@contextlib.contextmanager
def _bucket(store: str, delay: float) -> Any:
    """The store in fake-gcs-server, behind a proxy holding every request ``delay`` s."""
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    with FakeGCSServer() as srv:
        srv.create_bucket("before-after")
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **srv.storage_options())
        fs.put(store.rstrip("/") + "/", "before-after/Pong/1.zarr/", recursive=True)
        with CountingProxy(srv.endpoint_url, delay=delay) as proxy:
            opts = srv.storage_options(endpoint_url=proxy.endpoint_url)
            yield {"remote": "gs://before-after/Pong/1.zarr", "remote_options": opts}


def _rounds(
    args: argparse.Namespace, data: dict[str, Any], trees: dict[str, Path]
) -> dict[str, dict[str, list[dict]]]:
    runs: dict[str, dict[str, list[dict]]] = {}
    for r in range(args.rounds):
        for measure in args.measures.split(","):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            if measure == "lance 2.1":
                order = ["after"]  # the peer: the same whatever the tree
            for name in order:
                got = run_child(trees[name], measure, data, args)
                runs.setdefault(measure, {}).setdefault(name, []).append(got)
                print(f"round {r + 1} {measure} {name}: {got['rate']:,.0f}/s", flush=True)
    return runs


def table(runs: dict[str, dict[str, list[dict]]]) -> str:
    """The markdown table: medians, each round, and after / before."""
    lines = [
        "| measure | before, items/s (median; rounds) | after | after / before "
        "| CPU s per 1M, before / after |",
        "|---|---|---|---|---|",
    ]
    for measure, by in runs.items():
        cells, med = [], {}
        for name in ("before", "after"):
            rates = [x["rate"] for x in by.get(name, [])]
            if not rates:
                cells.append("")
                continue
            med[name] = statistics.median(rates)
            each = ", ".join(f"{x:,.0f}" for x in rates)
            cells.append(f"{med[name]:,.0f} ({each})")
        ratio = f"{med['after'] / med['before']:.2f}x" if len(med) == 2 else ""
        cpu = " / ".join(f"{statistics.median(x['cpu_s_per_1m'] for x in by[n]):.1f}" for n in by)
        lines.append(f"| {measure} | {cells[0]} | {cells[1]} | {ratio} | {cpu} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
