"""Epoch streaming against random access, locally and from a bucket with network latency.

One command::

    python benchmarks/bench_stream.py                 # 1,000,000 transitions of real Pong play
    python benchmarks/bench_stream.py --steps 100000  # a quicker run

What it builds (cached under ``benchmarks/.cache/``, see ``benchmarks/stream_data.py``):
real ALE play of Pong (random policy, DQN Replay preprocessing, two seeds recorded in
two processes and concatenated, real episode ends), written as DQN Replay checkpoint
files, converted into our store, and preprocessed by TorchRL into its AtariDQN storage.

What it measures, in transitions per second (each transition with its next observation):

* **local**: TorchRL's AtariDQN storage at random batches of 256 (page cache hot, as in
  ``benchmarks/read_benchmark.py``), our ``sample(256)``, a sequential scan of our
  store, and one epoch of ``AtariZarrDataset.stream(256)``;
* **remote**: the store uploaded to fake-gcs-server on 127.0.0.1, read through
  :class:`atari_zarr_testkit.proxy.CountingProxy` holding every request for a fixed
  delay (one round trip per HTTP request: 0, 20 and 50 ms): random batches of 256
  without and with prefetch, and one epoch of the stream, with the time to the first
  batch, the bytes fetched against the store's size, the requests and the time each
  request spent in the proxy.

Every figure is printed with the load average at the time it was taken. The results go
to ``benchmarks/results/stream-<date>.json`` and a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Before anything imports gcsfs: its default file system class probes every bucket
# over gRPC, which the emulator lacks (~60 s each). See docs/gcs-emulator.md.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from read_benchmark import _machine, _random_rows, _rate  # noqa: E402
from stream_data import build_run  # noqa: E402

RESULTS = HERE / "results"
BUCKET = "bench-stream"
BATCH = 256
#: Epochs read after the first by one stream, as a training job reads them.
LATER_EPOCHS = 5
X = "\N{MULTIPLICATION SIGN}"


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of another process (the emulator), from /proc."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu
        )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "summary": _machine(),
    }


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def warm_page_cache(path: Path) -> None:
    """Read every file once so random reads below hit the page cache (as read_benchmark)."""
    for p in sorted(Path(path).rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


# -- what is measured ----------------------------------------------------------------------


def has_stream(ds: Any) -> bool:
    return callable(getattr(ds, "stream", None))


def stream_kwargs(ds: Any, extra: dict[str, Any]) -> dict[str, Any]:
    import inspect

    params = inspect.signature(ds.stream).parameters
    return {k: v for k, v in extra.items() if k in params}


def stream_batches(ds: Any, workers: int) -> Iterator[Any]:
    """One epoch of ``ds.stream(256)``, in this process or through DataLoader workers."""
    stream = ds.stream(BATCH, seed=0, epoch=0)
    if workers:
        return iter(stream.loader(num_workers=workers, multiprocessing_context="fork"))
    return iter(stream)


def _rank_epoch(args: tuple[str, dict, int, int, Any]) -> dict[str, float]:
    """One rank's part of an epoch, in its own process (as a DDP rank reads it)."""
    url, opts, rank, world, start = args
    import fsspec
    import torch

    import atari_zarr.read.stream  # noqa: F401  (imported before the clock, as in a running job)
    from atari_zarr import AtariZarrDataset

    if "://" in url:
        fsspec.get_filesystem_class(url.split("://", 1)[0])  # gcsfs, imported ahead too
    torch.set_num_threads(1)
    start.wait()
    t0 = time.time()
    ds = AtariZarrDataset(url, storage_options=opts)
    n, first = 0, None
    for batch in ds.stream(BATCH, seed=0, epoch=0, rank=rank, world_size=world):
        n += int(batch.batch_size[0])
        if first is None:
            first = time.time() - t0
    return {"n": n, "t0": t0, "t1": time.time(), "first": first or float("nan")}


