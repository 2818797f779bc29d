"""What a second core gives chunk decoding: threads of one process against two processes.

One command::

    python benchmarks/bench_threads.py

Data: 3,000 random chunks (16 frames, 112,896 bytes decoded) of the real Pong store of
``benchmarks/stream_data.py`` (``--steps`` transitions, built and cached as there).
Each figure is chunks (or calls) per second over ``--seconds``, one worker against two:

* **processes**: two forked processes decoding at once with python-blosc2, into one
  113 KB buffer that stays in the processor's cache and into a distinct slot of a large
  array per chunk: what the machine's two cores do without a GIL between them (its
  memory bandwidth included);
* **threads**: two threads of one process decoding at once, with each decoder of
  ``atari_zarr.storage.blosc`` (c-blosc2 through ctypes, python-blosc2, numcodecs);
* **the chunk loop**: ``atari_zarr.storage.chunk_loop``, 300 chunks checked and decoded
  a call (the GIL released once a call), in one thread and in two;
* **handing the GIL over**: libc's ``memset`` through ctypes (which releases the GIL for
  every call, as the decoders that release it do) on buffers whose call takes about 1, 3
  and 16 µs, in one thread and in two.

The result goes to ``benchmarks/results/threads-<time>.json`` and a table to stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import sys
import threading
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _chunks(store: str) -> tuple[list[bytes], tuple[int, ...]]:
    import zarr

    from atari_zarr.storage.engine import ChunkEngine

    engine = ChunkEngine(zarr.open_group(store, mode="r")["observation"], where=store)
    assert engine.grid is not None
    cids = np.random.default_rng(0).integers(0, engine.grid.n_chunks, 3000).tolist()
    return [bytes(c.data)[:-4] for c in engine.fetch(cids)], engine.grid.chunk_shape


def _decode_for(store: str, name: str, into: str, seconds: float) -> float:
    from atari_zarr.storage.blosc import blosc_decoder

    data, shape = _chunks(store)
    decode = blosc_decoder(name)
    small = np.empty(shape, np.uint8)
    big = np.ones((len(data), *shape), np.uint8)  # touched: no page faults in the timing
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for i, src in enumerate(data):
            decode(src, small if into == "cache" else big[i])
        n += len(data)
    return n / (time.perf_counter() - t0)


def _process(q: Any, store: str, into: str, seconds: float) -> None:
    q.put(_decode_for(store, "blosc2", into, seconds))


def processes(store: str, into: str, seconds: float) -> dict[str, float]:
    """Chunks per second, one process and two at once (python-blosc2)."""
    ctx = get_context("fork")
    out = {}
    for k in (1, 2):
        q = ctx.Queue()
        procs = [ctx.Process(target=_process, args=(q, store, into, seconds)) for _ in range(k)]
        for p in procs:
            p.start()
        out[str(k)] = sum(q.get() for _ in procs)
        for p in procs:
            p.join()
    return out


def _in_threads(work: Any, k: int) -> float:
    rates: list[float] = []
    threads = [threading.Thread(target=lambda: rates.append(work())) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(rates)


def threads(store: str, name: str, seconds: float) -> dict[str, float]:
    """Chunks per second, one thread and two at once, into a cache-resident buffer."""
    work = lambda: _decode_for(store, name, "cache", seconds)  # noqa: E731
    return {str(k): _in_threads(work, k) for k in (1, 2)}


def _loop_for(store: str, seconds: float) -> float:
    """Chunks per second of the compiled chunk loop, 300 chunks a call (a batch's), each
    into its own slot of a resident buffer, crc32c checked."""
    import google_crc32c

    from atari_zarr.storage.chunk_loop import Destinations, chunk_loop

    loop = chunk_loop()
    assert loop is not None, "the chunk loop was not built"
    data, shape = _chunks(store)
    stored = [
        np.frombuffer(d + google_crc32c.value(d).to_bytes(4, "little"), np.uint8) for d in data
    ]
    src = np.array([s.ctypes.data for s in stored], dtype=np.uint64)
    srclen = np.array([s.size for s in stored], dtype=np.int64)
    out = np.ones((300 * shape[0], *shape[1:]), np.uint8)
    dest = Destinations(out, np.arange(300) * shape[0], shape[0]).addresses()
    nbytes = int(np.prod(shape))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for a in range(0, len(stored) - 299, 300):
            loop.run(src[a : a + 300], srclen[a : a + 300], dest, nbytes, checksum=True)
        n += len(stored) // 300 * 300
    return n / (time.perf_counter() - t0)


def chunk_loop_threads(store: str, seconds: float) -> dict[str, float]:
    """Chunks per second of the chunk loop, in one thread and in two at once."""
    return {str(k): _in_threads(lambda: _loop_for(store, seconds), k) for k in (1, 2)}


def handover(nbytes: int, seconds: float) -> dict[str, float]:
    """``memset`` calls per second through ctypes (the GIL released each call)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

    def work() -> float:
        buf = np.empty(nbytes, np.uint8)
        ptr, n, t0 = buf.ctypes.data, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(1000):
                libc.memset(ptr, 1, nbytes)
            n += 1000
        return n / (time.perf_counter() - t0)

    return {str(k): _in_threads(work, k) for k in (1, 2)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    from stream_data import build_run

    store = build_run("Pong", args.steps)["store"]
    rows: dict[str, dict[str, float]] = {}
    for into in ("cache", "array"):
        rows[
            f"python-blosc2, processes, into {'one buffer' if into == 'cache' else 'an array'}"
        ] = processes(store, into, args.seconds)
    for name in ("libblosc2", "blosc2", "numcodecs"):
        rows[f"{name}, threads"] = threads(store, name, args.seconds)
    rows["the chunk loop (300 chunks a call, crc32c checked), threads"] = chunk_loop_threads(
        store, args.seconds
    )
    for nbytes in (112_896, 450_000, 2_000_000):
        one = handover(nbytes, 0.5)["1"]  # the call's own time, for the label
        rows[f"memset of {nbytes:,} bytes ({1e6 / one:.1f} µs a call), threads"] = handover(
            nbytes, args.seconds
        )
    print("| workers | one, per s | two, per s | two / one |")
    print("|---|--:|--:|--:|")
    for label, r in rows.items():
        print(f"| {label} | {r['1']:,.0f} | {r['2']:,.0f} | {r['2'] / r['1']:.2f}x |")
    from result_file import save_result

    out = save_result("threads", args=vars(args), per_second=rows)
    print(out)


if __name__ == "__main__":
    main()
