"""Read benchmark: our reader against TorchRL, numpy, HDF5 and zarr-python on the same data.

One command::

    python benchmarks/read_benchmark.py --size small      # ~1 min, checks that everything runs
    python benchmarks/read_benchmark.py --size full       # the figures in docs/benchmarks/read.md
    python benchmarks/read_benchmark.py --codecs          # chunk/shard check of docs/codec-choice.md
    python benchmarks/read_benchmark.py --open-50m        # open time and RSS of a 50M-row store

What is built, all from the same transitions, under a temporary directory:

* DQN Replay checkpoint files (gzip -9, as dopamine writes them) written by
  ``atari_zarr_testkit.write_fixture_run`` from real ALE frames (random-policy
  Pong recorded by ``benchmarks/ale_frames.py``; the full size cycles 20,000
  recorded frames), with episode lengths drawn from 500-2,500 steps;
* our store, by ``atari_zarr.convert`` of those files;
* TorchRL's AtariDQN storage, by TorchRL's own per-checkpoint preprocessing
  (``AtariDQNExperienceReplay._preproc_run`` on each checkpoint, then its
  ``_AtariStorage`` reading the memory-mapped result: what TorchRL does after its
  ``gsutil`` download step, which needs the network);
* d4rl-atari-style in-RAM numpy arrays (observations, actions, rewards, terminals);
* one uncompressed HDF5 file per episode with ``states, actions, rewards, dones``
  (the layout of the per-episode loaders in d3rlpy-based pipelines);

then every reader samples random batches of 32 and 256 transitions with the next
observation, 4 slices of 64 consecutive transitions, and scans all rows in order.
Rates are transitions per second, in one process, page cache hot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SIZES = {
    "small": {"steps": 6_000, "capacity": 1_500, "seconds": 0.6},
    "full": {"steps": 100_000, "capacity": 25_000, "seconds": 4.0},
}


def _du(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in Path(path).rglob(pattern) if p.is_file())


def _rate(fn: Callable[[np.random.Generator], int], seconds: float, seed: int = 0) -> float:
    """Transitions per second of ``fn(rng) -> transitions`` over about ``seconds``."""
    rng = np.random.default_rng(seed)
    fn(rng)  # warm-up: shard indexes, file handles, lazy per-step chunks
    done, t0 = 0, time.perf_counter()
    calls = 0
    while True:
        done += fn(rng)
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds and calls >= 3:
            return done / elapsed


ROUNDS = 3


# -- building every format from the same source ------------------------------------------


def torchrl_storage(logs: Path, path: Path) -> float:
    """TorchRL's AtariDQN storage of the run at ``logs``, by TorchRL's own per-checkpoint
    preprocessing (what it does after its ``gsutil`` download); seconds taken."""
    from torchrl.data.datasets.atari_dqn import AtariDQNExperienceReplay

    t = time.perf_counter()
    runs = AtariDQNExperienceReplay._list_runs(logs)
    for ckpt in runs:
        AtariDQNExperienceReplay._preproc_run(Path(path) / str(ckpt), runs, ckpt)
    return time.perf_counter() - t


def build(work: Path, game: str, steps: int, capacity: int) -> dict:
    import torch  # noqa: F401  (torchrl needs it first)
    from ale_frames import record_frames
    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert

    recorded = record_frames(game, min(steps, 20_000), seed=0)
    rng = np.random.default_rng(0)
    lengths = rng.integers(500, 2_501, size=1 + steps // 500).tolist()
    src = work / "dqn"
    t = time.perf_counter()
    write_fixture_run(
        str(src), game, "1", capacity=capacity, steps=steps, episode_lengths=lengths,
        frames=lambda k: recorded[k % len(recorded)], actions=lambda k: k % 6, compresslevel=9,
    )
    logs = src / game / "1" / "replay_logs"
    t_src = time.perf_counter() - t
    t = time.perf_counter()
    [store] = convert(str(src), str(work / "zarr"), progress=False)
    t_convert = time.perf_counter() - t

    # TorchRL: its own per-checkpoint preprocessing into memory-mapped tensordicts.
    trl_path = work / "torchrl" / game / "1"
    torchrl_storage(logs, trl_path)
    return {
        "store": store.url, "logs": logs, "trl_path": trl_path, "n": store.transitions,
        "t_src": t_src, "t_convert": t_convert,
    }


def load_numpy(store_url: str) -> dict:
    import zarr

    from atari_zarr.layout import ACTION, OBSERVATION, REWARD, TERMINATED, TRUNCATED

    g = zarr.open_group(store_url, mode="r")
    return {
        "observations": g[OBSERVATION][:],
        "actions": g[ACTION][:],
        "rewards": g[REWARD][:],
        "terminals": g[TERMINATED][:] | g[TRUNCATED][:],
    }


def write_hdf5(arrays: dict, root: Path) -> tuple[list, np.ndarray]:
    import h5py

    root.mkdir(parents=True)
    ends = np.flatnonzero(arrays["terminals"])
    if len(ends) == 0 or ends[-1] != len(arrays["terminals"]) - 1:
        ends = np.append(ends, len(arrays["terminals"]) - 1)
    starts = np.concatenate([[0], ends[:-1] + 1])
    files = []
    for i, (a, b) in enumerate(zip(starts, ends + 1)):
        path = root / f"{i:09d}.hdf5"
        with h5py.File(path, "w") as f:
            f["states"] = arrays["observations"][a:b]
            f["actions"] = arrays["actions"][a:b]
            f["rewards"] = arrays["rewards"][a:b]
            f["dones"] = arrays["terminals"][a:b]
        files.append(path)
    return [h5py.File(p, "r") for p in files], starts


# -- samplers: each returns the number of transitions it produced ---------------------------


def _random_rows(rng, n, batch):
    return rng.integers(0, n, batch)


def _slice_rows(rng, n, slices=4, length=64):
    starts = rng.integers(0, n - length, slices)
    return (starts[:, None] + np.arange(length)).ravel()


def samplers(env: dict) -> dict[str, Callable[[np.ndarray], int]]:
    """Map reader name -> ``fn(rows)`` producing observation and next observation for rows."""
    import torch
    import zarr

    from atari_zarr import AtariZarrDataset
    from atari_zarr.layout import OBSERVATION

    out: dict[str, Callable[[np.ndarray], int]] = {}

    ds = AtariZarrDataset(env["store"])

    def ours(rows):
        return ds[rows].batch_size[0]

    out["atari_zarr AtariZarrDataset (TED batch)"] = ours

    zobs = zarr.open_group(env["store"], mode="r")[OBSERVATION]
    done = env["numpy"]["terminals"]
    n = len(done)

    def zarr_oindex(rows):
        nxt = rows[~done[rows]] + 1
        want = np.concatenate([rows, nxt])
        uniq, inv = np.unique(want, return_inverse=True)
        frames = zobs.oindex[uniq][inv]
        return len(rows) if frames.shape[0] else 0

    out["zarr-python oindex, same store"] = zarr_oindex

    from torchrl.data.datasets.atari_dqn import _AtariStorage

    storage = _AtariStorage(env["trl_path"])
    env["trl_len"] = len(storage)

    def torchrl(rows):
        # TorchRL's rows index its own storage (checkpoint buffers incl. padding rows).
        rows = torch.from_numpy(rows % len(storage))
        td = storage.get(rows)
        return td.batch_size[0]

    out["TorchRL AtariDQN storage (memmap)"] = torchrl

    # The same frames as one MemoryMappedTensor indexed directly: the best case of
    # TorchRL's uncompressed layout (what a consolidated TensorStorage does).
    from tensordict import MemoryMappedTensor

    flat = torch.cat([td.get(("data", "observation"))[:-1] for td in storage._split_tds])
    mm = MemoryMappedTensor.from_tensor(flat, filename=str(env["trl_path"].parent / "flat.memmap"))
    del flat
    term = torch.cat([td.get(("data", "next", "terminated")).reshape(-1) for td in storage._split_tds]).bool()

    def torchrl_flat(rows):
        idx = torch.from_numpy(rows % len(mm))
        o = mm[idx]
        nxt = mm[(idx + 1).clamp_max(len(mm) - 1)]
        nxt[term[idx]] = 0
        return o.shape[0]

    out["TorchRL memmap, one MemoryMappedTensor"] = torchrl_flat

    obs = env["numpy"]["observations"]

    def numpy_ram(rows):
        o = obs[rows]
        nxt = obs[np.minimum(rows + 1, n - 1)]
        nxt[done[rows]] = 0
        return len(o)

    out["d4rl-atari-style numpy in RAM"] = numpy_ram

    files, starts = env["hdf5"]

    def hdf5(rows):
        ep = np.searchsorted(starts, rows, side="right") - 1
        order = np.argsort(ep, kind="stable")
        o = np.empty((len(rows), 84, 84), np.uint8)
        nx = np.zeros_like(o)
        for e in np.unique(ep):
            sel = order[ep[order] == e]
            step = rows[sel] - starts[e]
            states = files[e]["states"]
            u, inv = np.unique(np.concatenate([step, step + 1]), return_inverse=True)
            u_ok = u[u < states.shape[0]]
            got = np.zeros((len(u), 84, 84), np.uint8)
            got[: len(u_ok)] = states[u_ok]
            o[sel] = got[inv[: len(step)]]
            nx[sel] = got[inv[len(step) :]]
        return len(rows)

    out["per-episode HDF5 files (h5py, uncompressed)"] = hdf5
    env["ds"] = ds
    return out


def run_read(size: str, game: str) -> str:
    import torch

    # One intra-op thread: on the shared 2-core machine, torch indexing with 2 threads
    # was 3-5x slower than with one (threads spin against other jobs).
    torch.set_num_threads(1)
    cfg = SIZES[size]
    with tempfile.TemporaryDirectory(prefix="atari_zarr_bench_") as tmp:
        work = Path(tmp)
        env = build(work, game, cfg["steps"], cfg["capacity"])
        env["numpy"] = load_numpy(env["store"])
        env["hdf5"] = write_hdf5(env["numpy"], work / "hdf5")
        fns = samplers(env)
        n = env["n"]
        secs = cfg["seconds"]
        # Readers take turns, ROUNDS times, and each keeps its best round: on a shared
        # machine this compares them under the same load rather than whoever ran last.
        best: dict[str, list[float]] = {name: [0.0] * 4 for name in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                nn = env["trl_len"] if name.startswith("TorchRL AtariDQN") else n
                rates = [
                    _rate(lambda rng, fn=fn, nn=nn: fn(_random_rows(rng, nn, 32)), secs / ROUNDS),
                    _rate(lambda rng, fn=fn, nn=nn: fn(_random_rows(rng, nn, 256)), secs / ROUNDS),
                    _rate(lambda rng, fn=fn, nn=nn: fn(_slice_rows(rng, nn)), secs / ROUNDS),
                ]
                t = time.perf_counter()
                for a in range(0, nn - 1, 256):
                    fn(np.arange(a, min(a + 256, nn)))
                rates.append(nn / (time.perf_counter() - t))
                best[name] = [max(a, b) for a, b in zip(best[name], rates)]
                print(name, " ".join(f"{r:,.0f}" for r in rates), file=sys.stderr)
        rows_md = [(name, *rates) for name, rates in best.items()]
        raw = n * 84 * 84
        sizes = {
            "raw frames (uint8)": raw,
            "gzip source, observation files": _du(env["logs"], "*observation*"),
            "gzip source, all files": _du(env["logs"]),
            "our store (all arrays)": _du(Path(env["store"])),
            "our store, observation only": _du(Path(env["store"]) / "observation"),
            "TorchRL memmap storage": _du(env["trl_path"]),
            "per-episode HDF5 files": _du(work / "hdf5"),
        }
        for f in env["hdf5"][0]:
            f.close()
        env["ds"]._frames.close()
    trl = next(r for r in rows_md if r[0].startswith("TorchRL AtariDQN"))
    flat = next(r for r in rows_md if r[0].startswith("TorchRL memmap"))
    ours = rows_md[0]
    lines = [
        f"- Data: {n:,} transitions of {game} ({cfg['steps']:,} real ALE frames"
        f"{', cycled from 20,000 recorded' if cfg['steps'] > 20_000 else ''}), "
        f"checkpoint capacity {cfg['capacity']:,}; TorchRL storage holds {env['trl_len']:,} rows "
        f"(whole checkpoint buffers).",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {_machine()}.",
        "",
        "| reader | random 32 | random 256 | slices 4×64 | sequential scan |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, *rates in rows_md:
        lines.append(f"| {name} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")
    lines += [
        "",
        f"Random 256, ours vs TorchRL's AtariDQN storage (both TED batches): "
        f"**{ours[2] / trl[2]:.2f}×**; vs a bare MemoryMappedTensor index (frames only, no TED "
        f"assembly): **{ours[2] / flat[2]:.2f}×**. Ours, slices vs random 256 per transition: "
        f"**{ours[3] / ours[2]:.2f}×**.",
        "",
        "| bytes on disk | MB | vs raw | vs gzip observation files |",
        "|---|--:|--:|--:|",
    ]
    gz = sizes["gzip source, observation files"]
    for k, v in sizes.items():
        lines.append(f"| {k} | {v / 1e6:,.2f} | {v / raw:.4f} | {v / gz:.2f} |")
    return "\n".join(lines)


# -- chunk and shard size check with this read path ------------------------------------------


def run_codecs(steps: int, seconds: float) -> str:
    import zlib

    import zarr
    from ale_frames import record_frames
    from zarr.codecs import BloscCodec, Crc32cCodec

    from atari_zarr.read.chunks import ChunkReader

    lines = [
        f"- {steps:,} real frames per game; Blosc zstd clevel 5 noshuffle + crc32c; rates are "
        f"random batches of 256 (obs + next obs) through `atari_zarr.read.chunks.ChunkReader` on "
        f"a LocalStore, cache off (the >RAM case) and with the default 128 MB cache.",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {_machine()}.",
        "",
        "| game | chunk | shard | store MB | vs gzip -9 | files | random 256 /s, no cache | random 256 /s, cache | scan /s |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for game in ("Pong", "Breakout", "SpaceInvaders"):
        frames = record_frames(game, 20_000, seed=0)[:steps]
        gz9 = len(zlib.compress(frames.tobytes(), 9))  # gzip -9 of the frame bytes
        for chunk, shard in ((8, 4096), (16, 4096), (16, 1024), (16, 16384), (32, 4096)):
            with tempfile.TemporaryDirectory() as tmp:
                a = zarr.create_array(
                    zarr.storage.LocalStore(tmp), shape=frames.shape, dtype="uint8",
                    chunks=(chunk, 84, 84),
                    shards={"shape": (shard, 84, 84), "index_location": "start"},
                    compressors=[BloscCodec(cname="zstd", clevel=5, shuffle="noshuffle", typesize=1), Crc32cCodec()],
                    fill_value=0,
                )
                a[:] = frames
                shards = [f for f in Path(tmp).rglob("*") if f.is_file() and f.name != "zarr.json"]
                nbytes = sum(f.stat().st_size for f in shards)
                files = len(shards)
                n = len(frames)
                rates = []
                for cache in (0, 128 << 20):
                    r = ChunkReader(a, where=tmp, cache_bytes=cache)

                    def batch(rng, r=r):
                        rows = rng.integers(0, n - 1, 256)
                        r.read(np.concatenate([rows, rows + 1]))
                        return 256

                    rates.append(_rate(batch, seconds))
                    r.close()
                r = ChunkReader(a, where=tmp)
                t = time.perf_counter()
                for s in range(0, n, 256):
                    r.read(np.arange(s, min(s + 256, n)))
                scan = n / (time.perf_counter() - t)
                r.close()
            lines.append(
                f"| {game} | {chunk} | {shard} | {nbytes / 1e6:.2f} | {nbytes / gz9:.2f} | {files} | "
                f"{rates[0]:,.0f} | {rates[1]:,.0f} | {scan:,.0f} |"
            )
            print(lines[-1], file=sys.stderr)
    return "\n".join(lines)


# -- opening a 50M-transition store ----------------------------------------------------------

_CHILD = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
import torch, atari_zarr
from atari_zarr import AtariZarrDataset  # the package imports the reader lazily
r0 = rss(); t0 = time.perf_counter()
ds = atari_zarr.AtariZarrDataset(sys.argv[1])
t1 = time.perf_counter(); r1 = rss()
b = ds.sample(256, generator=torch.Generator().manual_seed(0))
t2 = time.perf_counter(); r2 = rss()
print(json.dumps({"n": len(ds), "open_s": t1 - t0, "rss_before": r0, "rss_open": r1,
                  "sample_s": t2 - t1, "rss_sample": r2}))
"""


