"""Fixture data: RL Unplugged Atari shards, written as TensorFlow writes them, without it.

:func:`write_fixture_rlu` writes a run with the product's writer
(:func:`atari_zarr.record.rl_unplugged.write_rlu_run`: real ALE play with a
seeded random policy, GZIP TFRecords, one ``tf.train.Example`` per episode, one PNG
per step). The returned :class:`RluFixture` keeps the played episodes in memory, and
:meth:`RluFixture.truth` derives from them the transitions a perfect converter
returns, without reading the files.

The functions after it make bad input for tests: a flipped byte inside a record,
a truncated shard, an Example spoiled in one way (:data:`SPOILS`), a shard renamed.

Examples
--------
>>> import tempfile
>>> fixture = write_fixture_rlu(tempfile.mkdtemp(), present=(0, 2))
>>> truth = fixture.truth()
>>> len(truth) == sum(e.real_steps for e in fixture.episodes), truth.observation.shape[1:]
(True, (84, 84))
"""

from __future__ import annotations

import gzip
import os
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.record.rl_unplugged import (
    TERMINAL_STEP_REWARD,
    Played,
    WrittenEpisode,
    WrittenRun,
    frame_records,
    played_episodes,
    write_rlu_run,
    write_shard,
)
from atari_zarr.sources.rl_unplugged.example import Episode, encode_episode, example_class
from atari_zarr.sources.rl_unplugged.files import shard_name

__all__ = [
    "SPOILS",
    "TERMINAL_STEP_REWARD",
    "FixtureEpisode",
    "Played",
    "RluFixture",
    "RluTruth",
    "corrupt_record_byte",
    "frame_records",
    "make_png",
    "played_episodes",
    "read_shard_records",
    "rename_shard",
    "replace_record",
    "shard_name",
    "spoil_example",
    "spoil_record",
    "truncate_shard",
    "write_fixture_rlu",
    "write_shard",
]

#: An episode as written (the demo's name for it is WrittenEpisode).
FixtureEpisode = WrittenEpisode


# -- the files, written without the reader ---------------------------------------------
def read_shard_records(path: str | os.PathLike[str]) -> list[bytes]:
    """The records of a shard, unframed without checking CRCs (to rewrite a shard in tests)."""
    raw = gzip.decompress(Path(path).read_bytes())
    records, pos = [], 0
    while pos < len(raw):
        (length,) = struct.unpack_from("<Q", raw, pos)
        records.append(raw[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4
    return records


def make_png(pixels: np.ndarray, *, bit_depth: int = 8) -> bytes:
    """A PNG of any size: 2-D ``pixels`` as grayscale, ``(h, w, 3)`` as RGB (uint8 or uint16).

    For bad frames in tests (:func:`spoil_example`); the good ones come from
    :func:`~atari_zarr.sources.rl_unplugged.png.encode_frame`.

    Examples
    --------
    >>> make_png(np.zeros((10, 20), np.uint8))[16:26].hex()
    '000000140000000a0800'
    """
    pixels = np.asarray(pixels)
    color = 0 if pixels.ndim == 2 else 2
    dtype = ">u2" if bit_depth == 16 else np.uint8
    height, width = pixels.shape[:2]
    rows = pixels.astype(dtype).reshape(height, -1).view(np.uint8).reshape(height, -1)
    raw = np.concatenate([np.zeros((height, 1), np.uint8), rows], axis=1)  # filter "None"
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw.tobytes()))
        + chunk(b"IEND", b"")
    )


# -- the fixture -------------------------------------------------------------------------
@dataclass
class RluTruth:
    """The transitions a converter must produce, in row order, and the episodes' table.

    Row arrays have one entry per real step (shards in index order, episodes in
    file order). ``next_observation`` is the following frame: the next row's within
    an episode, the terminal frame after a terminal episode's last row, zeros
    after a cut episode's last row (unknown). Episode arrays have one entry per
    episode; ``final_observation`` is the terminal frame, or zeros for a cut
    episode. Returns absent from the files are NaN.
    """

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    unclipped_reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode: np.ndarray
    next_observation: np.ndarray
    final_observation: np.ndarray
    checkpoint_idx: np.ndarray
    episode_idx: np.ndarray
    episode_return: np.ndarray
    clipped_episode_return: np.ndarray
    length: np.ndarray
    episode_terminated: np.ndarray

    def __len__(self) -> int:
        return len(self.action)


