"""Benchmark Blosc chunk size / codec / level for 84x84 uint8 Atari frames.

    python benchmarks/codec_choice.py [--steps N] [--seed S] [--repeats R] [--batches B] [--games G ...] [--out PATH]

For each game (Pong, Breakout, SpaceInvaders) real ALE frames are recorded
(see ``ale_frames.py``) and cut into chunks of ``c`` consecutive frames
(``c`` in 4, 8, 16, 32, 64; a shorter last chunk is kept).  Every chunk is
compressed with numcodecs Blosc (shuffle=NOSHUFFLE, typesize=1), single-threaded,
for cname in {lz4, zstd}, clevel in {1, 3, 5} and two blocksizes: "auto"
(blocksize=0, the default of ``zarr.codecs.BloscCodec``) and "chunk" (blocksize =
chunk bytes, i.e. one Blosc block per chunk).

Measured per (game, cname, clevel, block, chunk):

* ratio        raw bytes / sum of compressed chunk bytes
* vs gz9       compressed store size / gzip -9 size of the whole ``.npy``
               (the "source" size: DQN Replay ships gzip-compressed .npy)
* enc MB/s     raw MB / wall time to compress all chunks (best of repeats)
* dec us/chunk mean time of ``numcodecs.blosc.decompress(src, dest)`` into a
               preallocated buffer (best of 3 full passes)
* rand fr/s    random access, one thread: for 256 uniformly random frames
               decompress the chunk holding each frame (no cache, no
               de-duplication -- on a large dataset two samples of a batch
               practically never share a chunk) and copy the frame out;
               frames per second, median over batches
* b256+next ms one training batch: 256 random (obs, next_obs) pairs; a pair
               whose next_obs lies in the following chunk costs a second
               chunk decode; median batch latency in ms

A markdown report is printed and written to ``docs/codec-choice.md``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numcodecs.blosc as blosc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ale_frames import record_frames  # noqa: E402

GAMES = ("Pong", "Breakout", "SpaceInvaders")
CNAMES = ("lz4", "zstd")
CLEVELS = (1, 3, 5)
CHUNKS = (4, 8, 16, 32, 64)
# Blosc blocksize: "auto" (blocksize=0, the numcodecs/zarr default) or "chunk"
# (blocksize = whole chunk, i.e. one Blosc block per chunk).
BLOCKS = ("auto", "chunk")
BATCH = 256
FRAME_BYTES = 84 * 84
MB = 1e6

# Constraints used for the recommendation.
MAX_VS_GZ9 = 1.0  # store must not be larger than the gzip -9 source
STRETCH_VS_GZ9 = 0.8
MIN_ENC_MBPS = 150.0  # per core

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "codec-choice.md"


@dataclass
class Row:
    game: str
    cname: str
    clevel: int
    block: str
    chunk: int
    raw: int
    comp: int
    gz9: int
    enc_mbps: float
    dec_us: float
    rand_fps: float
    pair_ms: float

    @property
    def ratio(self) -> float:
        return self.raw / self.comp

    @property
    def vs_gz9(self) -> float:
        return self.comp / self.gz9


def _gzip9(frames: np.ndarray) -> tuple[int, float]:
    """Size and seconds of gzip level 9 of the whole .npy file.

    isal.igzip would be faster but only supports levels 0-3 (level 9 raises
    IsalError), so the level-9 reference always uses stdlib gzip (zlib).
    """
    buf = io.BytesIO()
    np.save(buf, frames)
    data = buf.getvalue()
    t0 = time.perf_counter()
    size = len(gzip.compress(data, compresslevel=9, mtime=0))
    return size, time.perf_counter() - t0


def _bench_config(
    frames: np.ndarray,
    cname: str,
    clevel: int,
    block: str,
    chunk: int,
    repeats: int,
    batches: int,
    rng: np.random.Generator,
) -> tuple[int, float, float, float, float]:
    n = len(frames)
    views = [frames[i : i + chunk] for i in range(0, n, chunk)]
    cn = cname.encode()
    bs = 0 if block == "auto" else chunk * FRAME_BYTES

    # --- encode (best of repeats; the first pass also gives the sizes) ---
    enc_best = float("inf")
    comp: list[bytes] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        comp = [blosc.compress(v, cn, clevel, blosc.NOSHUFFLE, bs, 1) for v in views]
        enc_best = min(enc_best, time.perf_counter() - t0)
    comp_bytes = sum(len(c) for c in comp)

    # round-trip check on a few chunks
    for k in (0, len(comp) // 2, len(comp) - 1):
        assert blosc.decompress(comp[k]) == views[k].tobytes()

    # --- full sequential decode into preallocated buffers (best of 3; cheap) ---
    full = np.empty((chunk, 84, 84), np.uint8)
    dests = [full if len(v) == chunk else np.empty(v.shape, np.uint8) for v in views]
    dec_best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for c, d in zip(comp, dests):
            blosc.decompress(c, d)
        dec_best = min(dec_best, time.perf_counter() - t0)
    dec_us = dec_best / len(comp) * 1e6

    # --- random access: 256 random frames, one chunk decode each ---
    out = np.empty((BATCH, 84, 84), np.uint8)
    out_next = np.empty((BATCH, 84, 84), np.uint8)
    times = []
    for _ in range(batches):
        idx = rng.integers(0, n, BATCH)
        t0 = time.perf_counter()
        for j, i in enumerate(idx.tolist()):
            k, o = divmod(i, chunk)
            d = dests[k]
            blosc.decompress(comp[k], d)
            out[j] = d[o]
        times.append(time.perf_counter() - t0)
    rand_fps = BATCH / float(np.median(times))

    # --- batch of 256 (obs, next_obs) pairs ---
    times = []
    for _ in range(batches):
        idx = rng.integers(0, n - 1, BATCH)
        t0 = time.perf_counter()
        for j, i in enumerate(idx.tolist()):
            k, o = divmod(i, chunk)
            d = dests[k]
            blosc.decompress(comp[k], d)
            out[j] = d[o]
            if o + 1 < chunk:
                out_next[j] = d[o + 1]
            else:  # next obs is first frame of the next chunk
                d2 = dests[k + 1]
                blosc.decompress(comp[k + 1], d2)
                out_next[j] = d2[0]
        times.append(time.perf_counter() - t0)
    pair_ms = float(np.median(times)) * 1e3

    enc_mbps = frames.nbytes / enc_best / MB
    return comp_bytes, enc_mbps, dec_us, rand_fps, pair_ms


def _cmd(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # pragma: no cover - informational only
        return "?"


def _fmt_table(rows: list[Row]) -> str:
    head = (
        "| game | cname | lvl | block | chunk | ratio | vs gz9 | enc MB/s | dec µs/chunk "
        "| rand fr/s | b256+next ms |\n"
        "|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = [
        f"| {r.game} | {r.cname} | {r.clevel} | {r.block} | {r.chunk} | {r.ratio:.1f} | {r.vs_gz9:.2f} "
        f"| {r.enc_mbps:.0f} | {r.dec_us:.1f} | {r.rand_fps:,.0f} | {r.pair_ms:.2f} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


@dataclass
class Agg:
    cname: str
    clevel: int
    block: str
    chunk: int
    worst_vs_gz9: float
    total_vs_gz9: float
    min_enc: float
    min_rand_fps: float
    max_pair_ms: float
    mean_dec_us: float


def _key(x: Row | Agg) -> tuple[str, int, str, int]:
    return (x.cname, x.clevel, x.block, x.chunk)


def _aggregate(rows: list[Row]) -> list[Agg]:
    keys = sorted({_key(r) for r in rows}, key=lambda k: (CNAMES.index(k[0]), k[1], BLOCKS.index(k[2]), k[3]))
    out = []
    for key in keys:
        rs = [r for r in rows if _key(r) == key]
        out.append(
            Agg(
                *key,
                worst_vs_gz9=max(r.vs_gz9 for r in rs),
                total_vs_gz9=sum(r.comp for r in rs) / sum(r.gz9 for r in rs),
                min_enc=min(r.enc_mbps for r in rs),
                min_rand_fps=min(r.rand_fps for r in rs),
                max_pair_ms=max(r.pair_ms for r in rs),
                mean_dec_us=float(np.mean([r.dec_us for r in rs])),
            )
        )
    return out


def _fmt_agg(aggs: list[Agg]) -> str:
    head = (
        "| cname | lvl | block | chunk | worst vs gz9 | all-games vs gz9 | min enc MB/s "
        "| mean dec µs/chunk | min rand fr/s | worst b256+next ms | meets ≤1.0x & ≥150 MB/s |\n"
        "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|:-:|\n"
    )
    lines = []
    for a in aggs:
        ok = a.worst_vs_gz9 <= MAX_VS_GZ9 and a.min_enc >= MIN_ENC_MBPS
        stretch = ok and a.worst_vs_gz9 <= STRETCH_VS_GZ9
        lines.append(
            f"| {a.cname} | {a.clevel} | {a.block} | {a.chunk} | {a.worst_vs_gz9:.2f} | {a.total_vs_gz9:.2f} "
            f"| {a.min_enc:.0f} | {a.mean_dec_us:.1f} | {a.min_rand_fps:,.0f} | {a.max_pair_ms:.2f} "
            f"| {'✔ (≤0.8x)' if stretch else ('✔' if ok else '✘')} |"
        )
    return head + "\n".join(lines) + "\n"


def _recommend(aggs: list[Agg]) -> tuple[Agg | None, Agg | None]:
    """Fastest random batch (worst game) among configs meeting the constraints.

    Configs within 5% of the fastest are treated as ties, broken by the smaller
    worst-case store size, then by preferring blocksize "auto".
    """

    def pick(limit: float) -> Agg | None:
        ok = [a for a in aggs if a.worst_vs_gz9 <= limit and a.min_enc >= MIN_ENC_MBPS]
        if not ok:
            return None
        best_ms = min(a.max_pair_ms for a in ok)
        near = [a for a in ok if a.max_pair_ms <= best_ms * 1.05]
        # identical sizes (auto blocksize already >= chunk) -> prefer the plain default
        return min(near, key=lambda a: (round(a.worst_vs_gz9, 4), a.block != "auto", a.max_pair_ms))

    return pick(MAX_VS_GZ9), pick(STRETCH_VS_GZ9)


def _zarr_snippet(a: Agg) -> str:
    bs = "" if a.block == "auto" else f", blocksize={a.chunk * FRAME_BYTES}"
    return (
        f"`chunks=({a.chunk}, 84, 84)`, `compressors=zarr.codecs.BloscCodec(cname=\"{a.cname}\", "
        f"clevel={a.clevel}, shuffle=\"noshuffle\", typesize=1{bs})`"
    )


def _conclusion(aggs: list[Agg], rows: list[Row], gz: dict[str, tuple[int, float]]) -> str:
    rec, stretch = _recommend(aggs)
    rec_auto, _ = _recommend([a for a in aggs if a.block == "auto"])
    if rec is None:
        return (
            "No tested configuration met both constraints "
            f"(store ≤ {MAX_VS_GZ9:.1f}x gzip -9 on every game and encode ≥ "
            f"{MIN_ENC_MBPS:.0f} MB/s); see the tables above for the trade-off.\n"
        )

    def name(a: Agg) -> str:
        blk = "one block per chunk" if a.block == "chunk" else "auto blocksize"
        return f"{a.chunk} frames/chunk, Blosc {a.cname} clevel {a.clevel}, noshuffle, {blk}"

    def desc(a: Agg) -> str:
        per_game = "; ".join(
            f"{r.game} {r.ratio:.0f}:1 = {r.vs_gz9:.2f}x gz9, {r.enc_mbps:,.0f} MB/s enc, "
            f"{r.rand_fps:,.0f} fr/s"
            for r in rows
            if _key(r) == _key(a)
        )
        return (
            f"**{name(a)}** — worst game {a.worst_vs_gz9:.2f}x the gzip -9 size (all three games "
            f"together {a.total_vs_gz9:.2f}x), encode ≥ {a.min_enc:,.0f} MB/s, {a.mean_dec_us:.0f} µs "
            f"per chunk decode, ≥ {a.min_rand_fps:,.0f} random frames/s and ≤ {a.max_pair_ms:.1f} ms "
            f"per batch of 256 (obs, next_obs) on one thread ({per_game})"
        )

    fastest_any = min(aggs, key=lambda a: a.max_pair_ms)
    text = [
        f"Recommended default: {desc(rec)}; in Zarr v3: {_zarr_snippet(rec)}. "
        "Rule used: among configurations that keep every game at or below "
        f"{MAX_VS_GZ9:.1f}x its gzip -9 size and encode at ≥ {MIN_ENC_MBPS:.0f} MB/s on every game, "
        "take the lowest worst-game batch latency (ties within 5% go to the smaller store, then to auto blocksize). "
        "Random access costs one whole-chunk decode per sampled frame, so latency grows with "
        "chunk length (plus a fixed per-call cost, ~4 µs for lz4 and ~15–20 µs for zstd here), "
        "while store size is the binding constraint: short chunks, and Blosc's automatic "
        "blocksize (which splits a chunk into independently compressed blocks), cut the "
        "frame-to-frame redundancy that gzip sees across the whole file. "
        f"The fastest configuration overall ({name(fastest_any)}, {fastest_any.max_pair_ms:.1f} ms "
        f"per batch) is {fastest_any.worst_vs_gz9:.2f}x the gzip size in the worst game, so it "
        "fails the size constraint."
    ]
    if rec_auto is not None and _key(rec_auto) != _key(rec):
        text.append(
            f" Restricted to Blosc's automatic blocksize (the numcodecs/Zarr default), the same rule "
            f"picks {desc(rec_auto)}."
        )
    elif rec_auto is None:
        text.append(" With automatic blocksize no configuration meets both constraints.")
    if stretch is None:
        text.append(
            f" No configuration reaches the {STRETCH_VS_GZ9:.1f}x stretch goal on every game "
            "while meeting the encode-speed floor."
        )
    elif _key(stretch) == _key(rec):
        text.append(f" It also meets the {STRETCH_VS_GZ9:.1f}x stretch goal.")
    else:
        text.append(
            f" If the {STRETCH_VS_GZ9:.1f}x stretch goal is required, the same rule picks "
            f"{desc(stretch)}."
        )
    text.append(
        " Caveats: timings are codec-only (no Zarr store, I/O or Python-Zarr overhead, which "
        "adds a fixed per-chunk cost that favours somewhat larger chunks), measured on a shared "
        "2-core machine with other jobs running (expect ±10–20%), and the frames come from a "
        "random policy, whose screens may compress differently from a trained agent's."
    )
    return "".join(text) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20000, help="frames per game")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2, help="encode/decode repeats (best-of)")
    p.add_argument("--batches", type=int, default=20, help="random batches per config")
    p.add_argument("--games", nargs="+", default=list(GAMES))
    p.add_argument("--out", type=Path, default=DOC)
    args = p.parse_args(argv)

    blosc.use_threads = False
    blosc.set_nthreads(1)
    rng = np.random.default_rng(12345)

    rows: list[Row] = []
    gz: dict[str, tuple[int, float]] = {}
    for game in args.games:
        t0 = time.perf_counter()
        frames = record_frames(game, args.steps, args.seed)
        print(f"[{game}] {frames.shape} frames ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        gz9, gz_s = _gzip9(frames)
        gz[game] = (gz9, gz_s)
        print(
            f"[{game}] gzip -9: {gz9 / MB:.2f} MB, ratio {frames.nbytes / gz9:.1f} ({gz_s:.1f} s)",
            file=sys.stderr,
        )
        for cname in CNAMES:
            for clevel in CLEVELS:
                for block in BLOCKS:
                    for chunk in CHUNKS:
                        comp, enc, dec, fps, pair = _bench_config(
                            frames, cname, clevel, block, chunk, args.repeats, args.batches, rng
                        )
                        r = Row(game, cname, clevel, block, chunk, frames.nbytes, comp, gz9, enc, dec, fps, pair)
                        rows.append(r)
                        print(
                            f"[{game}] {cname}/{clevel}/{block}/chunk {chunk}: {r.ratio:.1f}:1 "
                            f"{r.enc_mbps:.0f} MB/s {r.dec_us:.1f} us {r.pair_ms:.2f} ms",
                            file=sys.stderr,
                        )
        del frames

    import ale_py

    date = _cmd(["date"])
    machine = f"{_cmd(['nproc'])} cores / {_cmd(['uname', '-m'])}"
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    aggs = _aggregate(rows)
    gz_lines = "\n".join(
        f"| {g} | {args.steps * FRAME_BYTES / MB:.1f} | {v[0] / MB:.2f} | {args.steps * FRAME_BYTES / v[0]:.1f} | {v[1]:.1f} |"
        for g, v in gz.items()
    )
    doc = f"""# Codec choice for Atari 84x84 frame chunks