def ranks_stream(url: str, opts: dict, ranks: int) -> dict[str, Any]:
    """One epoch read by ``ranks`` processes at once, each its rank's part (no batch IPC)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        start = manager.Event()
        with ctx.Pool(ranks) as pool:
            res = pool.map_async(_rank_epoch, [(url, opts, r, ranks, start) for r in range(ranks)])
            time.sleep(3.0)  # let the processes import everything before the clock starts
            start.set()
            parts = res.get()
    t0 = min(p["t0"] for p in parts)
    wall = max(p["t1"] for p in parts) - t0
    n = sum(p["n"] for p in parts)
    return {
        "transitions": n,
        "complete_epoch": True,
        "seconds": round(wall, 3),
        "first_batch_s": round(max(p["first"] for p in parts), 3),
        "open_plus_first_batch_s": round(max(p["first"] for p in parts), 3),
        "transitions_per_s": round(n / wall),
        "ranks": ranks,
        "load": load(),
    }


def time_stream(
    batches: Iterator[Any], *, max_seconds: float, on_batch: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Drain a stream: time to the first batch, rate after it, transitions, rate per batch."""
    t0 = time.perf_counter()
    c0 = cpu_seconds()
    n = 0
    first = None
    per_batch: list[tuple[float, int]] = []
    complete = True
    t_prev = t0
    for batch in batches:
        now = time.perf_counter()
        size = int(batch.batch_size[0])
        if first is None:
            first = now - t0
        n += size
        per_batch.append((now - t_prev, size))
        t_prev = now
        if on_batch is not None:
            on_batch()
        if now - t0 > max_seconds:
            complete = False
            break
    wall = time.perf_counter() - t0
    after_first = wall - (first or 0.0)
    n_after = n - (per_batch[0][1] if per_batch else 0)
    return {
        "transitions": n,
        "batches": len(per_batch),
        "complete_epoch": complete,
        "seconds": round(wall, 3),
        "first_batch_s": round(first or float("nan"), 3),
        "transitions_per_s": round(n / wall),
        "transitions_per_s_after_first": round(n_after / after_first) if after_first > 0 else None,
        "client_cpu_cores": round((cpu_seconds() - c0) / wall, 2),
        "load": load(),
    }