@dataclass
class RluFixture(WrittenRun):
    """A written fixture run, and the transitions a perfect converter returns for it.

    ``clipped`` and ``returns`` say whether its Examples hold ``clipped_rewards`` and
    ``clipped_episode_return`` (older releases) and ``episode_return``.
    """

    clipped: bool = True
    returns: bool = True

    def example(self, episode: FixtureEpisode) -> Episode:
        """The Example of ``episode`` as this fixture wrote it."""
        return replace(
            episode.example(),
            episode_return=episode.episode_return if self.returns else None,
            clipped_episode_return=(
                episode.clipped_episode_return if self.returns and self.clipped else None
            ),
            clipped_rewards=episode.clipped_rewards if self.clipped else None,
        )

    def truth(self, shards: Sequence[int] | None = None) -> RluTruth:
        """Transitions a perfect converter returns for ``shards`` (default: all present).

        Computed from the played episodes in memory, not from the files.
        """
        chosen = sorted(self.present if shards is None else set(shards) & set(self.present))
        episodes = [e for s in chosen for e in self.episodes_of(s)]
        obs, nxt, act, rew, unc, term, trunc, ep, final = [], [], [], [], [], [], [], [], []
        for e_id, e in enumerate(episodes):
            n = e.real_steps
            frames = e.observations
            obs.append(frames[:n])
            follow = np.zeros((n, *FRAME_SHAPE), np.uint8)
            follow[: n - 1] = frames[1:n]
            last = frames[n] if e.terminal else np.zeros(FRAME_SHAPE, np.uint8)
            follow[n - 1] = last
            nxt.append(follow)
            final.append(last)
            act.append(e.actions[:n])
            rew.append(np.clip(e.unclipped_rewards[:n], -1, 1).astype(np.float32))
            unc.append(e.unclipped_rewards[:n])
            flags = np.zeros(n, bool)
            t, c = flags.copy(), flags.copy()
            (t if e.terminal else c)[n - 1] = True
            term.append(t)
            trunc.append(c)
            ep.append(np.full(n, e_id, np.int64))

        def cat(parts: list[np.ndarray], dtype: type, shape: tuple[int, ...] = ()) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros((0, *shape), dtype)

        nan = float("nan")
        return RluTruth(
            observation=cat(obs, np.uint8, FRAME_SHAPE),
            action=cat(act, np.int64),
            reward=cat(rew, np.float32),
            unclipped_reward=cat(unc, np.float32),
            terminated=cat(term, bool),
            truncated=cat(trunc, bool),
            episode=cat(ep, np.int64),
            next_observation=cat(nxt, np.uint8, FRAME_SHAPE),
            final_observation=(np.stack(final) if final else np.zeros((0, *FRAME_SHAPE), np.uint8)),
            checkpoint_idx=np.array([e.checkpoint_idx for e in episodes], np.int64),
            episode_idx=np.array([e.episode_idx for e in episodes], np.int64),
            episode_return=np.array(
                [e.episode_return if self.returns else nan for e in episodes], np.float32
            ),
            clipped_episode_return=np.array(
                [
                    e.clipped_episode_return if self.returns and self.clipped else nan
                    for e in episodes
                ],
                np.float32,
            ),
            length=np.array([e.real_steps for e in episodes], np.int64),
            episode_terminated=np.array([e.terminal for e in episodes], bool),
        )


