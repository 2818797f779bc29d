"""Remote reading from fake-gcs-server on loopback: time and bytes fetched.

Builds a store locally (fixture frames, or real ALE frames with ``--ale GAME``),
or takes a store already written (``--store``), uploads it to a fake-gcs-server on
127.0.0.1 and reads it through a counting proxy that waits ``--delay`` seconds before
each response (a network's round trip):

* open (metadata + per-step arrays) and the first batch,
* random batches of ``--batch`` transitions (observation + next observation),
* contiguous slices of ``--batch`` transitions,
* a second epoch of the same random batches through a local ``cache=`` directory.

"Needed" bytes are the compressed sizes of the distinct 16-frame chunks a read
touches (taken from the shard indexes of the local copy): the least any reader of
this layout must fetch. "New" bytes are those of the chunks a batch touches that no
earlier batch of the row touched: what a reader that fetched each byte once would
fetch. Without ``--delay``, times measure the client's overhead (gcsfs, zarr,
decoding), not a network.

Usage::

    python benchmarks/bench_remote.py --transitions 200000 --batches 50
    python benchmarks/bench_remote.py --transitions 20000 --ale Pong   # real frames
    python benchmarks/bench_remote.py --store benchmarks/.cache/stream_Pong_60000/zarr/Pong/1.zarr \
        --delay 0.02 --batches 20 --batch 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

# Before anything imports gcsfs: its default file system class probes every bucket
# over gRPC, which the emulator lacks (~60 s each). See docs/gcs-emulator.md.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import numpy as np
from atari_zarr_testkit import write_fixture_run
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

from atari_zarr import convert
from atari_zarr.layout import ARRAYS, OBSERVATION
from atari_zarr.read.dataset import AtariZarrDataset
from atari_zarr.read.options import ReadOptions

BUCKET = "bench-remote"


def chunk_sizes(store_dir: str, n_rows: int) -> np.ndarray:
    """Compressed bytes of every 16-frame observation chunk, from the shard indexes."""
    spec = ARRAYS[OBSERVATION]
    per_shard = spec.shard_rows // spec.chunk_rows
    sizes = []
    for shard in range((n_rows + spec.shard_rows - 1) // spec.shard_rows):
        raw = (Path(store_dir) / OBSERVATION / "c" / str(shard) / "0" / "0").read_bytes()
        index = np.frombuffer(raw[: per_shard * 16], dtype="<u8").reshape(per_shard, 2)
        nbytes = np.where(index[:, 0] == 2**64 - 1, 0, index[:, 1])
        sizes.append(nbytes)
    return np.concatenate(sizes)[: (n_rows + spec.chunk_rows - 1) // spec.chunk_rows]


def touched_chunks(rows: np.ndarray, ds: AtariZarrDataset) -> np.ndarray:
    """Observation chunks holding ``rows`` and their next observations."""
    done = np.asarray(ds._store.done[rows], dtype=bool)
    return np.unique(np.concatenate([rows, rows[~done] + 1]) // ARRAYS[OBSERVATION].chunk_rows)


def build_store(args: argparse.Namespace, tmp: Path) -> tuple[str, int, float]:
    """A local store of ``--transitions`` fixture (or ALE) frames: its path, length, build time."""
    n = args.transitions
    frames = None
    if args.ale:
        from ale_frames import record_frames

        recorded = record_frames(args.ale, n + 2000, seed=0)
        frames = recorded.__getitem__
    t0 = time.perf_counter()
    write_fixture_run(
        str(tmp / "src"),
        "Pong",
        "1",
        capacity=n // 2 + 1000,
        steps=n + 2000,
        seed=0,
        max_episode_length=2000,
        frames=frames,
    )
    [local] = convert(str(tmp / "src"), str(tmp / "stores"), progress=False)
    return local.url, local.transitions, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transitions", type=int, default=200_000)
    ap.add_argument("--store", metavar="DIR", help="read this local store instead of building one")
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds the proxy waits per request")
    ap.add_argument("--gap", type=int, help="ReadOptions.coalesce_gap (default: its own)")
    ap.add_argument("--ale", metavar="GAME", help="real ALE frames of GAME (slow to record)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    options = ReadOptions() if args.gap is None else ReadOptions(coalesce_gap=args.gap)
    tmp = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    if args.store:
        store_dir = args.store
        n = len(AtariZarrDataset(store_dir))
        build_s = 0.0
        frames_kind = f"store {Path(store_dir).resolve()}"
    else:
        store_dir, n, build_s = build_store(args, tmp)
        frames_kind = f"ALE {args.ale}" if args.ale else "fixture"
    sizes = chunk_sizes(store_dir, n)

    out: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, {os.cpu_count()} cores",
        "frames": frames_kind,
        "transitions": n,
        "build_s": round(build_s, 1),
        "delay_s": args.delay,
        "coalesce_gap": options.coalesce_gap,
        "kept_bytes": options.kept_bytes,
    }
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        import fsspec

        fs = fsspec.filesystem("gs", **srv.storage_options())
        fs.put(store_dir, f"{BUCKET}/Pong/1.zarr", recursive=True)
        fs.invalidate_cache()
        stored = int(fs.du(f"{BUCKET}/Pong/1.zarr"))
        out["store_bytes"] = stored
        out["obs_bytes_per_transition"] = round(float(sizes.sum()) / n, 1)
        url = f"gs://{BUCKET}/Pong/1.zarr"
        rng = np.random.default_rng(0)
        batches = [rng.integers(0, n, args.batch) for _ in range(args.batches)]
        with CountingProxy(srv.endpoint_url, delay=args.delay) as proxy:
            opts = srv.storage_options(endpoint_url=proxy.endpoint_url)

            def run(label: str, ds_kwargs: dict, reads: list) -> None:
                proxy.reset()
                t0 = time.perf_counter()
                ds = AtariZarrDataset(url, storage_options=opts, options=options, **ds_kwargs)
                t_open = time.perf_counter() - t0
                open_req, open_bytes = proxy.requests, proxy.bytes_received
                proxy.reset()
                seen: set[int] = set()
                need = count = 0
                first_fetched = later_fetched = later_new = 0
                t1 = time.perf_counter()
                t_first = 0.0
                for i, sel in enumerate(reads):
                    before = proxy.bytes_received
                    ds[sel]
                    rows = np.arange(sel.start, sel.stop) if isinstance(sel, slice) else sel
                    chunks = touched_chunks(rows, ds)
                    new = [int(c) for c in chunks if int(c) not in seen]
                    seen.update(new)
                    fetched = proxy.bytes_received - before
                    if i == 0:
                        t_first = time.perf_counter() - t0
                        first_fetched = fetched
                    else:
                        later_fetched += fetched
                        later_new += int(sizes[new].sum())
                    need += int(sizes[chunks].sum())
                    count += len(rows)
                dt = time.perf_counter() - t1
                out[label] = {
                    "open_s": round(t_open, 3),
                    "open_requests": open_req,
                    "open_bytes": open_bytes,
                    "open_plus_first_batch_s": round(t_first, 3),
                    "transitions_per_s": round(count / dt),
                    "requests_per_batch": round(proxy.requests / len(reads), 1),
                    "fetched_bytes_per_transition": round(proxy.bytes_received / count),
                    "needed_bytes_per_transition": round(need / count),
                    "fetched_fraction_of_store": round(proxy.bytes_received / stored, 4),
                    "first_batch_bytes": first_fetched,
                    "later_fetched_over_new": (
                        round(later_fetched / later_new, 2) if later_new else None
                    ),
                }

            run("random_batches", {}, batches)
            starts = rng.integers(0, n - args.batch, args.batches)
            run("slices", {}, [slice(int(s), int(s) + args.batch) for s in starts])
            cache = tmp / "cache"
            run("random_batches_cache_cold", {"cache": cache}, batches)
            run("random_batches_cache_warm", {"cache": cache}, batches)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    head = {k: v for k, v in out.items() if not isinstance(v, dict)}
    print(" ".join(f"{k}={v}" for k, v in head.items()))
    cols = [
        "open_plus_first_batch_s",
        "transitions_per_s",
        "requests_per_batch",
        "fetched_bytes_per_transition",
        "needed_bytes_per_transition",
        "fetched_fraction_of_store",
        "later_fetched_over_new",
    ]
    print("| read | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for k, v in out.items():
        if isinstance(v, dict):
            print(f"| {k} | " + " | ".join(str(v[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