def random_rate(sample: Callable[[np.random.Generator], int], seconds: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    c0 = cpu_seconds()
    rate = _rate(sample, seconds)
    wall = time.perf_counter() - t0
    return {
        "transitions_per_s": round(rate),
        "client_cpu_cores": round((cpu_seconds() - c0) / wall, 2),
        "load": load(),
    }


def local_figures(
    meta: dict[str, Any], seconds: float, max_epoch_s: float, workers: int, ranks: int
) -> dict[str, Any]:
    import torch
    from torchrl.data.datasets.atari_dqn import _AtariStorage

    from atari_zarr import AtariZarrDataset

    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as read_benchmark.py: torch indexing with 2 threads was slower here
    out: dict[str, Any] = {}
    n = meta["n"]

    print(
        f"warming the page cache ({du(meta['trl_path']) / 1e9:.1f} GB of TorchRL storage)",
        file=sys.stderr,
    )
    warm_page_cache(meta["trl_path"])
    storage = _AtariStorage(meta["trl_path"])
    n_trl = len(storage)

    def torchrl(rng: np.random.Generator) -> int:
        rows = torch.from_numpy(_random_rows(rng, n_trl, BATCH))
        return int(storage.get(rows).batch_size[0])

    ds = AtariZarrDataset(meta["store"])

    def ours(rng: np.random.Generator) -> int:
        return int(ds[_random_rows(rng, n, BATCH)].batch_size[0])

    # Interleaved rounds, best of each (as read_benchmark.py), so load hits both alike.
    rounds = 3
    best: dict[str, dict[str, Any]] = {}
    for _ in range(rounds):
        for name, fn in (("torchrl_random_256", torchrl), ("ours_random_256", ours)):
            r = random_rate(fn, seconds / rounds)
            print(f"  {name}: {r}", file=sys.stderr)
            if name not in best or r["transitions_per_s"] > best[name]["transitions_per_s"]:
                best[name] = r
    out.update(best)
    out["torchrl_rows"] = n_trl
    # the same read at torch's default intra-op threads, as a user runs it (reported
    # beside the one-thread figure, which the ratios use)
    torch.set_num_threads(default_threads)
    r = random_rate(torchrl, seconds / rounds)
    torch.set_num_threads(1)
    r["threads"] = default_threads
    out["torchrl_random_256_default_threads"] = r
    print(f"  torchrl_random_256_default_threads: {r}", file=sys.stderr)

    t = time.perf_counter()
    c0 = cpu_seconds()
    for a in range(0, n, BATCH):
        ds[np.arange(a, min(a + BATCH, n))]
    wall = time.perf_counter() - t
    out["ours_sequential_scan"] = {
        "transitions_per_s": round(n / wall),
        "client_cpu_cores": round((cpu_seconds() - c0) / wall, 2),
        "load": load(),
    }
    print(f"  ours_sequential_scan: {out['ours_sequential_scan']}", file=sys.stderr)

    if has_stream(ds) and ranks > 1:
        r = ranks_stream(str(meta["store"]), {}, ranks)
        r["fraction_of_epoch"] = round(r["transitions"] / n, 4)
        out[f"ours_stream_256_ranks{ranks}"] = r
        print(f"  ours_stream_256_ranks{ranks}: {r}", file=sys.stderr)
    if has_stream(ds):
        for w in sorted({0, workers}):
            name = "ours_stream_256" + (f"_workers{w}" if w else "")
            fresh = AtariZarrDataset(meta["store"])
            r = time_stream(stream_batches(fresh, w), max_seconds=max_epoch_s)
            r["workers"] = w
            r["fraction_of_epoch"] = round(r["transitions"] / n, 4)
            out[name] = r
            print(f"  {name}: {r}", file=sys.stderr)
        # the epochs after the first, as a training job reads them: one stream, set_epoch;
        # by default, and with every unit kept decoded (keep_units=True) where it may
        for name, extra in (("", {}), ("_keep_units", {"keep_units": True})):
            kwargs = stream_kwargs(ds, extra)
            if kwargs != extra:
                continue  # this version has no such option
            r = later_epochs(AtariZarrDataset(meta["store"]), kwargs, max_epoch_s)
            r["fraction_of_epoch"] = round(r["transitions"] / n, 4)
            r["keep_units"] = bool(extra)
            out[f"ours_stream_256{name}_later_epochs"] = r
            print(f"  ours_stream_256{name}_later_epochs: {r}", file=sys.stderr)
    return out


def later_epochs(ds: Any, kwargs: dict[str, Any], max_epoch_s: float) -> dict[str, Any]:
    """The epochs after the first of one stream (``set_epoch``), as a training job
    reads them: the first epoch read untimed, then ``LATER_EPOCHS`` timed."""
    stream = ds.stream(BATCH, seed=0, epoch=0, **kwargs)
    for _ in stream:
        pass

    def epochs() -> Iterator[Any]:
        for e in range(1, LATER_EPOCHS + 1):
            stream.set_epoch(e)
            yield from stream

    r = time_stream(epochs(), max_seconds=max_epoch_s)
    r["epochs"] = LATER_EPOCHS
    return r


def remote_figures(
    meta: dict[str, Any],
    delays: list[float],
    seconds: float,
    max_epoch_s: float,
    prefetch: int,
    workers: int,
    ranks: int,
) -> dict[str, Any]:
    import fsspec
    from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

    from atari_zarr import AtariZarrDataset

    out: dict[str, Any] = {}
    n = meta["n"]
    with FakeGCSServer() as srv:
        srv.create_bucket(BUCKET)
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **srv.storage_options())
        t = time.perf_counter()
        fs.put(str(meta["store"]).rstrip("/") + "/", f"{BUCKET}/Pong/1.zarr/", recursive=True)
        fs.invalidate_cache()
        store_bytes = int(fs.du(f"{BUCKET}/Pong/1.zarr", total=True))
        objects = len(fs.find(f"{BUCKET}/Pong/1.zarr"))
        out["store_bytes"] = store_bytes
        out["store_objects"] = objects
        out["upload_s"] = round(time.perf_counter() - t, 1)
        url = f"gs://{BUCKET}/Pong/1.zarr"
        with CountingProxy(srv.endpoint_url) as proxy:
            opts = srv.storage_options(endpoint_url=proxy.endpoint_url)

            def traffic(wall: float) -> dict[str, Any]:
                d = np.asarray(proxy.durations)
                return {
                    "requests": proxy.requests,
                    "bytes_fetched": proxy.bytes_received,
                    "bytes_fetched_over_store": round(proxy.bytes_received / store_bytes, 4),
                    "ms_per_request_mean": round(1e3 * float(d.mean()), 1) if len(d) else None,
                    "ms_per_request_p50": round(1e3 * float(np.median(d)), 1) if len(d) else None,
                    "ms_per_request_p90": round(1e3 * float(np.quantile(d, 0.9)), 1)
                    if len(d)
                    else None,
                    "requests_in_flight_mean": round(float(d.sum()) / wall, 1) if wall else None,
                }

            for delay in delays:
                key = f"{round(delay * 1e3)}ms"
                proxy.delay = delay
                row: dict[str, Any] = {}

                # random batches of 256, as today's reader does them
                proxy.reset()
                t0 = time.perf_counter()
                ds = AtariZarrDataset(url, storage_options=opts)
                opened = time.perf_counter() - t0
                open_req = proxy.requests
                rng = np.random.default_rng(1)
                ds[_random_rows(rng, n, BATCH)]
                first = time.perf_counter() - t0
                proxy.reset()
                s0 = proc_cpu_seconds(srv.pid)
                t1 = time.perf_counter()
                r = random_rate(
                    lambda g, ds=ds: int(ds[_random_rows(g, n, BATCH)].batch_size[0]), seconds
                )
                wall = time.perf_counter() - t1
                r.update(traffic(wall))
                r["open_s"] = round(opened, 3)
                r["open_requests"] = open_req
                r["open_plus_first_batch_s"] = round(first, 3)
                r["server_cpu_cores"] = round((proc_cpu_seconds(srv.pid) - s0) / wall, 2)
                row["random_256"] = r
                print(f"  {key} random_256: {r}", file=sys.stderr)

                if prefetch and callable(getattr(ds, "sample_iter", None)):
                    row["random_256_prefetch"] = remote_random_prefetch(
                        url, opts, n, prefetch, seconds, proxy, traffic, srv.pid
                    )
                    print(
                        f"  {key} random_256_prefetch: {row['random_256_prefetch']}",
                        file=sys.stderr,
                    )

                ws = sorted({0, workers}) if abs(delay - 0.02) < 1e-9 else [0]
                for w in ws if has_stream(ds) else []:
                    proxy.reset()
                    t0 = time.perf_counter()
                    fresh = AtariZarrDataset(url, storage_options=opts)
                    opened = time.perf_counter() - t0
                    open_req, open_bytes = proxy.requests, proxy.bytes_received
                    proxy.reset()
                    s0 = proc_cpu_seconds(srv.pid)
                    r = time_stream(stream_batches(fresh, w), max_seconds=max_epoch_s)
                    r["workers"] = w
                    r.update(traffic(r["seconds"]))
                    r["open_s"] = round(opened, 3)
                    r["open_requests"] = open_req
                    r["open_bytes"] = open_bytes
                    r["open_plus_first_batch_s"] = round(opened + r["first_batch_s"], 3)
                    r["fraction_of_epoch"] = round(r["transitions"] / n, 4)
                    r["server_cpu_cores"] = round(
                        (proc_cpu_seconds(srv.pid) - s0) / r["seconds"], 2
                    )
                    name = "stream_256" + (f"_workers{w}" if w else "")
                    row[name] = r
                    print(f"  {key} {name}: {r}", file=sys.stderr)
                if has_stream(ds) and ranks > 1 and abs(delay - 0.02) < 1e-9:
                    proxy.reset()
                    s0 = proc_cpu_seconds(srv.pid)
                    r = ranks_stream(url, opts, ranks)
                    r.update(traffic(r["seconds"]))
                    r["fraction_of_epoch"] = round(r["transitions"] / n, 4)
                    r["server_cpu_cores"] = round(
                        (proc_cpu_seconds(srv.pid) - s0) / r["seconds"], 2
                    )
                    row[f"stream_256_ranks{ranks}"] = r
                    print(f"  {key} stream_256_ranks{ranks}: {r}", file=sys.stderr)
                out[key] = row
    return out


