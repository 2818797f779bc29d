"""Mixtures of 1, 8, 60 and 240 stores: open, first batch, stream, random access, memory.

One command::

    python benchmarks/bench_mixture.py                   # copies of a 100k-row real Pong store
    python benchmarks/bench_mixture.py --steps 12000     # a quicker run

What it builds (cached under ``benchmarks/.cache/``): real ALE play of Pong
(``benchmarks/stream_data.py``: random policy, DQN Replay's preprocessing) converted
into one store, and a root of 240 stores ``Pong/1.zarr`` .. ``Pong/240.zarr`` made of it
with hard links (the stores are distinct stores to the reader, whose files share the
page cache), with a ``catalog.json``.

What it measures, each mixture in a fresh process (torch at one thread):

* **local**: ``MultiGameDataset.from_root`` (through the catalog) and its time; the
  first batch of ``stream(256)`` and the stream's rate over ``--stream-batches``
  batches; the resident memory the stream adds (``/proc/self/statm``, sampled after
  every batch; the stores' files are memory-mapped, so their page-cache pages count
  too); random ``sample(256)`` (TED with next observation) for ``--seconds``;
* **remote**: the root (``--remote-sizes`` stores) uploaded to
  fake-gcs-server on 127.0.0.1 and read through a proxy that holds every request
  ``--delay`` seconds: open from the catalog, the first batch, the stream's rate.

The results go to ``benchmarks/results/mixture-<date>.json`` and a markdown table to
stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Before anything imports gcsfs: its default file system class probes every bucket
# over gRPC, which the emulator lacks (~60 s each). See docs/gcs-emulator.md.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESULTS = HERE / "results"
BUCKET = "bench-mixture"
BATCH = 256


def build_root(steps: int, stores: int) -> Path:
    """``stores`` hard-linked copies of one real Pong store under one root, with a catalog."""
    from stream_data import CACHE_DIR, build_run

    from atari_zarr.catalog import write_catalog

    meta = build_run("Pong", steps)
    root = CACHE_DIR / f"mixture_{steps}"
    done = root / f".{stores}"
    if done.exists():
        return root
    for i in range(1, stores + 1):
        target = root / "Pong" / f"{i}.zarr"
        if not target.exists():
            shutil.copytree(meta["store"], target, copy_function=os.link)
    write_catalog(str(root))
    done.touch()
    return root


def _rss_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(
    root: str,
    n: int,
    *,
    storage_options: dict[str, Any] | None,
    stream_batches: int,
    seconds: float,
) -> dict[str, Any]:
    """One mixture's figures, in this process (run it in a fresh one)."""
    import torch

    torch.set_num_threads(1)
    from atari_zarr import MultiGameDataset

    names = [f"Pong/{i}" for i in range(1, n + 1)]
    out: dict[str, Any] = {"stores": n}
    rss0 = _rss_mb()
    t = time.perf_counter()
    mix = MultiGameDataset.from_root(root, names, storage_options=storage_options)
    out["open_s"] = round(time.perf_counter() - t, 3)
    out["transitions"] = len(mix)
    out["rss_open_mb"] = round(_rss_mb() - rss0, 1)
    rss1 = _rss_mb()
    t = time.perf_counter()  # the stream opens the stores the catalog let open() skip
    stream = mix.stream(BATCH, seed=0)
    it = iter(stream)
    next(it)
    out["first_batch_s"] = round(time.perf_counter() - t, 3)
    peak, count = 0.0, 0
    t = time.perf_counter()
    for i, batch in enumerate(it):
        count += len(batch)
        peak = max(peak, _rss_mb())
        if i + 1 >= stream_batches:
            break
    wall = time.perf_counter() - t
    out["stream_per_s"] = round(count / wall)
    out["stream_rss_growth_mb"] = round(peak - rss1, 1)
    del it, stream
    if seconds:
        g = torch.Generator().manual_seed(0)
        mix.sample(BATCH, generator=g)
        count, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            count += len(mix.sample(BATCH, generator=g))
        out["random_per_s"] = round(count / (time.perf_counter() - t))
    out["load"] = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    return out


