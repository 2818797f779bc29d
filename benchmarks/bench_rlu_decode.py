"""Micro-benchmarks of reading RL Unplugged shards: inflate, TFRecord framing + CRC, Example, PNG.

    python benchmarks/bench_rlu_decode.py [--games Pong Breakout Asterix] [--frames 2000]
                                          [--episode-steps 2000] [--episodes 16] [--json out.json]

Everything runs in one process on one core, so each figure is a per-core cost, in CPU
time of the process (the best of several rounds), which a busy machine disturbs less
than wall time.

1. **Frames.** ``--frames`` real ALE frames per game (``ale_frames.record_frames``: random
   play with DQN's preprocessing), PNG-encoded the way TensorFlow's ``tf.io.encode_png``
   encodes them (libpng, zlib level 6, libpng's adaptive filters; here through OpenCV's
   libpng at the same level), and with the package's own ``encode_frame`` (zlib level 6,
   filter "Up"; the fixtures' PNGs).
2. **PNG decode**, microseconds per frame, for each decoder installed (OpenCV, imagecodecs,
   pyspng, Pillow), called bare; then ``decode_frames`` as the converter calls it (header
   check, decoding into the output array) with each entry of ``png.DECODERS``.
3. **Examples.** ``--episode-steps``-step episodes of those PNGs, serialized by
   ``encode_episode``. ``parse_episode`` (protobuf, upb backend) is timed against a
   hand-written wire parser of the same fields, microseconds per episode and per step.
4. **Shards.** ``--episodes`` such Examples framed and GZIP-compressed (level 6, as
   TensorFlow's ``TFRecordWriter(options="GZIP")``). Timed: inflating alone (zlib's and
   isal's gzip readers), CRC-32C alone (google-crc32c and crc32c packages), and
   ``open_shard`` + ``iter_records`` (inflate, framing, both CRCs), then the two passes a
   conversion makes over a shard as far as this layer goes: the scan (``parse_episode``
   without frames) and the read of every frame (``parse_episode`` + ``decode_frames``),
   in MB/s of inflated bytes and microseconds per frame.

The report is printed as markdown tables and optionally written as JSON.

On a shared machine CPU times still vary by tens of percent. Instruction counts do not:

    valgrind --tool=callgrind python benchmarks/bench_rlu_decode.py --decode-loop pyspng 0
    valgrind --tool=callgrind python benchmarks/bench_rlu_decode.py --decode-loop pyspng 600

(the difference of the two "Collected" totals over 600 is the instructions per frame).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import platform
import struct
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def best_of(fn: Callable[[], Any], repeat: int = 5, min_time: float = 0.2) -> float:
    """Best CPU seconds per call of ``fn`` over ``repeat`` rounds of at least ``min_time`` each.

    CPU time of this process, not wall time: other processes on a shared machine slow
    the wall clock far more than they slow the work measured.
    """
    fn()  # warm up
    best = float("inf")
    for _ in range(repeat):
        calls, start = 0, time.process_time()
        while True:
            fn()
            calls += 1
            elapsed = time.process_time() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / calls)
    return best


def record_frames(game: str, n: int) -> np.ndarray:
    sys.path.insert(0, str(HERE))
    from ale_frames import record_frames as record

    return record(game, n, seed=0)


def libpng_encode(frames: np.ndarray) -> list[bytes]:
    import cv2

    params = [cv2.IMWRITE_PNG_COMPRESSION, 6]
    return [cv2.imencode(".png", f, params)[1].tobytes() for f in frames]


# -- PNG decoders, called as a converter would call each --------------------------------------
def decoders() -> dict[str, Callable[[bytes], np.ndarray]]:
    found: dict[str, Callable[[bytes], np.ndarray]] = {}
    try:
        import cv2

        found["opencv " + cv2.__version__] = lambda b: cv2.imdecode(
            np.frombuffer(b, np.uint8), cv2.IMREAD_UNCHANGED
        )
    except ImportError:
        pass
    try:
        import imagecodecs

        version = imagecodecs.__version__
        found[f"imagecodecs {version} png (libpng)"] = imagecodecs.png_decode
        if imagecodecs.SPNG.available:
            found[f"imagecodecs {version} spng (libspng)"] = imagecodecs.spng_decode
    except ImportError:
        pass
    try:
        import pyspng

        found["pyspng " + getattr(pyspng, "__version__", "")] = pyspng.load
    except ImportError:
        pass
    try:
        import PIL
        from PIL import Image

        def pillow(b: bytes) -> np.ndarray:
            with Image.open(io.BytesIO(b)) as im:
                return np.asarray(im)

        found["Pillow " + PIL.__version__] = pillow
    except ImportError:
        pass
    return found


def bench_png(frames: np.ndarray, pngs: list[bytes]) -> dict[str, float]:
    from atari_zarr.sources.rl_unplugged import png

    out: dict[str, float] = {}
    for name, decode in decoders().items():
        assert all(
            np.array_equal(decode(p).reshape(84, 84), f) for p, f in zip(pngs, frames, strict=True)
        )

        def run(decode: Callable[[bytes], np.ndarray] = decode) -> None:
            for p in pngs:
                decode(p)

        out[name] = best_of(run) / len(pngs) * 1e6
    buffer = np.empty((len(pngs), 84, 84), np.uint8)
    chosen = png.decoder_name()
    candidates = dict(png.DECODERS)
    try:
        for name, load in candidates.items():
            png.DECODERS = {name: load}
            png._decoder.cache_clear()
            try:
                png.decoder_name()
            except ImportError:
                continue
            seconds = best_of(lambda: png.decode_frames(pngs, "bench", 0, out=buffer))
            np.testing.assert_array_equal(buffer, frames)
            mark = " (chosen)" if name == chosen else ""
            out[f"decode_frames: {name}{mark}"] = seconds / len(pngs) * 1e6
    finally:
        png.DECODERS = candidates
        png._decoder.cache_clear()
    return out


# -- Examples ---------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def wire_parse(data: bytes) -> dict[str, Any]:
    """A hand-written parser of tf.train.Example, as fast as plain Python gets (no checks)."""
    features: dict[str, Any] = {}
    view = memoryview(data)
    _, pos = _varint(data, 0)  # Example.features tag (0x0a), then its length
    length, pos = _varint(data, pos)
    end = pos + length
    while pos < end:
        pos += 1  # Features.feature map entry tag
        entry_len, pos = _varint(data, pos)
        entry_end = pos + entry_len
        pos += 1  # key tag
        key_len, pos = _varint(data, pos)
        key = bytes(view[pos : pos + key_len]).decode()
        pos += key_len + 1  # value tag
        _, pos = _varint(data, pos)  # Feature length
        kind = data[pos] >> 3
        pos += 1
        list_len, pos = _varint(data, pos)
        list_end = pos + list_len
        if kind == 1:  # BytesList: repeated bytes, one tag + length each
            values = []
            while pos < list_end:
                pos += 1
                n, pos = _varint(data, pos)
                values.append(bytes(view[pos : pos + n]))
                pos += n
            features[key] = values
        else:  # packed floats or varints
            pos += 1
            n, pos = _varint(data, pos)
            if kind == 2:
                features[key] = np.frombuffer(data, "<f4", n // 4, pos)
            else:
                ints = []
                stop = pos + n
                while pos < stop:
                    v, pos = _varint(data, pos)
                    ints.append(v)
                features[key] = np.array(ints, np.int64)
        pos = entry_end
    return features


def make_episode(pngs: list[bytes], steps: int) -> Any:
    from atari_zarr.sources.rl_unplugged.example import Episode

    rng = np.random.default_rng(0)
    obs = [pngs[i % len(pngs)] for i in range(steps)]
    rewards = rng.choice([0.0, 0.0, 0.0, 1.0, 4.0], steps).astype(np.float32)
    discounts = np.ones(steps, np.float32)
    discounts[-1] = 0
    return Episode(
        checkpoint_idx=7,
        episode_idx=123,
        episode_return=float(rewards[:-1].sum()),
        clipped_episode_return=float(np.clip(rewards[:-1], -1, 1).sum()),
        observations=obs,
        actions=rng.integers(0, 18, steps),
        unclipped_rewards=rewards,
        clipped_rewards=np.clip(rewards, -1, 1),
        discounts=discounts,
    )


def bench_example(data: bytes, steps: int) -> dict[str, float]:
    from google.protobuf.internal import api_implementation

    from atari_zarr.sources.rl_unplugged.example import example_class, parse_episode

    parsed = wire_parse(data)
    reference = parse_episode(data, "bench", 0)
    assert parsed["observations"] == reference.observations
    assert np.array_equal(parsed["actions"], reference.actions)
    message = example_class()
    out = {
        f"protobuf {api_implementation.Type()}: FromString only": best_of(
            lambda: message.FromString(data)
        ),
        "parse_episode (protobuf, all lists out)": best_of(lambda: parse_episode(data, "bench", 0)),
        "parse_episode(observations=False)": best_of(
            lambda: parse_episode(data, "bench", 0, observations=False)
        ),
        "hand-written wire parser": best_of(lambda: wire_parse(data)),
    }
    return {name: seconds * 1e6 for name, seconds in out.items()}


# -- shards -----------------------------------------------------------------------------------
def bench_shard(path: Path, inflated: int, frames: int) -> dict[str, dict[str, float]]:
    from atari_zarr.sources.rl_unplugged.example import parse_episode
    from atari_zarr.sources.rl_unplugged.png import decode_frames
    from atari_zarr.sources.rl_unplugged.tfrecord import iter_records, open_shard
    from atari_zarr.storage.filesystem import get_fs

    out: dict[str, dict[str, float]] = {}

    def figures(seconds: float) -> dict[str, float]:
        return {
            "MB/s": inflated / seconds / 1e6,
            "us/frame": seconds / frames * 1e6,
            "seconds": seconds,
        }

    def inflate(opener: Callable[[Any], Any]) -> Callable[[], None]:
        def run() -> None:
            with open(path, "rb") as raw, opener(raw) as stream:
                while stream.read(1 << 20):
                    pass

        return run

    out["inflate: gzip (zlib)"] = figures(
        best_of(inflate(lambda raw: gzip.GzipFile(fileobj=raw)), repeat=3)
    )
    try:
        from isal import igzip

        out["inflate: isal igzip"] = figures(
            best_of(inflate(lambda raw: igzip.IGzipFile(fileobj=raw)), repeat=3)
        )
    except ImportError:
        pass
    raw_bytes = gzip.decompress(path.read_bytes())
    records = []
    pos = 0
    while pos < len(raw_bytes):
        (n,) = struct.unpack_from("<Q", raw_bytes, pos)
        records.append(raw_bytes[pos + 12 : pos + 12 + n])
        pos += 16 + n
    import google_crc32c

    out[f"CRC-32C: google-crc32c ({google_crc32c.implementation})"] = figures(
        best_of(lambda: [google_crc32c.value(r) for r in records], repeat=3)
    )
    try:
        import crc32c

        out["CRC-32C: crc32c"] = figures(
            best_of(lambda: [crc32c.crc32c(r) for r in records], repeat=3)
        )
    except ImportError:
        pass
    out["CRC-32C: zlib.crc32 (CRC-32, not -32C: scale)"] = figures(
        best_of(lambda: [zlib.crc32(r) for r in records], repeat=3)
    )
    fs, root = get_fs(str(path))

    def read_all() -> None:
        with open_shard(fs, root) as stream:
            for _ in iter_records(stream, str(path)):
                pass

    out["open_shard + iter_records (inflate, framing, CRCs)"] = figures(best_of(read_all, 3))

    def scan() -> None:
        with open_shard(fs, root) as stream:
            for index, data in iter_records(stream, str(path)):
                parse_episode(data, str(path), index, observations=False)

    out["pass 1: + parse_episode(observations=False)"] = figures(best_of(scan, 3))
    buffer = np.empty((frames, 84, 84), np.uint8)

    def read_frames() -> None:
        done = 0
        with open_shard(fs, root) as stream:
            for index, data in iter_records(stream, str(path)):
                episode = parse_episode(data, str(path), index)
                n = episode.steps
                decode_frames(episode.observations, str(path), index, buffer[done : done + n])
                done += n

    out["pass 2: + parse_episode + decode_frames"] = figures(best_of(read_frames, 3))
    return out


def decode_loop(name: str, count: int, games: list[str], frames: int) -> None:
    """Decode ``count`` PNGs with decoder ``name`` (a key of :func:`decoders`' names, first word).

    For instruction counts, which a busy machine does not disturb: run under
    ``valgrind --tool=callgrind`` once with ``count`` 0 and once with N; the
    difference over N is the instructions per frame.
    """
    pngs = [p for game in games for p in libpng_encode(record_frames(game, frames)[::20])]
    library, _, kind = name.partition(":")
    [decode] = [
        f
        for k, f in decoders().items()
        if k.split()[0] == library and (not kind or k.split()[2:3] == [kind])
    ]
    for i in range(count):
        decode(pngs[i % len(pngs)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", nargs="+", default=["Pong", "Breakout", "Asterix"])
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--episode-steps", type=int, default=2000)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--decode-loop",
        nargs=2,
        metavar=("DECODER", "COUNT"),
        help="only decode COUNT frames with DECODER (opencv, imagecodecs:png, "
        "imagecodecs:spng, pyspng, Pillow), for valgrind's instruction counts",
    )
    args = parser.parse_args(argv)
    if args.decode_loop:
        decode_loop(args.decode_loop[0], int(args.decode_loop[1]), args.games, args.frames)
        return {}

    from atari_zarr_testkit.rl_unplugged import write_shard

    from atari_zarr.sources.rl_unplugged.example import encode_episode
    from atari_zarr.sources.rl_unplugged.png import encode_frame

    report: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "png": {},
        "png_bytes": {},
    }
    all_libpng: list[bytes] = []
    for game in args.games:
        frames = record_frames(game, args.frames)
        libpng = libpng_encode(frames)
        ours = [encode_frame(f) for f in frames]
        all_libpng += libpng
        report["png_bytes"][game] = {
            "libpng level 6": float(np.mean([len(p) for p in libpng])),
            "encode_frame": float(np.mean([len(p) for p in ours])),
        }
        report["png"][f"{game}, libpng"] = bench_png(frames, libpng)
        report["png"][f"{game}, encode_frame"] = bench_png(frames, ours)

    episode = make_episode(all_libpng, args.episode_steps)
    data = encode_episode(episode)
    per_episode = bench_example(data, args.episode_steps)
    report["example"] = {
        "steps": args.episode_steps,
        "bytes": len(data),
        "us/episode": per_episode,
        "us/step": {k: v / args.episode_steps for k, v in per_episode.items()},
    }

    shard = HERE / ".cache" / "rlu_bench_shard"
    shard.parent.mkdir(exist_ok=True)
    write_shard(shard, [data] * args.episodes)
    inflated = args.episodes * (len(data) + 16)
    report["shard"] = {
        "episodes": args.episodes,
        "inflated MB": inflated / 1e6,
        "compressed MB": shard.stat().st_size / 1e6,
        "figures": bench_shard(shard, inflated, args.episodes * args.episode_steps),
    }
    shard.unlink()

    print(f"# RL Unplugged reading ({report['machine']}, Python {report['python']})\n")
    print("## PNG bytes per frame\n\n| game | libpng level 6 | encode_frame |\n|---|---|---|")
    for game, sizes in report["png_bytes"].items():
        print(f"| {game} | {sizes['libpng level 6']:.0f} | {sizes['encode_frame']:.0f} |")
    names = sorted({n for v in report["png"].values() for n in v})
    print("\n## PNG decode, us/frame\n\n| frames | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for frames_name, figures in report["png"].items():
        cells = " | ".join(f"{figures.get(n, float('nan')):.1f}" for n in names)
        print(f"| {frames_name} | {cells} |")
    print(f"\n## Example of {args.episode_steps} steps ({len(data) / 1e6:.2f} MB)\n")
    print("| parser | us/episode | us/step |\n|---|---|---|")
    for name, us in per_episode.items():
        print(f"| {name} | {us:.0f} | {us / args.episode_steps:.2f} |")
    print(f"\n## Shard of {args.episodes} episodes ({inflated / 1e6:.0f} MB inflated)\n")
    print("| stage | MB/s | us/frame |\n|---|---|---|")
    for name, fig in report["shard"]["figures"].items():
        print(f"| {name} | {fig['MB/s']:.0f} | {fig['us/frame']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