def remote_random_prefetch(url, opts, n, prefetch, seconds, proxy, traffic, pid) -> dict[str, Any]:
    """Random batches of 256 through ``sample_iter`` with ``prefetch`` batches in flight."""
    import torch

    from atari_zarr import AtariZarrDataset

    proxy.reset()
    t0 = time.perf_counter()
    ds = AtariZarrDataset(url, storage_options=opts)
    opened = time.perf_counter() - t0
    proxy.reset()
    s0 = proc_cpu_seconds(pid)
    batches = ds.sample_iter(BATCH, prefetch=prefetch, generator=torch.Generator().manual_seed(1))
    r = time_stream(iter(batches), max_seconds=seconds)
    r.update(traffic(r["seconds"]))
    r["prefetch"] = prefetch
    r["open_plus_first_batch_s"] = round(opened + r["first_batch_s"], 3)
    r["server_cpu_cores"] = round((proc_cpu_seconds(pid) - s0) / r["seconds"], 2)
    r.pop("complete_epoch")
    return r


# -- report ----------------------------------------------------------------------------------


def stream_label(r: dict[str, Any]) -> str:
    what = "one epoch" if r["complete_epoch"] else f"{r['fraction_of_epoch']:.0%} of an epoch"
    if r.get("epochs"):
        what = f"its next {r['epochs']} epochs (`set_epoch`)"
    workers = r.get("workers") or 0
    how = f", {workers} DataLoader workers" if workers else ""
    if r.get("ranks"):
        how = f" in {r['ranks']} processes (`rank=r, world_size={r['ranks']}`)"
    call = "stream(256, keep_units=True)" if r.get("keep_units") else "stream(256)"
    return f"`{call}`{how}, {what}"