def _child(args: list[str]) -> dict[str, Any]:
    """Run :func:`measure` in a fresh interpreter; its JSON comes back on stdout."""
    cmd = [sys.executable, __file__, "--child", *args]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def remote_rows(root: Path, sizes: list[int], delay: float, batches: int) -> list[dict[str, Any]]:
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    from atari_zarr.catalog import write_catalog

    rows = []
    most = max(sizes)
    with FakeGCSServer(backend="filesystem") as srv:
        srv.create_bucket(BUCKET)
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **srv.storage_options())
        t = time.perf_counter()
        for i in range(1, most + 1):
            src = str(root / "Pong" / f"{i}.zarr") + "/"
            fs.put(src, f"{BUCKET}/Pong/{i}.zarr/", recursive=True)
        fs.invalidate_cache()
        url = f"gs://{BUCKET}"
        write_catalog(url, srv.storage_options())
        print(f"uploaded {most} stores in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        with CountingProxy(srv.endpoint_url) as proxy:
            proxy.delay = delay
            opts = srv.storage_options(endpoint_url=proxy.endpoint_url)
            for n in sizes:
                args = [url, str(n), json.dumps(opts), str(batches), "0"]
                proxy.reset()
                row = _child(args)
                row["requests"] = proxy.requests
                row["delay_ms"] = round(delay * 1e3)
                rows.append(row)
                print(row, file=sys.stderr)
    return rows


def table(title: str, rows: list[dict[str, Any]], one: dict[str, Any] | None) -> str:
    lines = [
        f"### {title}",
        "",
        "| stores | transitions | open s | first batch s | stream /s | stream vs 1 | "
        "random TED-256 /s | random vs 1 | stream RSS growth MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def ratio(key: str, r: dict[str, Any] = r) -> str:
            if not one or not one.get(key) or r.get(key) is None:
                return "-"
            return f"{r[key] / one[key]:.2f}"

        random = f"{r['random_per_s']:,}" if "random_per_s" in r else "-"
        lines.append(
            f"| {r['stores']} | {r['transitions']:,} | {r['open_s']} | {r['first_batch_s']} | "
            f"{r['stream_per_s']:,} | {ratio('stream_per_s')} | {random} | "
            f"{ratio('random_per_s')} | {r['stream_rss_growth_mb']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=100_000, help="rows of the store copied")
    p.add_argument("--sizes", default="1,8,60,240", help="numbers of stores")
    p.add_argument("--stream-batches", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=10.0, help="random access, per mixture")
    p.add_argument("--remote-sizes", default="1,8,60,240", help="stores read from the bucket")
    p.add_argument("--delay", type=float, default=0.02, help="seconds per request")
    p.add_argument("--remote-batches", type=int, default=400)
    args, rest = p.parse_known_args(argv)
    if args.child:
        url, n, opts, batches, seconds = rest
        row = measure(
            url,
            int(n),
            storage_options=json.loads(opts) or None,
            stream_batches=int(batches),
            seconds=float(seconds),
        )
        print(json.dumps(row))
        return
    from read_benchmark import _machine

    sizes = [int(x) for x in args.sizes.split(",")]
    root = build_root(args.steps, max(sizes))
    local = []
    for n in sizes:
        row = _child([str(root), str(n), "{}", str(args.stream_batches), str(args.seconds)])
        print(row, file=sys.stderr)
        local.append(row)
    remote = []
    if args.remote_sizes:
        remote_sizes = [int(x) for x in args.remote_sizes.split(",")]
        remote = remote_rows(root, remote_sizes, args.delay, args.remote_batches)
    stamp = time.strftime("%Y%m%dT%H%M")
    result = {
        "date": stamp,
        "machine": _machine(),
        "steps": args.steps,
        "local": local,
        "remote": remote,
        "delay_s": args.delay,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"mixture-{stamp}.json").write_text(json.dumps(result, indent=1))
    one = local[0] if local and local[0]["stores"] == 1 else None
    print(f"{stamp}, {_machine()}, copies of a {args.steps:,}-row real Pong store\n")
    print(table("local", local, one))
    if remote:
        r1 = remote[0] if remote[0]["stores"] == 1 else None
        print()
        print(table(f"fake-gcs-server at {round(args.delay * 1e3)} ms per request", remote, r1))


if __name__ == "__main__":
    main()
