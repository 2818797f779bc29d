"""Six games' frames: bytes per frame, and random access when the run is far larger than
the cache.

One command::

    python benchmarks/bench_corpus.py --steps 50000 --rounds 3

For each game (default Pong, Breakout, Seaquest, SpaceInvaders, MsPacman, Qbert) it
records ``--steps`` frames through ALE with DQN Replay's preprocessing (sticky actions
0.25, frame skip 4, 84x84 grayscale; ``benchmarks/ale_frames.py``) under a policy that
holds each action for four steps on average, as an agent does (``policy="repeat"``), and
builds and caches under ``--data`` (default ``benchmarks/.cache/corpus``):

* a DQN Replay run of those frames (episodes of 500-2,500 steps, checkpoints of 25,000)
  converted to our store (``atari_zarr.convert``, 16-frame chunks in 4,096-frame shards);
* copies of that store whose frames are rewritten in chunks of ``--chunks`` frames (the
  same codecs and shards, fingerprints recorded again): the candidates for random access;
* Lance datasets of the same frames, storage versions 2.0 and 2.1 (one binary column of
  7,056 bytes per frame, zstd; as ``bench_random.py`` writes them).

It reports bytes per frame of each, and of the frames as DQN Replay ships them
(``np.save`` into a ``gzip.GzipFile`` at its default level 9, as dopamine writes them).

With ``--rounds`` > 0 it then times random batches of 256 transitions at frame stack 4
(frames ``r-3 .. r+1`` of each), in rounds that alternate the readers:

* ours: ``AtariZarrDataset[rows]`` with a decoded-frame cache of ``--cache-share`` (2%)
  of the frames, so nearly every transition decodes its chunks afresh, as in a whole run
  (50M transitions) on a 24 GB machine; chunks decoded by c-blosc2 (the ``fast``
  extra), and for the store as converted also by numcodecs (the base install);
* Lance: ``take`` of the five frames of each transition, turned into one uint8 array.

Rates are transitions per second, the median of the rounds. Results go to
``benchmarks/results/corpus-<time>.json`` and the tables are printed.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GAMES = ("Pong", "Breakout", "Seaquest", "SpaceInvaders", "MsPacman", "Qbert")
BATCH = 256
FRAME_BYTES = 84 * 84


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def gzip_npy_bytes(frames: np.ndarray) -> int:
    """Bytes of ``frames`` as DQN Replay ships them: ``np.save`` in gzip at level 9."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9) as f:
        np.save(f, frames, allow_pickle=False)
    return buf.tell()