def markdown(res: dict[str, Any]) -> str:
    loc = res.get("local", {})
    lines = [
        f"- Data: {res['data']['n']:,} transitions of real {res['data']['game']} play "
        f"({res['data']['episodes']:,} episodes; store {res['data']['store_mb']:.1f} MB, "
        f"TorchRL storage {res['data']['torchrl_gb']:.2f} GB).",
        f"- Date: {res['date']}; machine: {res['machine']['nproc']} cores "
        f"({res['machine']['cpu']}), {res['machine']['ram_gb']} GB RAM, Python "
        f"{res['machine']['python']}; load: the 1-minute load average when each figure was "
        f"taken (other jobs ran on the machine).",
        "",
        "| where | read | transitions/s | first batch | fetched / store | requests "
        "| ms per request | load |",
        "|---|---|--:|--:|--:|--:|--:|---|",
    ]

    def row(where: str, name: str, r: dict[str, Any] | None) -> None:
        if not r:
            return
        fb = r.get("open_plus_first_batch_s", r.get("first_batch_s"))
        ratio = r.get("bytes_fetched_over_store")
        lines.append(
            f"| {where} | {name} | {r['transitions_per_s']:,} | "
            f"{'' if fb is None else f'{fb:.2f} s'} | {'' if ratio is None else f'{ratio:.3f}'} | "
            f"{r.get('requests', '')} | {r.get('ms_per_request_mean') or ''} | "
            f"{r['load'].split()[0]} |"
        )

    row("local", "TorchRL AtariDQN storage, random 256", loc.get("torchrl_random_256"))
    dflt = loc.get("torchrl_random_256_default_threads")
    if dflt:
        row("local", f"the same, torch's default {dflt['threads']} threads", dflt)
    row("local", "ours, random 256 (`ds[rows]`)", loc.get("ours_random_256"))
    row("local", "ours, sequential scan", loc.get("ours_sequential_scan"))
    for name, r in sorted(loc.items()):
        if name.startswith("ours_stream_256"):
            row("local", stream_label(r), r)
    for key, r in res.get("remote", {}).items():
        if not isinstance(r, dict) or "random_256" not in r:
            continue
        row(f"gs:// {key}", "random 256", r.get("random_256"))
        pre = r.get("random_256_prefetch")
        if pre:
            row(f"gs:// {key}", f"random 256, `sample_iter(prefetch={pre['prefetch']})`", pre)
        for name, s in sorted(r.items()):
            if name.startswith("stream_256"):
                row(f"gs:// {key}", stream_label(s), s)
    return "\n".join([*lines, "", *targets(res)])


