"""Reading from the Hugging Face Hub at its rate limit: random batches, epochs, a root.

One command::

    python benchmarks/bench_hub.py          # 100k real Pong rows, the anonymous rate

Data: the store of 100,000 real Pong transitions that ``benchmarks/stream_data.py``
builds and caches, served as a dataset repo by the test kit's emulator of the Hub's API
(``atari_zarr_testkit.hub.HubEmulator``, on 127.0.0.1), whose ``/resolve`` answers 429
past 10 requests a second: the Hub's anonymous 3,000 per 5 minutes.

* **random**: TED batches of 256 with 4-frame stacks, rows drawn at random, for 20 s from
  a fresh process-free start (an empty object cache); every tenth batch compared with the
  same rows read locally. With the object cache (the default) and without it
  (``ATARI_ZARR_OBJECT_CACHE_SIZE=0``, byte ranges, each a resolve: how ``hf://`` read
  before);
* **stream**: one epoch of ``stream(256)`` from an empty cache, then a second epoch by a
  new dataset (as the next job opens it): resolves per object of the store;
* **root**: ``MultiGameDataset.from_root`` of the repo with its ``catalog.json``: requests
  until it is open.

Figures go to ``benchmarks/results/hub-<date>.json`` and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "kit"))

URL = "hf://datasets/org/atari/Pong/1.zarr"


def _repo(store: str) -> Path:
    """The store under Pong/1.zarr of a repo folder (hard links), with a catalog."""
    from atari_zarr.catalog import write_catalog

    root = Path(tempfile.mkdtemp(prefix="hub-repo-"))
    shutil.copytree(store, root / "Pong" / "1.zarr", copy_function=os.link)
    write_catalog(str(root))
    return root


def _fresh_home() -> str:
    home = tempfile.mkdtemp(prefix="hub-home-")
    os.environ["ATARI_ZARR_HOME"] = home
    return home


def _random(repo: Path, store: str, seconds: float, cached: bool) -> dict[str, Any]:
    from atari_zarr_testkit.hub import HubEmulator

    from atari_zarr import AtariZarrDataset

    home = _fresh_home()
    os.environ["ATARI_ZARR_OBJECT_CACHE_SIZE"] = "50G" if cached else "0"
    local = AtariZarrDataset(store, frame_stack=4)
    rng = np.random.default_rng(0)
    checked = wrong = batches = 0
    with HubEmulator({"org/atari": repo}, limit=10, window=1.0) as hub:
        t0 = time.perf_counter()
        remote = AtariZarrDataset(URL, storage_options=hub.storage_options(), frame_stack=4)
        while time.perf_counter() - t0 < seconds:
            rows = rng.integers(0, len(local), 256)
            got = remote[rows]
            if batches % 10 == 0:
                checked += 1
                same = np.array_equal(
                    got["observation"].numpy(), local[rows]["observation"].numpy()
                )
                wrong += not same
            batches += 1
        wall = time.perf_counter() - t0
        limited = sum(1 for _, _, status in hub.log if status == 429)
        resolves = hub.resolves
    shutil.rmtree(home, ignore_errors=True)
    return {
        "object_cache": cached,
        "seconds": wall,
        "batches": batches,
        "checked": checked,
        "wrong": wrong,
        "resolves": resolves,
        "answered_429": limited,
    }


def _stream(repo: Path, store: str) -> dict[str, Any]:
    from atari_zarr_testkit.hub import HubEmulator

    from atari_zarr import AtariZarrDataset

    home = _fresh_home()
    os.environ["ATARI_ZARR_OBJECT_CACHE_SIZE"] = "50G"
    objects = sum(1 for p in (repo / "Pong" / "1.zarr").rglob("*") if p.is_file())
    out: dict[str, Any] = {"objects": objects}
    with HubEmulator({"org/atari": repo}, limit=10, window=1.0) as hub:
        for epoch in (1, 2):
            before = hub.resolves
            t0 = time.perf_counter()
            ds = AtariZarrDataset(URL, storage_options=hub.storage_options(), frame_stack=4)
            rows = sum(len(b["action"]) for b in ds.stream(batch_size=256))
            out[f"epoch{epoch}"] = {
                "seconds": time.perf_counter() - t0,
                "rows": rows,
                "resolves": hub.resolves - before,
            }
    shutil.rmtree(home, ignore_errors=True)
    return out


def _root(repo: Path) -> dict[str, Any]:
    from atari_zarr_testkit.hub import HubEmulator

    from atari_zarr import MultiGameDataset

    home = _fresh_home()
    with HubEmulator({"org/atari": repo}) as hub:
        ds = MultiGameDataset.from_root(
            "hf://datasets/org/atari", storage_options=hub.storage_options()
        )
        opened = len(hub.log)
        ds.sample(32)
        first_batch = len(hub.log)
    shutil.rmtree(home, ignore_errors=True)
    return {"requests_to_open": opened, "requests_to_first_batch": first_batch}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)

    from stream_data import build_run

    store = str(build_run("Pong", args.rows)["store"])
    repo = _repo(store)
    try:
        cached = _random(repo, store, args.seconds, cached=True)
        ranges = _random(repo, store, args.seconds, cached=False)
        stream = _stream(repo, store)
        root = _root(repo)
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    lines = [
        "| measure | object cache | result |",
        "|---|---|---|",
    ]
    for r in (cached, ranges):
        lines.append(
            f"| random TED-256, {args.seconds:g} s at 10 resolves/s | "
            f"{'on' if r['object_cache'] else 'off'} | {r['batches']:,} batches "
            f"({r['wrong']} of {r['checked']} checked differ), {r['resolves']} resolves, "
            f"{r['answered_429']} answered 429 |"
        )
    e1, e2 = stream["epoch1"], stream["epoch2"]
    lines.append(
        f"| stream, epoch 1 / epoch 2 | on | {e1['resolves']} / {e2['resolves']} resolves "
        f"for {stream['objects']} objects ({e1['seconds']:.1f} s / {e2['seconds']:.1f} s) |"
    )
    lines.append(
        f"| `from_root` of a catalogued repo | on | {root['requests_to_open']} requests to "
        f"open, {root['requests_to_first_batch']} to the first batch |"
    )
    print("\n".join(lines))
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "rows": args.rows,
        "random_cached": cached,
        "random_ranges": ranges,
        "stream": stream,
        "root": root,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"hub-{time.strftime('%Y%m%dT%H%M')}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"-> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