def run_open(n: int = 50_000_000, episodes: int = 25_000) -> str:
    import zarr

    from atari_zarr.layout import create_store, mark_complete

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Pong" / "1.zarr"
        lengths = [n // episodes] * episodes
        lengths[-1] += n - sum(lengths)
        rng = np.random.default_rng(0)
        attrs = {
            "kind": "dqn-replay", "game": "Pong", "run": "1",
            "episodes": {
                "length": lengths,
                "return": rng.integers(-21, 22, episodes).tolist(),
                "terminated": [True] * (episodes - 1) + [False],
            },
        }
        group = create_store(zarr.storage.LocalStore(path), n, attrs)
        # a complete store has every chunk (a missing one is damage): write, as zeros, the
        # per-step arrays the batch reads and the frame shards of its rows (the child's
        # sample draws these rows)
        import torch

        from atari_zarr.layout import ACTION, OBSERVATION, REWARD, for_writing

        for name in (ACTION, REWARD):
            array = for_writing(group[name])
            array[:] = np.zeros(array.shape, dtype=array.dtype)
        rows = torch.randint(0, n, (256,), generator=torch.Generator().manual_seed(0)).numpy()
        obs = for_writing(group[OBSERVATION])
        shard = int(obs.shards[0])
        # (and shard 0: positions of a batch that are padding read row 0, then zero it)
        for s in sorted({0} | {int(r) // shard for r in np.concatenate([rows, rows + 1])}):
            lo, hi = s * shard, min((s + 1) * shard, n)
            obs[lo:hi] = np.zeros((hi - lo, 84, 84), dtype=np.uint8)
        mark_complete(group, {})
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True
        )
        if out.returncode:
            raise RuntimeError(f"the 50M-row child failed:\n{out.stderr[-3000:]}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
    return (
        f"- {res['n']:,}-transition store (metadata, a {episodes:,}-episode table, zero-filled "
        f"action and reward arrays and the frame shards the first batch reads; no other "
        f"frames), opened in a fresh process after `import torch, atari_zarr` and the reader module.\n"
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {_machine()}.\n\n"
        f"| step | time | process RSS |\n|---|--:|--:|\n"
        f"| after imports | | {res['rss_before']:.0f} MB |\n"
        f"| `AtariZarrDataset(url)` | {res['open_s'] * 1e3:.0f} ms | {res['rss_open']:.0f} MB "
        f"(+{res['rss_open'] - res['rss_before']:.0f} MB) |\n"
        f"| first `sample(256)` | {res['sample_s'] * 1e3:.0f} ms | {res['rss_sample']:.0f} MB |"
    )


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--game", default="Pong")
    p.add_argument("--codecs", action="store_true", help="chunk/shard size table instead")
    p.add_argument("--open-50m", action="store_true", help="open-time/RSS check instead")
    p.add_argument("--out", type=Path, help="also write the markdown here")
    args = p.parse_args(argv)
    if args.codecs:
        full = args.size == "full"
        md = run_codecs(20_000 if full else 4_000, 2.0 if full else 0.5)
    elif args.open_50m:
        md = run_open()
    else:
        md = run_read(args.size, args.game)
    print(md)
    if args.out:
        args.out.write_text(md + "\n")


if __name__ == "__main__":
    main()