def targets(res: dict[str, Any]) -> list[str]:
    """The issue's targets, each with the figure it is checked against."""
    out = []
    loc = res.get("local", {})
    stream = loc.get("ours_stream_256")
    trl = loc.get("torchrl_random_256")
    ours = loc.get("ours_random_256")
    if stream and trl and ours:
        s, t, o = (r["transitions_per_s"] for r in (stream, trl, ours))
        out.append(
            f"- Local stream, one process, vs TorchRL's storage at random 256: "
            f"**{s / t:.1f}{X}** "
            f"(target ≥ 10{X}: {'met' if s >= 10 * t else 'missed'}); vs our random 256: "
            f"**{s / o:.2f}{X}**."
        )
        for key, how in (("", "by default"), ("_keep_units", "with `keep_units=True`")):
            later = loc.get(f"ours_stream_256{key}_later_epochs")
            if not later:
                continue
            v = later["transitions_per_s"]
            out.append(
                f"- The same over its next {later['epochs']} epochs, {how} (a training "
                f"job's steady state; the random figure is warm too): **{v / t:.1f}{X}** "
                f"TorchRL's (target ≥ 10{X}: {'met' if v >= 10 * t else 'missed'}); vs our "
                f"warm random 256: **{v / o:.2f}{X}** (target ≥ 1{X}: "
                f"{'met' if v >= o else 'missed'})."
            )
    r20 = res.get("remote", {}).get("20ms", {})
    st = r20.get("stream_256")
    if st:
        ok = st["transitions_per_s"] >= 100_000
        out.append(
            f"- Remote stream at 20 ms: **{st['transitions_per_s']:,}/s** (target ≥ 100,000: "
            f"{'met' if ok else 'missed'}); first batch **{st['open_plus_first_batch_s']:.2f} s** "
            f"after opening (target ≤ 1 s: "
            f"{'met' if st['open_plus_first_batch_s'] <= 1 else 'missed'}); bytes fetched per "
            f"epoch **{st['bytes_fetched_over_store']:.3f}{X}** the store (target ≤ 1.05: "
            f"{'met' if st['bytes_fetched_over_store'] <= 1.05 else 'missed'}); "
            f"{st['requests']:,} requests per epoch, {st['ms_per_request_mean']} ms each in the "
            f"proxy on average ({st['requests_in_flight_mean']} in flight)."
        )
    for name, r in [*loc.items(), *r20.items()]:
        if "ranks" in name:
            where = "Local" if name.startswith("ours") else "Remote (20 ms)"
            vs = ""
            if where == "Local" and trl:
                ratio = r["transitions_per_s"] / trl["transitions_per_s"]
                vs = f" ({ratio:.1f}{X} TorchRL's storage)"
            out.append(
                f"- {where} stream in {r['ranks']} processes, one rank each (what DDP "
                f"ranks read): **{r['transitions_per_s']:,}/s** together{vs}."
            )
    pre = r20.get("random_256_prefetch")
    if pre:
        ok = pre["transitions_per_s"] >= 5_000
        rate = pre["transitions_per_s"]
        out.append(
            f"- Remote random 256 with prefetch at 20 ms: **{rate:,}/s** "
            f"(target ≥ 5,000: {'met' if ok else 'missed'})."
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--game", default="Pong")
    p.add_argument("--seconds", type=float, default=6.0, help="per random-access figure")
    p.add_argument(
        "--max-epoch-seconds",
        type=float,
        default=240.0,
        help="stop a stream epoch after this long (reported as a part of an epoch)",
    )
    p.add_argument("--delays", default="0,0.02,0.05", help="proxy delays in seconds")
    p.add_argument("--prefetch", type=int, default=4, help="batches in flight, random access")
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="also stream through a DataLoader with this many workers, locally and "
        "at 20 ms (0: no)",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=2,
        help="also read one epoch in this many processes, one rank each, locally "
        "and at 20 ms (1: no)",
    )
    p.add_argument("--skip-local", action="store_true")
    p.add_argument("--skip-remote", action="store_true")
    args = p.parse_args(argv)

    meta = build_run(args.game, args.steps)
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "data": {
            "game": meta["game"],
            "n": meta["n"],
            "episodes": meta["episodes"],
            "store_mb": du(Path(meta["store"])) / 1e6,
            "torchrl_gb": du(Path(meta["trl_path"])) / 1e9,
        },
        "load_at_start": load(),
    }
    if not args.skip_local:
        res["local"] = local_figures(
            meta, args.seconds, args.max_epoch_seconds, args.workers, args.ranks
        )
    if not args.skip_remote:
        delays = [float(d) for d in args.delays.split(",") if d.strip()]
        res["remote"] = remote_figures(
            meta,
            delays,
            args.seconds,
            args.max_epoch_seconds,
            args.prefetch,
            args.workers,
            args.ranks,
        )
    res["load_at_end"] = load()
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M", time.gmtime())
    path = RESULTS / f"stream-{stamp}.json"
    path.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(markdown(res))
    print(f"\n(results: {path.relative_to(HERE.parent)})", file=sys.stderr)


if __name__ == "__main__":
    main()