_Generated by `python benchmarks/codec_choice.py --steps {args.steps}` — do not edit by hand._

**What was measured.** {args.steps} real ALE frames per game ({", ".join(args.games)}) from a
uniformly random policy (seed {args.seed}) with DQN-Replay preprocessing:
`ALE/<Game>-v5` with `frameskip=1, repeat_action_probability=0.25`, wrapped in
`AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)`,
giving `(N, 84, 84)` uint8 arrays ({FRAME_BYTES} bytes per frame). Each array is split into
chunks of 4–64 consecutive frames and every chunk compressed with numcodecs Blosc
(noshuffle, typesize 1, one thread) for cname ∈ {{lz4, zstd}} and clevel ∈ {{1, 3, 5}}, each with
two Blosc blocksizes: **auto** (`blocksize=0`, the numcodecs/Zarr default — Blosc picks a block
size from clevel and codec and compresses blocks independently) and **chunk** (`blocksize` =
chunk bytes, i.e. one block per chunk, so the codec can match a frame against all earlier frames
of the chunk; settable in Zarr as `BloscCodec(blocksize=...)`). The reference "source" size
is stdlib gzip level 9 of the whole `.npy` file (the format DQN Replay ships; `isal.igzip`
only supports levels 0–3 so it cannot produce a level-9 reference).

