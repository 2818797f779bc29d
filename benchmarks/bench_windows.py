"""Windows for sequence models: ours against the Decision Transformer's in-RAM lists.

One command::

    python benchmarks/bench_windows.py                       # ours, local and gs:// at 20 ms
    python benchmarks/bench_windows.py --kzl ../decision-transformer --baseline-python \\
        /path/to/tf-venv/bin/python                          # and the original, measured

Data: the 1,000,000 transitions of real Pong play that ``benchmarks/stream_data.py``
builds and caches (DQN Replay checkpoint files and our store of them). Windows of
K = 30 steps with 4-frame stacks, batches of 128, as kzl/decision-transformer's Atari
runs use them.

Ours, in fresh processes (so RSS and the time to the first batch start from nothing):

* ``ds.windows(30).sample(128)``: uint8 batches ``[128, 30, 4, 84, 84]`` (the stacks
  are views of ``[128, 33, 84, 84]``), and the same with the conversion to float on the
  CPU (``.float() / 255``, which a GPU would do instead);
* ``ds.windows(30).stream(128)``: an epoch's batches, for a fixed time;
* the Decision Transformer drop-in (``atari_zarr.compat.decision_transformer``) through a
  ``DataLoader`` (float32 items, as the original's);
* the same sample and stream from the store in fake-gcs-server on 127.0.0.1, behind a
  proxy that holds every request 20 ms.

The original (``--kzl`` a checkout of kzl/decision-transformer, ``--baseline-python`` a
Python with TensorFlow, dopamine-rl and torch): its own ``create_dataset`` loads
``--baseline-steps`` transitions through dopamine's ``FixedReplayBuffer`` from the same
checkpoint files (its last four renamed to the suffixes 46-49 its sampling draws from), then its own
``StateActionReturnDataset`` serves windows through a ``DataLoader``: build time, RSS
and windows/s. Its source is loaded from the checkout at run time (the modules it
imports for training, not data, are stubbed); nothing of it is in this repository.

Figures go to ``benchmarks/results/windows-<date>.json`` and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESULTS = HERE / "results"
K = 30
STACK = 4
BATCH = 128


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def traffic(batch: int = BATCH, k: int = K, stack: int = STACK) -> dict[str, int]:
    """Bytes of frames written per batch: distinct frames (views) against stacks copied."""
    frame = 84 * 84
    return {
        "distinct_frames_uint8": batch * (k + stack) * frame,
        "stacks_copied_uint8": 2 * batch * k * stack * frame,
        "float32_of_observation": batch * k * stack * frame * 4,
    }


# -- ours, one measurement per fresh process ---------------------------------------------------
def _ours(args: tuple[str, str, dict[str, Any], float]) -> dict[str, Any]:
    what, url, options, seconds = args
    import torch

    torch.set_num_threads(1)
    from atari_zarr import AtariZarrDataset
    from atari_zarr.compat import decision_transformer  # noqa: F401 (imported before the clock)

    if "://" in url:
        import fsspec

        fsspec.get_filesystem_class(url.split("://", 1)[0])  # gcsfs imported ahead too
    base = rss_mb()
    t0 = time.perf_counter()  # from open: imports are a job's start-up, not the reader's
    ds = AtariZarrDataset(url, storage_options=options, frame_stack=STACK)
    windows = ds.windows(K)
    out: dict[str, Any] = {"windows": len(windows)}
    n = 0
    first = None
    if what in ("sample", "sample_float"):
        gen = torch.Generator().manual_seed(0)
        batches = windows.sample_iter(BATCH, prefetch=4, generator=gen) if "://" in url else None
        start = None
        while True:
            batch = next(batches) if batches is not None else windows.sample(BATCH, generator=gen)
            if what == "sample_float":
                batch["observation"].float().div_(255)
            if first is None:
                first = time.perf_counter() - t0
                start = time.perf_counter()
            else:
                n += BATCH
            if time.perf_counter() - start > seconds:
                break
        rate = n / (time.perf_counter() - start)
    elif what == "stream":
        start = None
        for batch in windows.stream(BATCH, seed=0):
            if first is None:
                first = time.perf_counter() - t0
                start = time.perf_counter()
            else:
                n += len(batch)
            if time.perf_counter() - start > seconds:
                break
        rate = n / (time.perf_counter() - start)
    elif what == "dt_dropin":
        from atari_zarr.compat.decision_transformer import (
            StateActionReturnDataset,
            create_dataset,
        )

        data = create_dataset(4, 200_000, trajectories_per_buffer=10, store=ds._store, seed=123)
        dt = StateActionReturnDataset(data, 3 * K)
        loader = torch.utils.data.DataLoader(
            dt, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        start = None
        for states, *_ in loader:
            if first is None:
                first = time.perf_counter() - t0
                start = time.perf_counter()
            else:
                n += len(states)
            if time.perf_counter() - start > seconds:
                break
        rate = n / (time.perf_counter() - start)
    else:  # pragma: no cover
        raise ValueError(what)
    out.update(
        windows_per_s=round(rate, 1),
        first_batch_s=round(first or float("nan"), 3),
        rss_growth_mb=round(rss_mb() - base, 1),
        load=load(),
    )
    return out


def ours(what: str, url: str, options: dict[str, Any], seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_ours, ((what, url, options, seconds),))


# -- the original ------------------------------------------------------------------------------
_BASELINE = r'''
import ast, json, os, sys, time, types
import numpy as np
kzl, prefix, steps, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
buffers = int(sys.argv[5])
def status():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
# training-only imports of create_dataset.py, stubbed: the data path is run as it is
for name, attrs in {"mingpt": {}, "mingpt.utils": {"set_seed": lambda s: None, "sample": None},
                    "mingpt.model_atari": {"GPT": None, "GPTConfig": None},
                    "mingpt.trainer_atari": {"Trainer": None, "TrainerConfig": None},
                    "blosc": {}}.items():
    mod = types.ModuleType(name); mod.__dict__.update(attrs); sys.modules[name] = mod
# dopamine 4 moved its TF replay memory under dopamine.tf; the 2021 import path is aliased
import dopamine.tf.replay_memory as replay_memory
import dopamine.tf.replay_memory.circular_replay_buffer as circular
sys.modules["dopamine.replay_memory"] = replay_memory
sys.modules["dopamine.replay_memory.circular_replay_buffer"] = circular
sys.path.insert(0, os.path.join(kzl, "atari"))
import torch
torch.set_num_threads(1)
from create_dataset import create_dataset
base = status()  # after the imports (TensorFlow, dopamine, torch): the data's own memory
np.random.seed(123)
t0 = time.perf_counter()
obss, actions, returns, done_idxs, rtgs, timesteps = create_dataset(buffers, steps, "Pong", prefix, 10)
built = time.perf_counter() - t0
rss = status() - base
# StateActionReturnDataset, from run_dt_atari.py as it is (the class only: the module trains)
src = open(os.path.join(kzl, "atari", "run_dt_atari.py")).read()
tree = ast.parse(src)
cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StateActionReturnDataset")
ns = {"np": np, "torch": torch, "Dataset": torch.utils.data.Dataset}
exec(compile(ast.Module([cls], []), "run_dt_atari.py", "exec"), ns)
ds = ns["StateActionReturnDataset"](obss, 30 * 3, actions, done_idxs, rtgs, timesteps)
loader = torch.utils.data.DataLoader(ds, batch_size=128, shuffle=True)
n, start = 0, time.perf_counter()
first = None
for states, *_ in loader:
    if first is None:
        first = time.perf_counter() - start
        start = time.perf_counter()
    else:
        n += len(states)
    if time.perf_counter() - start > seconds:
        break
print(json.dumps({"transitions": len(obss), "build_s": round(built, 1), "rss_growth_mb": round(rss),
                  "windows_per_s": round(n / (time.perf_counter() - start), 1),
                  "first_batch_s": round(first, 2)}))
'''


def baseline(kzl: str, python: str, dqn_run: Path, steps: int, seconds: float) -> dict[str, Any]:
    """kzl's create_dataset and StateActionReturnDataset, in their own Python."""
    logs = dqn_run / "replay_logs"
    with tempfile.TemporaryDirectory() as tmp:
        # its sampling draws among suffixes 50 - num_buffers .. 49: give our last four those
        target = Path(tmp) / "Pong" / "1" / "replay_logs"
        target.mkdir(parents=True)
        # full buffers only (dopamine refuses indices past the cursor of a partial one):
        # every checkpoint but the final, partial log
        suffixes = sorted({int(p.name.split(".")[-2]) for p in logs.glob("*_ckpt.*.gz")})
        suffixes = (suffixes[:-1] if len(suffixes) > 1 else suffixes)[-4:]
        for new, old in zip(range(50 - len(suffixes), 50), suffixes, strict=True):
            for p in logs.glob(f"*_ckpt.{old}.gz"):
                (target / p.name.replace(f".{old}.gz", f".{new}.gz")).symlink_to(p)
        proc = subprocess.run(
            [python, "-c", _BASELINE, kzl, tmp + "/", str(steps), str(seconds), str(len(suffixes))],
            capture_output=True,
            text=True,
            timeout=7200,
        )
    if proc.returncode:
        raise RuntimeError(f"the baseline failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["load"] = load()
    return out


# -- remote ---------------------------------------------------------------------------------------
def remote(store: Path, seconds: float) -> dict[str, Any]:
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    out: dict[str, Any] = {}
    with FakeGCSServer() as srv:
        srv.create_bucket("bench-windows")
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **srv.storage_options())
        fs.put(str(store).rstrip("/") + "/", "bench-windows/Pong/1.zarr/", recursive=True)
        with CountingProxy(srv.endpoint_url, delay=0.02) as proxy:
            url = "gs://bench-windows/Pong/1.zarr"
            opts = {**srv.storage_options(), "endpoint_url": proxy.endpoint_url}
            for what in ("sample", "stream"):
                proxy.reset()
                r = ours(what, url, opts, seconds)
                r["requests"] = proxy.requests
                r["mb_fetched"] = round(proxy.bytes_received / 1e6, 1)
                out[f"gs_20ms_{what}"] = r
                print(f"  gs:// 20 ms {what}: {r}", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--kzl", help="a checkout of kzl/decision-transformer (for the baseline)")
    p.add_argument("--baseline-python", help="a Python with tensorflow, dopamine-rl and torch")
    p.add_argument("--baseline-steps", type=int, default=200_000)
    p.add_argument("--skip-remote", action="store_true")
    p.add_argument("--only-baseline", action="store_true", help="measure the original only")
    args = p.parse_args()

    from stream_data import build_run

    meta = build_run("Pong", args.steps)
    store = Path(meta["store"])
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "steps": args.steps,
        "k": K,
        "frame_stack": STACK,
        "batch": BATCH,
        "traffic_bytes_per_batch": traffic(),
    }
    for what in () if args.only_baseline else ("sample", "sample_float", "stream", "dt_dropin"):
        r = ours(what, str(store), {}, args.seconds)
        results[f"local_{what}"] = r
        print(f"  local {what}: {r}", file=sys.stderr)
    if not args.skip_remote and not args.only_baseline:
        results.update(remote(store, args.seconds))
    if args.kzl and args.baseline_python:
        r = baseline(
            args.kzl, args.baseline_python, Path(meta["logs"]).parent, args.baseline_steps,
            args.seconds * 4,
        )
        results["kzl"] = r
        print(f"  kzl: {r}", file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
    (RESULTS / f"windows-{stamp}.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
