"""Random TED batches against TorchRL's storage and Lance, at several store sizes.

One command::

    python benchmarks/bench_random.py --sizes 100000,1000000 --rounds 3

For each size, from the same DQN Replay checkpoint files (real ALE frames of Pong,
random play, 20,000 recorded frames cycled; ``benchmarks/read_benchmark.py`` builds
them the same way), it builds and caches under ``--data`` (default
``benchmarks/.cache/random``):

* our store (``atari_zarr.convert``);
* TorchRL's AtariDQN storage, by TorchRL's own per-checkpoint preprocessing
  (``AtariDQNExperienceReplay._preproc_run``), read through its ``_AtariStorage``;
* with ``--lance``, a Lance dataset of the same frames (one binary column of 7,056
  bytes per frame, zstd, in each storage version asked), read with ``take``.

Then it times random batches of 256 transitions, in rounds that alternate the
readers, torch at one intra-op thread on both sides:

* ours: ``AtariZarrDataset[rows]``, a TED batch, frame stack 1 and 4, default
  :class:`~atari_zarr.ReadOptions` (the decoded-chunk cache a quarter of memory),
  after a warm-up of ``--warm`` seconds of random batches (TorchRL's storage is read
  into the page cache first, warm too); frame stack 4 reads the same opened store;
* TorchRL: ``_AtariStorage.get(rows)`` (frame stack 1: each row holds observation
  and next observation), and for frame stack 4 the four rows ``r-3 .. r`` of each
  transition (no episode-boundary handling: a lower bound on its cost);
* Lance: ``take`` of the frames a batch needs (frame stack 1: rows ``r, r+1``; 4:
  ``r-3 .. r+1``), turned into one uint8 array (no TED assembly);
* with ``--busy``, TorchRL and ours once more at torch's default threads while a
  second process keeps one core busy.

Rates are transitions per second, the best and the median of the rounds. Results go
to ``benchmarks/results/random-<time>.json`` and the table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BATCH = 256


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def build(root: Path, steps: int, game: str = "Pong") -> dict:
    """Source files, our store and TorchRL's storage of ``steps`` transitions (cached)."""
    done = root / "env.json"
    if done.exists():
        return json.loads(done.read_text())
    import torch  # noqa: F401  (torchrl needs it first)
    from ale_frames import record_frames
    from atari_zarr_testkit import write_fixture_run
    from read_benchmark import torchrl_storage

    from atari_zarr import convert

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    recorded = record_frames(game, min(steps, 20_000), seed=0)
    rng = np.random.default_rng(0)
    lengths = rng.integers(500, 2_501, size=1 + steps // 500).tolist()
    capacity = min(max(25_000, steps // 4), 250_000)  # checkpoints of at most 1.8 GB of frames
    t = time.perf_counter()
    write_fixture_run(
        str(root / "dqn"), game, "1", capacity=capacity, steps=steps, episode_lengths=lengths,
        frames=lambda k: recorded[k % len(recorded)], actions=lambda k: k % 6,
        compresslevel=1 if steps > 200_000 else 9,
    )
    t_src = time.perf_counter() - t
    t = time.perf_counter()
    [store] = convert(str(root / "dqn"), str(root / "zarr"), progress=False, workers=2)
    t_convert = time.perf_counter() - t
    trl = root / "torchrl" / game / "1"
    t_trl = torchrl_storage(root / "dqn" / game / "1" / "replay_logs", trl)
    shutil.rmtree(root / "dqn")  # the source is not read again
    env = {
        "store": store.url, "trl_path": str(trl), "n": int(store.transitions),
        "build_s": {"source": round(t_src, 1), "convert": round(t_convert, 1),
                    "torchrl": round(t_trl, 1)},
    }
    done.write_text(json.dumps(env))
    return env


def _write_frames(args: tuple[str, int, int, str]) -> None:
    """Frame shards ``[lo, hi)`` of the store at ``url``, frames cycled from ``frames_npy``."""
    import zarr

    from atari_zarr.conversion.shards import shard_encoder, write_shard
    from atari_zarr.layout import OBSERVATION

    url, lo, hi, frames_npy = args
    recorded = np.load(frames_npy, mmap_mode="r")
    arr = zarr.open_group(url, mode="r+")[OBSERVATION]
    encode = shard_encoder(arr)
    rows = arr.shards[0]
    for shard in range(lo, hi):
        a, b = shard * rows, min((shard + 1) * rows, arr.shape[0])
        frames = np.asarray(recorded[np.arange(a, b) % len(recorded)])
        if b - a == rows and encode is not None:
            write_shard(arr, shard, encode(frames))
        else:
            arr[a:b] = frames


def build_large(root: Path, steps: int, game: str = "Pong") -> dict:
    """The same data at sizes whose DQN Replay files would not fit this machine's memory:
    our store written directly (the layout's codecs, frames cycled, episodes of 500-2,500
    steps), TorchRL's storage by its own ``_preproc_run`` over runs of 1M transitions
    written one after another (checkpoints numbered on)."""
    done = root / "env.json"
    if done.exists():
        return json.loads(done.read_text())
    import torch  # noqa: F401
    import zarr
    from ale_frames import CACHE_DIR, record_frames
    from atari_zarr_testkit import write_fixture_run
    from torchrl.data.datasets.atari_dqn import AtariDQNExperienceReplay

    from atari_zarr.layout import (
        ACTION,
        EPISODE,
        REWARD,
        SOURCE_ROW,
        TERMINATED,
        TRUNCATED,
        create_store,
        mark_complete,
    )

    root.mkdir(parents=True, exist_ok=True)
    recorded = record_frames(game, 20_000, seed=0)
    frames_npy = CACHE_DIR / f"{game}_20000_0.npy"
    rng = np.random.default_rng(0)
    lengths = rng.integers(500, 2_501, size=1 + steps // 500)
    lengths = lengths[np.cumsum(lengths) <= steps].tolist()
    lengths.append(steps - sum(lengths))
    lengths = [x for x in lengths if x > 0]
    t = time.perf_counter()
    url = str(root / "zarr" / game / "1.zarr")
    shutil.rmtree(url, ignore_errors=True)
    # every chunk written, as the converter writes them (all-zero ones included)
    zarr.config.set({"array.write_empty_chunks": True})
    group = create_store(zarr.storage.LocalStore(url), steps, {"game": game, "run": "1"})
    episode = np.repeat(np.arange(len(lengths)), lengths)
    ends = np.cumsum(lengths) - 1
    term = np.zeros(steps, dtype=bool)
    term[ends] = True
    group[ACTION][:] = (np.arange(steps) % 6).astype(np.int32)
    group[REWARD][:] = np.zeros(steps, dtype=np.float32)
    group[EPISODE][:] = episode
    group[SOURCE_ROW][:] = np.arange(steps)
    group[TERMINATED][:] = term
    group[TRUNCATED][:] = np.zeros(steps, dtype=bool)
    n_shards = -(-steps // int(group["observation"].shards[0]))
    cuts = np.linspace(0, n_shards, 3).astype(int)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_write_frames, [(url, int(a), int(b), str(frames_npy))
                                      for a, b in zip(cuts[:-1], cuts[1:])]))
    mark_complete(group, {})
    t_store = time.perf_counter() - t
    t = time.perf_counter()
    trl = root / "torchrl" / game / "1"
    number = 0
    parts = 0 if (root / "torchrl.done").exists() else -(-steps // 1_000_000)
    if parts:
        shutil.rmtree(trl, ignore_errors=True)
    for part in range(parts):
        n = min(1_000_000, steps - part * 1_000_000)
        src = root / f"dqn-{part}"
        write_fixture_run(
            str(src), game, "1", capacity=250_000, steps=n,
            frames=lambda k, off=part * 1_000_000: recorded[(k + off) % len(recorded)],
            actions=lambda k: k % 6, compresslevel=1,
        )
        logs = src / game / "1" / "replay_logs"
        runs = AtariDQNExperienceReplay._list_runs(logs)
        for ckpt in runs:
            AtariDQNExperienceReplay._preproc_run(trl / str(number), runs, ckpt)
            number += 1
        shutil.rmtree(src)
    (root / "torchrl.done").touch()
    env = {
        "store": url, "trl_path": str(trl), "n": steps,
        "build_s": {"store": round(t_store, 1), "torchrl": round(time.perf_counter() - t, 1)},
    }
    done.write_text(json.dumps(env))
    return env


def build_lance(env: dict, root: Path, version: str) -> str:
    """The store's frames as a Lance dataset: one zstd binary column (cached)."""
    import lance
    import pyarrow as pa
    import zarr

    from atari_zarr.layout import OBSERVATION

    uri = root / f"frames-{version}.lance"
    if (uri / "_versions").exists():
        return str(uri)
    frames = zarr.open_group(env["store"], mode="r")[OBSERVATION]
    field = pa.field("observation", pa.binary(), metadata={"lance-encoding:compression": "zstd"})
    schema = pa.schema([field])

    def batches():
        for start in range(0, frames.shape[0], 16_384):
            block = np.ascontiguousarray(frames[start : start + 16_384])
            flat = block.reshape(len(block), -1)
            values = pa.array([row.tobytes() for row in flat], type=pa.binary())
            yield pa.RecordBatch.from_arrays([values], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    lance.write_dataset(reader, str(uri), schema=schema, data_storage_version=version)
    return str(uri)


def rate(fn: Callable[[np.ndarray], object], n: int, seconds: float, warm: float) -> float:
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    fn(rng.integers(0, n, BATCH))
    while time.perf_counter() - t0 < warm:
        fn(rng.integers(0, n, BATCH))
    done, t0 = 0, time.perf_counter()
    while True:
        fn(rng.integers(0, n, BATCH))
        done += BATCH
        if time.perf_counter() - t0 >= seconds and done >= 3 * BATCH:
            return done / (time.perf_counter() - t0)


def readers(env: dict, lances: dict[str, str]) -> dict[str, tuple[Callable, int, float]]:
    """name -> (fn(rows), rows to draw from, warm-up seconds)."""
    import torch
    from torchrl.data.datasets.atari_dqn import _AtariStorage

    from atari_zarr import AtariZarrDataset

    out: dict[str, tuple[Callable, int, float]] = {}
    one = AtariZarrDataset(env["store"])
    # frame stack 4 over the same opened store: one decoded-chunk cache, as one job has
    four = AtariZarrDataset._over(one._store, 4)
    for k, ds in ((1, one), (4, four)):
        out[f"atari_zarr, frame stack {k}"] = (lambda r, ds=ds: ds[r], len(ds), 0.0)
    storage = _AtariStorage(env["trl_path"])
    m = len(storage)
    out["TorchRL storage, frame stack 1"] = (
        lambda r: storage.get(torch.from_numpy(r % m)), m, 0.0)
    back = np.arange(-3, 1)

    def trl4(r):
        return storage.get(torch.from_numpy(((r[:, None] + back[None, :]) % m).ravel()))

    out["TorchRL storage, frame stack 4 (4 rows each)"] = (trl4, m, 0.0)
    for version, uri in lances.items():
        import lance

        data = lance.dataset(uri)
        n = data.count_rows()
        for k in (1, 4):
            span = np.arange(-(k - 1), 2)

            def take(r, data=data, span=span, n=n):
                idx = np.clip((r[:, None] + span[None, :]).ravel(), 0, n - 1)
                col = data.take(idx.tolist(), columns=["observation"]).column(0)
                buf = col.combine_chunks() if hasattr(col, "combine_chunks") else col
                flat = np.frombuffer(buf.buffers()[2], dtype=np.uint8)
                return flat[: len(idx) * 7056].reshape(len(idx), 84, 84)

            out[f"Lance {version} take, frame stack {k}"] = (take, n, 0.0)
    return out


def page_in(path: str | Path) -> float:
    """Read every file under ``path`` once (TorchRL's storage, hot in the page cache)."""
    t = time.perf_counter()
    for f in Path(path).rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass
    return time.perf_counter() - t


def measure(env: dict, lances: dict[str, str], rounds: int, seconds: float, warm: float) -> dict:
    import torch

    torch.set_num_threads(1)
    print(f"  TorchRL's storage read into the page cache in {page_in(env['trl_path']):.1f} s")
    fns = readers(env, lances)
    got: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(rounds):
        for name, (fn, n, _) in fns.items():
            first = i == 0 and name.startswith("atari_zarr")
            got[name].append(rate(fn, n, seconds, warm if first else 0.5))
            print(f"  round {i + 1}: {name}: {got[name][-1]:,.0f}/s", flush=True)
    return {name: {"best": max(v), "median": statistics.median(v), "rounds": v}
            for name, v in got.items()}


def measure_busy(env: dict, seconds: float, warm: float) -> dict:
    """TorchRL and ours at torch's default threads while another process burns a core."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    fns = readers(env, {})
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        out = {}
        for name in ("TorchRL storage, frame stack 1", "atari_zarr, frame stack 1"):
            fn, n, _ = fns[name]
            out[name] = rate(fn, n, seconds, warm if name.startswith("atari") else 0.5)
            print(f"  busy, default threads: {name}: {out[name]:,.0f}/s", flush=True)
    finally:
        busy.kill()
        busy.wait()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100000", help="comma-separated transitions per store")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--warm", type=float, default=5.0, help="our warm-up, seconds")
    p.add_argument("--lance", default="", help="Lance storage versions, e.g. 2.0,2.1")
    p.add_argument("--busy", action="store_true", help="also the default-threads row, loaded")
    p.add_argument("--data", type=Path, default=HERE / ".cache" / "random")
    args = p.parse_args()

    import torch

    from atari_zarr.read.options import ReadOptions
    from atari_zarr.resources import memory_bytes

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
        f"{memory_bytes() / 2**30:.1f} GiB, Python {platform.python_version()}, "
        f"torch {torch.__version__}",
        "frame_cache_bytes": ReadOptions().frame_cache_limit(),
        "sizes": {},
    }
    for size in [int(s) for s in args.sizes.split(",")]:
        root = args.data / str(size)
        print(f"{size:,} transitions: building (cached in {root})", flush=True)
        env = build(root, size) if size <= 1_000_000 else build_large(root, size)
        lances = {v: build_lance(env, root, v) for v in args.lance.split(",") if v}
        entry = {
            "build_s": env["build_s"],
            "bytes": {
                "atari_zarr store": _du(Path(env["store"])),
                "TorchRL storage": _du(Path(env["trl_path"])),
                **{f"Lance {v}": _du(Path(u)) for v, u in lances.items()},
            },
            "load": os.getloadavg()[0],
        }
        entry["rates"] = measure(env, lances, args.rounds, args.seconds, args.warm)
        if args.busy:
            entry["busy_default_threads"] = measure_busy(env, args.seconds, args.warm)
        result["sizes"][str(size)] = entry
    out = HERE / "results" / time.strftime("random-%Y%m%dT%H%M.json", time.gmtime())
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