def write_fixture_rlu(
    root: str | os.PathLike[str],
    game: str = "Asterix",
    run: int = 1,
    *,
    clipped: bool = True,
    returns: bool = True,
    **options: Any,
) -> RluFixture:
    """:func:`~atari_zarr.record.rl_unplugged.write_rlu_run`, with the truth.

    Takes its options (``num_shards``, ``present``, ``episodes_per_shard``, ``seed``,
    ``cut_length``), and ``clipped=False`` / ``returns=False`` to leave the clipped
    rewards and returns / every return out of the Examples, as newer releases do; the
    returned :class:`RluFixture` also derives the transitions a converter must give.
    """
    fixture = RluFixture(**vars(write_rlu_run(root, game, run, **options)))
    fixture.clipped, fixture.returns = clipped, returns
    if not (clipped and returns):  # the shards again, without what is left out
        for shard, path in fixture.paths.items():
            records = [encode_episode(fixture.example(e)) for e in fixture.episodes_of(shard)]
            write_shard(path, records)
    return fixture


# -- bad input -------------------------------------------------------------------------
def replace_record(path: str | os.PathLike[str], record: int, data: bytes) -> None:
    """Rewrite the shard at ``path`` with record ``record`` replaced by ``data`` (CRCs correct)."""
    records = read_shard_records(path)
    records[record] = data
    write_shard(path, records)


