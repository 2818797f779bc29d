"""``preprocess`` of the TorchRL drop-in on a 1,000,000-transition store: size and speed.

One command::

    python benchmarks/bench_preprocess.py            # --steps 100000 for a quicker run

Data: the 1,000,000 transitions of real Pong play that ``benchmarks/stream_data.py``
builds and caches (our store of them). The transform is the one TorchRL's own
preprocessing test applies, a resize of ``observation`` and ``("next", "observation")``,
here to 64x64 with ``torch.nn.functional.interpolate`` (TorchRL's uses torchvision's
``Resize``), keeping the action, reward and flags. It runs with ``num_workers`` 1 and 2
(processes), each into a new ``dest``.

Reported: wall time, transitions per second, the size of ``dest`` on disk against the
memory maps TorchRL's ``preprocess`` writes for the same output (their size is exact:
rows times bytes per row, uncompressed), and a check that a ``ReplayBuffer`` over the result
samples. Figures go to ``benchmarks/results/preprocess-<date>.json`` and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESULTS = HERE / "results"
SIZE = 64


def resize(td: Any) -> Any:
    """TorchRL's preprocessing test's transform, without torchvision: frames to 64x64."""
    import torch

    out = td.select("action", ("next", "reward"), ("next", "done"), ("next", "terminated"))
    for key in ("observation", ("next", "observation")):
        obs = td.get(key)
        small = torch.nn.functional.interpolate(
            obs.reshape(-1, 1, *obs.shape[-2:]).float(), size=(SIZE, SIZE), mode="bilinear"
        )
        out.set(key, small.reshape(*obs.shape[:-2], SIZE, SIZE).round().to(torch.uint8))
    return out


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def measure(store: str, n: int, workers: int, dest: Path) -> dict[str, Any]:
    import torch
    from torchrl.data import ReplayBuffer

    from atari_zarr.compat.preprocess import preprocess
    from atari_zarr.compat.torchrl_storage import METADATA
    from atari_zarr.read.dataset import AtariZarrDataset

    torch.set_num_threads(1)
    ds = AtariZarrDataset(store)
    t0 = time.perf_counter()
    storage = preprocess(
        ds,
        resize,
        num_workers=workers,
        num_frames=n,
        dest=dest,
        mp_start_method="fork",
        metadata={"dataset_id": "Pong/1"},
    )
    seconds = time.perf_counter() - t0
    rb = ReplayBuffer(storage=storage, batch_size=256)
    sample = rb.sample()
    row = storage[0]
    row_bytes = sum(
        v.numel() * v.element_size()
        for k, v in row.items(include_nested=True, leaves_only=True)
        if (k if isinstance(k, str) else k[0]) != METADATA and isinstance(v, torch.Tensor)
    )
    return {
        "transitions": len(storage),
        "workers": workers,
        "seconds": round(seconds, 1),
        "transitions_per_s": round(len(storage) / seconds),
        "dest_bytes": du(dest),
        "memmap_bytes": row_bytes * len(storage),
        "sample_shape": list(sample["observation"].shape),
        "load": "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()

    from bench_stream import machine
    from stream_data import build_run

    meta = build_run("Pong", args.steps)
    store = meta["store"]
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "store": {"transitions": meta["n"], "bytes": du(Path(store))},
        "runs": [],
    }
    with tempfile.TemporaryDirectory(dir=HERE / ".cache") as tmp:
        for w in args.workers:
            dest = Path(tmp) / f"pre-{w}.zarr"
            res["runs"].append(measure(store, args.steps, w, dest))
            shutil.rmtree(dest)
            print(json.dumps(res["runs"][-1]), file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
    (RESULTS / f"preprocess-{stamp}.json").write_text(json.dumps(res, indent=2) + "\n")
    print(
        f"- Store: {res['store']['transitions']:,} transitions, "
        f"{res['store']['bytes'] / 1e6:.1f} MB; {res['date']}, {res['machine']['summary']}"
    )
    print("\n| workers | transitions/s | wall time | dest | TorchRL's memory maps | ratio |")
    print("|--:|--:|--:|--:|--:|--:|")
    for r in res["runs"]:
        print(
            f"| {r['workers']} | {r['transitions_per_s']:,} | {r['seconds']} s | "
            f"{r['dest_bytes'] / 1e6:,.1f} MB | {r['memmap_bytes'] / 1e9:,.2f} GB | "
            f"{r['dest_bytes'] / r['memmap_bytes']:.4f} |"
        )


if __name__ == "__main__":
    main()
