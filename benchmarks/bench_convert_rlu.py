"""Benchmark converting RL Unplugged shards: frames/s per scheduler, the two passes, size, stages.

    python benchmarks/bench_convert_rlu.py [--games Pong Breakout Asterix] [--shards 4]
                                           [--shard-steps 30000] [--record 30000]
                                           [--schedulers processes threads] [--workers 2]
                                           [--png libpng|fixture] [--keep]

1. **Source.** For each game, ``--record`` real ALE frames (``ale_frames.record_frames``:
   random play, DQN's preprocessing) are PNG-encoded once, the way ``tf.io.encode_png``
   encodes them (libpng at zlib level 6 with its adaptive filters, through OpenCV:
   ``bench_rlu_decode.libpng_encode``; ``--png fixture`` uses the fixtures'
   ``encode_frame`` instead). ``--shards`` shards of ``--shard-steps`` Example steps each
   are written as ``{Game}/run_1-0000i-of-0000N`` with the package's fixture writer
   (``encode_episode``, ``atari_zarr_testkit.rl_unplugged.write_shard``: TFRecord framing,
   masked CRC-32C, GZIP level 6, as ``TFRecordWriter(options="GZIP")`` writes them).
   Episodes are 1,000-3,000 steps (about the dataset's mean of 2,000), terminal, of
   consecutive frames (the recording is read in order, wrapping round). Built once under
   ``benchmarks/.cache/rlu_convert/``, reused while the parameters are the same.
2. **Conversion.** ``atari_zarr.convert(root, dest, source_kind="rl-unplugged",
   scheduler=S, workers=W)`` for every scheduler, each in a fresh subprocess, into a
   fresh directory. The times of the two passes per run come from the package's log
   records: *scan* runs from "scanning" to "writing" (pass 1 over every shard, the plan,
   creating the store), *write* from "writing" to "wrote" (pass 2: the frames). CPU time is
   the subprocess's and its (exited) worker processes'.
3. **Size.** Bytes of each store against bytes of its source shards, per frame.
4. **Stages.** One shard of each game, in this process, one core, CPU time (best of
   ``--repeat``): inflating the GZIP stream alone; ``open_shard`` + ``iter_records``
   (inflate, framing, both CRC-32Cs); ``parse_episode`` without frames (what the scan
   parses) and with them; ``decode_frames`` into one preallocated array; the Blosc
   encoding of whole 4096-frame shards (``conversion.shards.shard_encoder``, the write
   path's). Their sum over both passes (the scan: records + parse without frames; the
   write: records + parse + decode + encode) against the conversion's measured CPU per
   frame gives "other": Dask, zarr's store writes, the work area, copies.

Every figure is printed with the load average (1, 5, 15 min) when it was taken; the
report is a markdown table on stdout and JSON in ``benchmarks/results/convert-rlu-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ale_frames import record_frames  # noqa: E402
from bench_stream import du, load, machine  # noqa: E402

CACHE = HERE / ".cache" / "rlu_convert"
RESULTS = HERE / "results"
FORMAT = 1  # bump when the source written changes


# -- the source ----------------------------------------------------------------------------
def _pngs(game: str, record: int, png: str) -> list[bytes]:
    frames = record_frames(game, record, 0)
    if png == "libpng":
        from bench_rlu_decode import libpng_encode

        return libpng_encode(frames)
    from atari_zarr.sources.rl_unplugged.png import encode_frame

    return [encode_frame(f) for f in frames]


def _lengths(rng: np.random.Generator, total: int) -> list[int]:
    """Episode lengths (Example steps) of 1,000-3,000 summing to ``total``."""
    out: list[int] = []
    while sum(out) < total:
        out.append(int(rng.integers(1000, 3001)))
    out[-1] -= sum(out) - total
    if out[-1] < 100 and len(out) > 1:  # no stub episode: give its steps to the one before
        out[-2] += out.pop()
    return out


def build_source(root: Path, games: list[str], shards: int, shard_steps: int, record: int,
                 png: str, seed: int = 0) -> dict[str, Any]:
    """Write the shards (once); return what was written."""
    from atari_zarr_testkit.rl_unplugged import shard_name, write_shard

    from atari_zarr.sources.rl_unplugged.example import Episode, encode_episode

    stamp = root / "built.json"
    want = {"format": FORMAT, "games": games, "shards": shards, "shard_steps": shard_steps,
            "record": record, "png": png, "seed": seed}
    if stamp.exists():
        built = json.loads(stamp.read_text())
        if built.get("want") == want:
            return built
    shutil.rmtree(root, ignore_errors=True)
    info: dict[str, Any] = {"want": want, "games": {}}
    for game in games:
        t0 = time.perf_counter()
        pngs = _pngs(game, record, png)
        rng = np.random.default_rng(seed)
        pos = 0
        steps = episodes = 0
        for index in range(shards):
            records = []
            for k, length in enumerate(_lengths(rng, shard_steps)):
                real = length - 1  # the last step is the terminal observation alone
                actions = rng.integers(0, 6, length).astype(np.int64)
                raw = np.where(rng.random(length) < 0.02, rng.choice([-1.0, 1.0, 4.0], length),
                               0.0).astype(np.float32)
                actions[real:] = 0
                raw[real:] = 0
                clipped = np.clip(raw, -1, 1).astype(np.float32)
                discounts = np.ones(length, np.float32)
                discounts[-1] = 0
                ep = Episode(
                    checkpoint_idx=index,
                    episode_idx=k,
                    episode_return=float(raw[:real].sum(dtype=np.float32)),
                    clipped_episode_return=float(clipped[:real].sum(dtype=np.float32)),
                    observations=[pngs[(pos + j) % len(pngs)] for j in range(length)],
                    actions=actions,
                    unclipped_rewards=raw,
                    clipped_rewards=clipped,
                    discounts=discounts,
                )
                pos += length
                records.append(encode_episode(ep))
                steps += length
                episodes += 1
            write_shard(root / game / shard_name(1, index, shards), records)
        info["games"][game] = {
            "steps": steps,
            "episodes": episodes,
            "png_bytes_mean": float(np.mean([len(p) for p in pngs])),
            "source_bytes": du(root / game),
        }
        print(f"  wrote {shards} shards of {game}: {steps} steps, "
              f"{info['games'][game]['source_bytes'] / 1e6:.1f} MB in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    stamp.write_text(json.dumps(info, indent=1))
    return info


# -- the conversion, in a fresh process ----------------------------------------------------
def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _convert_child(source: str, dest: str, scheduler: str, workers: int) -> None:
    from atari_zarr import convert

    events: list[tuple[float, str]] = []

    class Events(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append((time.perf_counter(), record.getMessage()))

    logger = logging.getLogger("atari_zarr")
    logger.setLevel(logging.INFO)
    logger.addHandler(Events())
    t0 = time.perf_counter()
    stores = convert(source, dest, source_kind="rl-unplugged", scheduler=scheduler,
                     workers=workers, progress=False)
    seconds = time.perf_counter() - t0
    runs = []
    for store in stores:
        label = f"{store.game}/{store.run}"

        def at(prefix: str, label: str = label, url: str = store.url) -> float:
            return next(t for t, m in events if m.startswith(prefix) and (label in m or url in m))

        runs.append({
            "game": store.game,
            "transitions": store.transitions,
            "episodes": store.episodes,
            "scan_s": at("writing") - at("scanning"),
            "write_s": at("wrote") - at("writing"),
            "store_bytes": du(Path(store.url)),
        })
    print(json.dumps({"seconds": seconds, "cpu_self_s": _cpu(resource.RUSAGE_SELF),
                      "cpu_children_s": _cpu(resource.RUSAGE_CHILDREN), "runs": runs}))


def run_conversion(source: Path, dest: Path, scheduler: str, workers: int) -> dict[str, Any]:
    shutil.rmtree(dest, ignore_errors=True)
    before = load()
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(source), str(dest), scheduler, str(workers)],
        check=True, capture_output=True, text=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(scheduler=scheduler, workers=workers, load_before=before, load_after=load())
    return result


# -- the stages, in isolation --------------------------------------------------------------
def best_cpu(fn: Callable[[], Any], repeat: int) -> float:
    """Best CPU seconds of ``fn()`` over ``repeat`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def measure_stages(game_dir: Path, game: str, repeat: int) -> dict[str, float]:
    """µs per frame of each stage on shard 0 of ``game_dir``'s run 1, one core."""
    import zarr

    from atari_zarr.conversion.shards import shard_encoder
    from atari_zarr.layout import OBSERVATION, create_store
    from atari_zarr.sources.gzip_stream import open_gzip
    from atari_zarr.sources.rl_unplugged.example import parse_episode
    from atari_zarr.sources.rl_unplugged.files import RluRun
    from atari_zarr.sources.rl_unplugged.png import decode_frames
    from atari_zarr.sources.rl_unplugged.tfrecord import iter_records

    run = RluRun(str(game_dir), game, "1")
    index = run.suffixes[0]
    where = run.where(index)
    path = run.shards[index].path

    def inflate() -> None:
        with open(path, "rb") as raw, open_gzip(raw) as stream:
            while stream.read(1 << 20):
                pass

    def records() -> None:
        with run.open(index) as stream:
            for _ in iter_records(stream, where):
                pass

    with run.open(index) as stream:
        datas = [data for _, data in iter_records(stream, where)]
    eps = [parse_episode(d, where, r) for r, d in enumerate(datas)]
    steps = sum(e.steps for e in eps)
    frames = np.empty((steps, 84, 84), np.uint8)

    def parse_scan() -> None:
        for r, d in enumerate(datas):
            parse_episode(d, where, r, observations=False)

    def parse_full() -> None:
        for r, d in enumerate(datas):
            parse_episode(d, where, r)

    def decode() -> None:
        at = 0
        for r, e in enumerate(eps):
            decode_frames(e.observations, where, r, out=frames[at : at + e.steps])
            at += e.steps

    arr = create_store(zarr.storage.MemoryStore(), 4096, {})[OBSERVATION]
    encode_shard = shard_encoder(arr)
    assert encode_shard is not None
    whole = (steps // 4096) * 4096

    def encode() -> None:
        for a in range(0, whole, 4096):
            encode_shard(frames[a : a + 4096])

    us = {
        "inflate": best_cpu(inflate, repeat) / steps * 1e6,
        "records": best_cpu(records, repeat) / steps * 1e6,
        "parse_scan": best_cpu(parse_scan, repeat) / steps * 1e6,
        "parse_full": best_cpu(parse_full, repeat) / steps * 1e6,
        "png_decode": best_cpu(decode, repeat) / steps * 1e6,
        "blosc_encode": best_cpu(encode, repeat) / whole * 1e6,
    }
    us["scan_pass"] = us["records"] + us["parse_scan"]
    us["write_pass"] = us["records"] + us["parse_full"] + us["png_decode"] + us["blosc_encode"]
    return us


# -- the report ----------------------------------------------------------------------------
def report(res: dict[str, Any]) -> str:
    src = res["source"]["games"]
    frames = sum(g["steps"] for g in src.values())
    lines = [
        "Source: " + ", ".join(f"{g} {v['steps']:,} steps" for g, v in src.items()) + "; "
        f"{res['args']['shards']} shards per game, episodes 1,000-3,000 steps, PNGs "
        f"{res['args']['png']}, decoded by {res['decoder']}. Machine: "
        f"{res['machine']['summary']}, {res['machine']['ram_gb']} GB RAM.",
        "",
        "| scheduler | workers | frames/s | wall s | scan pass s | write pass s | "
        "CPU µs/frame | load before (1/5/15 min) | load after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res["conversions"]:
        rows = sum(r["transitions"] for r in c["runs"])
        cpu = c["cpu_self_s"] + c["cpu_children_s"]
        lines.append(
            f"| {c['scheduler']} | {c['workers']} | {rows / c['seconds']:,.0f} | "
            f"{c['seconds']:.1f} | {sum(r['scan_s'] for r in c['runs']):.1f} | "
            f"{sum(r['write_s'] for r in c['runs']):.1f} | {cpu / rows * 1e6:.0f} | "
            f"{c['load_before']} | {c['load_after']} |"
        )
    lines += ["", "| game | store bytes/frame | source bytes/frame | store / source |",
              "|---|---|---|---|"]
    last = res["conversions"][-1]["runs"]
    for r in last:
        s = src[r["game"]]
        lines.append(
            f"| {r['game']} | {r['store_bytes'] / r['transitions']:.0f} | "
            f"{s['source_bytes'] / s['steps']:.0f} | {r['store_bytes'] / s['source_bytes']:.3f} |"
        )
    store = sum(r["store_bytes"] for r in last)
    source = sum(s["source_bytes"] for s in src.values())
    lines.append(f"| all | {store / sum(r['transitions'] for r in last):.0f} | "
                 f"{source / frames:.0f} | {store / source:.3f} |")
    stages = res["stages"]
    names = ["inflate", "records", "parse_scan", "parse_full", "png_decode", "blosc_encode",
             "scan_pass", "write_pass"]
    lines += ["", "Stages, µs per frame on one core (CPU time, best of "
              f"{res['args']['repeat']}; load {res['stages_load']}):", "",
              "| game | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for game, us in stages.items():
        lines.append(f"| {game} | " + " | ".join(f"{us[n]:.1f}" for n in names) + " |")
    mean = {n: float(np.mean([us[n] for us in stages.values()])) for n in names}
    for c in res["conversions"]:
        rows = sum(r["transitions"] for r in c["runs"])
        cpu = (c["cpu_self_s"] + c["cpu_children_s"]) / rows * 1e6
        both = mean["scan_pass"] + mean["write_pass"]
        lines.append(
            f"\n{c['scheduler']}: {cpu:.0f} µs CPU per frame = {mean['scan_pass']:.0f} scan "
            f"+ {mean['write_pass']:.0f} write (stages) + {cpu - both:.0f} other; on "
            f"{res['machine']['nproc']} cores the stages alone allow "
            f"{res['machine']['nproc'] / both * 1e6:,.0f} frames/s."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", nargs="+", default=["Pong", "Breakout", "Asterix"])
    p.add_argument("--shards", type=int, default=4, help="shards per game")
    p.add_argument("--shard-steps", type=int, default=30000, help="Example steps per shard")
    p.add_argument("--record", type=int, default=30000, help="ALE frames recorded per game")
    p.add_argument("--png", choices=["libpng", "fixture"], default="libpng")
    p.add_argument("--schedulers", nargs="+", default=["processes", "threads"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="rounds of each stage timing")
    p.add_argument("--no-stages", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the converted stores")
    args = p.parse_args(argv)

    machine_info = machine()
    load_start = load()
    source = build_source(CACHE / "source", args.games, args.shards, args.shard_steps,
                          args.record, args.png)
    from importlib.metadata import version

    from atari_zarr.sources.rl_unplugged.png import decoder_name

    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info,
        "decoder": decoder_name(),
        "versions": {p: version(p) for p in ("atari-zarr", "imagecodecs", "numcodecs", "zarr",
                                              "dask")},
        "args": vars(args),
        "load_at_start": load_start,
        "source": source,
        "conversions": [],
    }
    dest = CACHE / "stores"
    for scheduler in args.schedulers:
        res["conversions"].append(
            run_conversion(CACHE / "source", dest / scheduler, scheduler, args.workers))
        print(f"  {scheduler}: {res['conversions'][-1]['seconds']:.1f} s", file=sys.stderr)
    res["stages_load"] = load()
    res["stages"] = {} if args.no_stages else {
        game: measure_stages(CACHE / "source" / game, game, args.repeat) for game in args.games
    }
    res["load_at_end"] = load()
    if not args.keep:
        shutil.rmtree(dest, ignore_errors=True)
    text = report(res) if res["stages"] else json.dumps(res["conversions"], indent=1)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"convert-rlu-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    path.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(f"\n(results: {path.relative_to(HERE.parent)})", file=sys.stderr)
    return res


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _convert_child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