Columns: **ratio** = raw / compressed; **vs gz9** = compressed store / gzip -9 size (≤ 1.0 means
smaller than the source); **enc MB/s** = raw MB compressed per second (best of {args.repeats});
**dec µs/chunk** = mean `numcodecs.blosc.decompress(src, dest)` time into a preallocated
buffer; **rand fr/s** = random frames per second on one thread when each of 256 random frames
costs one chunk decode (no cache, no de-duplication — the large-dataset case) plus copying the
frame out, median of {args.batches} batches; **b256+next ms** = median latency of one batch of 256
random (obs, next_obs) pairs (a pair straddling a chunk boundary costs two decodes).

- Date: {date}
- Machine: {machine} ({cpu}); shared with other jobs, so timings are indicative (±10–20%)
- Python {platform.python_version()}, ale-py {ale_py.__version__}, numcodecs {numcodecs.__version__}, numpy {np.__version__}

## gzip -9 reference

| game | raw MB | gzip -9 MB | ratio | gzip -9 time (s, 1 thread) |
|---|--:|--:|--:|--:|
{gz_lines}

## Summary across games

Worst case over the three games for each setting (store size: largest vs-gz9 ratio; speed: slowest game).

{_fmt_agg(aggs)}
## Per-game results

{_fmt_table(rows)}
## Conclusion

{_conclusion(aggs, rows, gz)}"""
    print(doc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(doc)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
