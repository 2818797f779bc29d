"""Finding the stores of a bucket, with and without its catalog.json, at 20 ms a request.

Writes one small store (a fixture run of ``--rows`` transitions), uploads ``--stores``
copies of it to a fake-gcs-server on 127.0.0.1 (``{Game}/{run}.zarr``, 6 games), and
times, through ``CountingProxy`` with ``--delay`` seconds per request:

* ``atari-zarr ls ROOT`` (``list_stores``, sizes included),
* the TorchRL drop-in's ``available_datasets`` (``complete_stores``),
* ``MultiGameDataset.from_root`` (which then opens every store: that part costs the
  same with and without the catalog),

first with the root listed, then after ``atari-zarr index`` wrote ``catalog.json``.

Usage::

    python benchmarks/bench_catalog.py --stores 300 --delay 0.02
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

# Before anything imports gcsfs (see docs/gcs-emulator.md).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import fsspec
from atari_zarr_testkit import write_fixture_run
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

from atari_zarr import convert
from atari_zarr.read.mixing import MultiGameDataset
from atari_zarr.catalog import complete_stores, list_stores, write_catalog

BUCKET = "bench-catalog"
GAMES = ["Pong", "Breakout", "Asterix", "Seaquest", "Qbert", "SpaceInvaders"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stores", type=int, default=300)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--delay", type=float, default=0.02)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-catalog-"))
    write_fixture_run(str(tmp / "src"), "Pong", "1", capacity=args.rows, steps=args.rows + 50,
                      seed=0, max_episode_length=100)
    [local] = convert(str(tmp / "src"), str(tmp / "out"), max_transitions=args.rows,
                      progress=False)
    names = [f"{GAMES[i % len(GAMES)]}/{i // len(GAMES) + 1}" for i in range(args.stores)]
    out: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "stores": args.stores,
        "objects_per_store": sum(1 for p in Path(local.url).rglob("*") if p.is_file()),
        "delay_s": args.delay,
    }
    with FakeGCSServer() as server:
        server.create_bucket(BUCKET)
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
        t0 = time.perf_counter()
        for name in names:
            fs.put(local.url, f"{BUCKET}/root/{name}.zarr", recursive=True)
        out["upload_s"] = round(time.perf_counter() - t0, 1)
        root = f"gs://{BUCKET}/root"
        with CountingProxy(server.endpoint_url, delay=args.delay) as proxy:
            opts = server.storage_options(endpoint_url=proxy.endpoint_url)

            def timed(label: str, call) -> None:
                proxy.reset()
                t = time.perf_counter()
                result = call()
                out[label] = {
                    "seconds": round(time.perf_counter() - t, 2),
                    "requests": proxy.requests,
                    "found": len(result.datasets if hasattr(result, "datasets") else result),
                }
                print(label, out[label], flush=True)

            for when in ("listed", "catalog"):
                if when == "catalog":
                    proxy.delay = 0.0
                    t = time.perf_counter()
                    write_catalog(root, opts)
                    out["index_s_at_0ms"] = round(time.perf_counter() - t, 1)
                    proxy.delay = args.delay
                timed(f"ls_{when}", lambda: list_stores(root, opts))
                timed(f"available_datasets_{when}", lambda: complete_stores(root, opts))
                timed(
                    f"from_root_{when}",
                    lambda: MultiGameDataset.from_root(root, storage_options=opts),
                )
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