def build_store(root: Path, game: str, frames: np.ndarray) -> Path:
    """Our store of ``frames``, converted from a DQN Replay run of them (cached)."""
    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert

    store = root / "zarr" / game / "1.zarr"
    if (root / "built").exists():
        return store
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    n = len(frames)
    lengths = np.random.default_rng(0).integers(500, 2_501, size=1 + n // 500).tolist()
    write_fixture_run(
        str(root / "dqn"), game, "1", capacity=25_000, steps=n, episode_lengths=lengths,
        frames=lambda k: frames[k], actions=lambda k: k % 6, compresslevel=1,
    )
    convert(str(root / "dqn"), str(root / "zarr"), progress=False, workers=2)
    shutil.rmtree(root / "dqn")
    (root / "built").write_text("")
    return store


def rechunked(base: Path, dest: Path, frames: np.ndarray, chunk_rows: int) -> Path:
    """A copy of store ``base`` whose frames are in chunks of ``chunk_rows`` (cached)."""
    import zarr

    from atari_zarr import fingerprints
    from atari_zarr.conversion.shards import shard_encoder, write_shard
    from atari_zarr.layout import OBSERVATION

    if (dest / "zarr.json").exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp)
    group = zarr.open_group(str(tmp), mode="r+")
    old = group[OBSERVATION]
    attrs = {k: v for k, v in old.attrs.items() if k != fingerprints.FINGERPRINTS_KEY}
    shard_rows = old.shards[0]
    del group[OBSERVATION]
    new = group.create_array(
        OBSERVATION, shape=old.shape, dtype=old.dtype, chunks=(chunk_rows, 84, 84),
        shards=(shard_rows, 84, 84), compressors=list(old.compressors),
        dimension_names=old.metadata.dimension_names, attributes=attrs,
        config={"write_empty_chunks": True},
    )
    encode = shard_encoder(new)
    for s in range(-(-len(frames) // shard_rows)):
        lo, hi = s * shard_rows, min(len(frames), (s + 1) * shard_rows)
        if hi - lo == shard_rows and encode is not None:
            write_shard(new, s, encode(np.ascontiguousarray(frames[lo:hi])))
        else:
            new[lo:hi] = frames[lo:hi]
    fingerprints.record(group)
    zarr.consolidate_metadata(str(tmp))
    os.replace(tmp, dest)
    return dest


def build_lance(root: Path, frames, version: str, rows: int | None = None) -> Path:
    """The first ``rows`` (default all) of ``frames`` as a Lance dataset: one zstd binary
    column (cached). ``frames`` is anything sliced into numpy arrays: an array in memory,
    or a store's ``zarr.Array``, read 16,384 frames at a time."""
    import lance
    import pyarrow as pa

    uri = root / f"frames-{version}.lance"
    if (uri / "_versions").exists():
        return uri
    field = pa.field("observation", pa.binary(), metadata={"lance-encoding:compression": "zstd"})
    schema = pa.schema([field])
    n = len(frames) if rows is None else rows

    def batches():
        for start in range(0, n, 16_384):
            block = frames[start : min(n, start + 16_384)]
            flat = np.ascontiguousarray(block).reshape(-1, FRAME_BYTES)
            values = pa.array([row.tobytes() for row in flat], type=pa.binary())
            yield pa.RecordBatch.from_arrays([values], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    lance.write_dataset(reader, str(uri), schema=schema, data_storage_version=version)
    return uri


def lance_take(uri: Path) -> Callable[[np.ndarray], np.ndarray]:
    import lance

    data = lance.dataset(str(uri))
    span = np.arange(-3, 2)

    def take(rows: np.ndarray) -> np.ndarray:
        idx = (rows[:, None] + span[None, :]).ravel()
        col = data.take(idx.tolist(), columns=["observation"]).column(0)
        buf = col.combine_chunks() if hasattr(col, "combine_chunks") else col
        flat = np.frombuffer(buf.buffers()[2], dtype=np.uint8)
        return flat[: len(idx) * FRAME_BYTES].reshape(len(idx), 84, 84)

    return take


def ours(store: Path, cache_bytes: int, decoder: str) -> Callable[[np.ndarray], object]:
    """Random TED batches of our store, its chunks decoded by ``decoder``."""
    from atari_zarr import AtariZarrDataset, ReadOptions
    from atari_zarr.storage import engine

    ds = AtariZarrDataset(str(store), frame_stack=4, options=ReadOptions(frame_cache_bytes=cache_bytes))

    def read(rows: np.ndarray) -> object:
        engine._default_decoder = lambda: decoder  # the process's choice, for this reader
        return ds[rows]

    return read


def rate(
    fn: Callable[[np.ndarray], object], n: int, seconds: float, seed: int, warmup: float = 0.0
) -> float:
    """Rows per second of ``fn`` at random batches, after 3 batches and ``warmup`` seconds."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        fn(rng.integers(3, n - 1, BATCH))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        fn(rng.integers(3, n - 1, BATCH))
    done, t0 = 0, time.perf_counter()
    while True:
        fn(rng.integers(3, n - 1, BATCH))
        done += BATCH
        if time.perf_counter() - t0 >= seconds and done >= 3 * BATCH:
            return done / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", default=",".join(GAMES))
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--chunks", default="16,32,8,4", help="frame chunk sizes to compare")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--cache-share", type=float, default=0.02)
    p.add_argument("--data", type=Path, default=HERE / ".cache" / "corpus")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from ale_frames import record_frames

    chunks = [int(c) for c in args.chunks.split(",")]
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.processor() or ''}",
        "steps": args.steps, "policy": "repeat", "cache_share": args.cache_share,
        "games": {},
    }
    for game in args.games.split(","):
        frames = record_frames(game, args.steps, seed=0, policy="repeat")
        root = args.data / f"{game}_{args.steps}"
        base = build_store(root, game, frames)
        stores = {c: base if c == 16 else rechunked(base, root / f"chunks{c}.zarr", frames, c)
                  for c in chunks}
        lances = {v: build_lance(root, frames, v) for v in ("2.0", "2.1")}
        n = len(frames)
        entry = {
            "bytes_per_frame": {
                "gzip'd .npy (level 9)": gzip_npy_bytes(frames) / n,
                **{
                    f"ours, {c}-frame chunks": dir_bytes(s / "observation") / n
                    for c, s in stores.items()
                },
                **{f"Lance {v}": dir_bytes(u) / n for v, u in lances.items()},
            }
        }
        print(game, {k: round(v, 1) for k, v in entry["bytes_per_frame"].items()}, flush=True)
        if args.rounds > 0:
            cache = int(args.cache_share * n * FRAME_BYTES)
            fns = {
                **{f"ours, {c}-frame chunks": ours(s, cache, "blosc2") for c, s in stores.items()},
                **{f"ours, {c}-frame chunks, numcodecs": ours(s, cache, "numcodecs")
                   for c, s in stores.items() if c == 16},
                **{f"Lance {v} take": lance_take(u) for v, u in lances.items()},
            }
            runs: dict[str, list[float]] = {k: [] for k in fns}
            for r in range(args.rounds):
                for name, fn in fns.items():
                    runs[name].append(rate(fn, n, args.seconds, seed=r))
            entry["random_stack4"] = {k: round(statistics.median(v)) for k, v in runs.items()}
            entry["random_stack4_runs"] = {k: [round(x) for x in v] for k, v in runs.items()}
            print(game, entry["random_stack4"], flush=True)
        results["games"][game] = entry
    out = HERE / "results" / f"corpus-{time.strftime('%Y%m%dT%H%M', time.gmtime())}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