def corrupt_record_byte(
    path: str | os.PathLike[str], record: int, offset: int | None = None
) -> None:
    """Flip one byte inside record ``record``'s data; the GZIP stays valid, the data CRC does not.

    ``offset`` is the byte within the record's data (default: its middle).
    """
    raw = bytearray(gzip.decompress(Path(path).read_bytes()))
    pos = 0
    for _ in range(record):
        (length,) = struct.unpack_from("<Q", raw, pos)
        pos += 12 + length + 4
    (length,) = struct.unpack_from("<Q", raw, pos)
    raw[pos + 12 + (length // 2 if offset is None else offset)] ^= 0xFF
    Path(path).write_bytes(gzip.compress(bytes(raw), mtime=0))


def truncate_shard(
    path: str | os.PathLike[str], keep: float = 0.5, *, compressed: bool = True
) -> None:
    """Cut the shard short, keeping the fraction ``keep`` of its bytes.

    ``compressed=True`` cuts the GZIP file (as an interrupted download does);
    ``False`` cuts the TFRecord stream and compresses it again, so the GZIP is
    valid and a record ends early.
    """
    data = Path(path).read_bytes()
    if compressed:
        Path(path).write_bytes(data[: int(len(data) * keep)])
        return
    raw = gzip.decompress(data)
    Path(path).write_bytes(gzip.compress(raw[: int(len(raw) * keep)], mtime=0))


def rename_shard(
    path: str | os.PathLike[str], *, index: int | None = None, num_shards: int | None = None
) -> str:
    """Rename a shard to another index or ``-of-N``; return the new path."""
    parent, name = os.path.split(os.fspath(path))
    match = re.fullmatch(r"run_(\w+?)-(\d{5})-of-(\d{5})", name)
    if not match:
        raise ValueError(f"{name!r} is not a shard name run_R-IIIII-of-NNNNN")
    run, old_index, old_total = match.group(1), int(match.group(2)), int(match.group(3))
    new = os.path.join(
        parent,
        shard_name(
            run,
            old_index if index is None else index,
            old_total if num_shards is None else num_shards,
        ),
    )
    os.replace(path, new)
    return new


#: The ways :func:`spoil_example` spoils an Example.
SPOILS = (
    "missing_feature",  # drop ``feature``
    "wrong_kind",  # ``feature`` written as another kind of list
    "lengths",  # ``feature`` loses its last value: per-step lists differ in length
    "empty",  # every per-step list empty
    "not_example",  # bytes that are not a protobuf message
    "checkpoint_idx",  # checkpoint_idx set to ``value`` (default: one more)
    "png_size",  # the PNG of ``step`` is 64x64
    "png_rgb",  # the PNG of ``step`` is 84x84 RGB
    "png_16bit",  # the PNG of ``step`` is 84x84 gray, 16 bits
    "png_corrupt",  # the PNG of ``step`` has a valid header and damaged image data
    "png_garbage",  # the PNG of ``step`` is not a PNG
)


def spoil_example(
    data: bytes,
    how: str,
    *,
    feature: str = "actions",
    step: int = 0,
    value: int | None = None,
) -> bytes:
    """A serialized Example spoiled in one way (:data:`SPOILS`), for bad-input tests.

    Examples
    --------
    >>> from atari_zarr.sources.rl_unplugged.example import Episode, encode_episode
    >>> ep = Episode(0, 0, None, None, [make_png(np.zeros((84, 84), np.uint8))],
    ...              np.array([1]), np.array([0.0]), None, np.array([1.0]))
    >>> spoiled = spoil_example(encode_episode(ep), "missing_feature", feature="discounts")
    >>> "discounts" in example_class().FromString(spoiled).features.feature
    False
    """
    if how not in SPOILS:
        raise ValueError(f"unknown spoil {how!r}; expected one of {SPOILS}")
    if how == "not_example":
        return b"\xff\xff\xff\xff" + data[:16]
    example = example_class().FromString(data)
    features = example.features.feature
    if how == "missing_feature":
        del features[feature]
    elif how == "wrong_kind":
        old = features[feature]
        kind = old.WhichOneof("kind")
        count = len(getattr(old, kind).value)
        replacement = example_class("Feature")()
        if kind == "float_list":
            replacement.int64_list.value.extend([0] * count)
        else:
            replacement.float_list.value.extend([0.0] * count)
        features[feature].CopyFrom(replacement)
    elif how == "lengths":
        values = getattr(features[feature], features[feature].WhichOneof("kind")).value
        del values[-1]
    elif how == "empty":
        for name in (
            "observations",
            "actions",
            "unclipped_rewards",
            "clipped_rewards",
            "discounts",
        ):
            if name in features:
                kind = features[name].WhichOneof("kind")
                del getattr(features[name], kind).value[:]
    elif how == "checkpoint_idx":
        ints = features["checkpoint_idx"].int64_list.value
        ints[0] = ints[0] + 1 if value is None else value
    else:
        pngs = features["observations"].bytes_list.value
        frame = np.full(FRAME_SHAPE, 100, np.uint8)
        if how == "png_size":
            pngs[step] = make_png(np.zeros((64, 64), np.uint8))
        elif how == "png_rgb":
            pngs[step] = make_png(np.zeros((*FRAME_SHAPE, 3), np.uint8))
        elif how == "png_16bit":
            pngs[step] = make_png(frame.astype(np.uint16), bit_depth=16)
        elif how == "png_corrupt":
            good = bytearray(make_png(frame))
            start = good.index(b"IDAT") + 4
            good[start : start + 12] = b"\x00" * 12  # damages the zlib stream, not the header
            pngs[step] = bytes(good)
        else:
            pngs[step] = b"GIF89a not a png at all"
    return bytes(example.SerializeToString(deterministic=True))


def spoil_record(path: str | os.PathLike[str], record: int, how: str, **kwargs: object) -> None:
    """Rewrite record ``record`` of the shard at ``path`` spoiled by :func:`spoil_example`."""
    data = read_shard_records(path)[record]
    replace_record(path, record, spoil_example(data, how, **kwargs))  # type: ignore[arg-type]


# -- RL Unplugged's public bucket, served locally ------------------------------------------
#: The bucket and prefix of RL Unplugged's ordered episodes (``atari_zarr.pull.RLU_URL``).
PUBLIC_BUCKET, PUBLIC_PREFIX = "rl_unplugged", "atari_episodes_ordered"


def upload_public_layout(fs: Any, fixture: WrittenRun, bucket: str = PUBLIC_BUCKET) -> list[str]:
    """Copy ``fixture``'s shards into ``bucket`` under the public layout's exact names.

    ``{bucket}/atari_episodes_ordered/{Game}/run_{r}-{i:05d}-of-{N:05d}``, as
    ``gs://rl_unplugged`` has them, so that code whose source is the public URL reads
    them once gcsfs is pointed at the emulator (``STORAGE_EMULATOR_HOST``). Returns
    the object paths.
    """
    out = []
    for path in fixture.paths.values():
        key = f"{bucket}/{PUBLIC_PREFIX}/{fixture.game}/{Path(path).name}"
        fs.put_file(path, key)
        out.append(key)
    return out
