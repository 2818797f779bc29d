"""How random are the stream's batches? Distinct shards and episodes per batch.

The stream (``AtariZarrDataset.stream``) reads whole shards in a random order and
mixes the rows of ``window = shuffle_buffer // 4096`` shards at a time. This script
compares its batches with uniform sampling (``ds.sample``), per batch of 256:

* distinct shards (read units) in the batch,
* distinct episodes in the batch,
* the largest share of the batch from one episode,

for a few ``shuffle_buffer`` sizes, with the memory each costs per consumer
(:func:`atari_zarr.read.stream.stream_memory_bound`). The order of an epoch is
arithmetic (:class:`atari_zarr.read.epoch.EpochPlan`), so no store is read: the
episode of each row comes from a store's per-episode table when ``--store`` is
given, otherwise from episode lengths drawn like DQN Replay's Pong (about 2,000
steps per episode in a 1,000,000-transition run).

Usage::

    python benchmarks/stream_randomness.py
    python benchmarks/stream_randomness.py --store path/to/Pong/1.zarr --batch 256
"""

from __future__ import annotations

import argparse

import numpy as np

from atari_zarr.read.epoch import EpochPlan, unit_bounds
from atari_zarr.read.stream import stream_memory_bound

SHARD = 4096


def episode_ids(n: int, mean_length: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(mean_length), 0.5, n // mean_length * 2))
    lengths = lengths.astype(np.int64)
    ends = np.cumsum(lengths)
    return np.searchsorted(ends, np.arange(n), side="right")


def stream_rows(n: int, shuffle_buffer: int, unit_rows: int = SHARD, seed: int = 0) -> np.ndarray:
    """The rows of one epoch in the order the stream emits them (one consumer)."""
    bounds = unit_bounds(n, shard_rows=SHARD, unit_rows=unit_rows)
    plan = EpochPlan(
        bounds,
        seed=seed,
        epoch=0,
        shuffle=True,
        window=max(1, shuffle_buffer // unit_rows),
        consumer=0,
        consumers=1,
    )
    parts = []
    for s in plan.segments:
        pos, row = plan.segment(s)
        parts.append(bounds[plan.units[pos], 0] + row)
    return np.concatenate(parts)


def per_batch(
    rows: np.ndarray, episode: np.ndarray, batch: int, unit_rows: int = SHARD
) -> dict[str, float]:
    k = len(rows) // batch
    b = rows[: k * batch].reshape(k, batch)
    shards = np.mean([np.unique(r // unit_rows).size for r in b])
    eps = [np.unique(episode[r], return_counts=True)[1] for r in b]
    return {
        "shards": float(shards),
        "episodes": float(np.mean([e.size for e in eps])),
        "top_episode_share": float(np.mean([e.max() / batch for e in eps])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--episode-length", type=int, default=2000)
    parser.add_argument("--store", help="take the episodes from this store's table")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    if args.store:
        from atari_zarr import AtariZarrDataset

        ds = AtariZarrDataset(args.store)
        episode = ds.episodes.numpy()
    else:
        episode = episode_ids(args.transitions, args.episode_length)
    n = len(episode)
    rng = np.random.default_rng(1)
    uniform = rng.integers(0, n, (n // args.batch) * args.batch)
    print(f"{n:,} transitions, {episode.max() + 1:,} episodes, batches of {args.batch}\n")
    print(
        "| order | shuffle_buffer | unit_rows | memory per consumer | units/batch "
        "| episodes/batch | largest episode share |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|")
    u = per_batch(uniform, episode, args.batch)
    print(
        f"| uniform sampling | | | | {u['shards']:.1f} (shards) | {u['episodes']:.1f} "
        f"| {u['top_episode_share']:.1%} |"
    )
    for buf, unit in [
        (4096, SHARD),
        (16384, SHARD),
        (65536, SHARD),
        (262144, SHARD),
        (16384, 1024),
        (65536, 1024),
    ]:
        s = per_batch(stream_rows(n, buf, unit), episode, args.batch, unit)
        mem = stream_memory_bound(1, shuffle_buffer=buf, unit_rows=unit) / 2**20
        print(
            f"| stream | {buf:,} | {unit:,} | {mem:,.0f} MB | {s['shards']:.1f} "
            f"| {s['episodes']:.1f} | {s['top_episode_share']:.1%} |"
        )


if __name__ == "__main__":
    main()
