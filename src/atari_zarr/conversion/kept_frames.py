"""Frames a scan kept for the write pass, so that a source is fetched once.

A source read over a network that can only be read from its start (an RL Unplugged
shard: one GZIP stream) is read twice by a conversion: the scan (pass 1), which must
see a shard whole before its rows can be placed, and the write pass. When a
conversion keeps frames (``convert(keep_frames=...)``, on by default for sources
over a network), the scan decodes the frames once and hands them to a
:class:`FrameBlocks` writer; they wait in the work area, compressed, and the write
pass reads them back with :class:`KeptFrameBlocks` instead of fetching the shard
again:

.. code-block:: text

    1.zarr.converting/frames/{i}/steps-{k}.blosc       real steps k*BLOCK .. (k+1)*BLOCK-1
    1.zarr.converting/frames/{i}/finals.npy.blosc      one frame per record (zeros: unknown)
    1.zarr.converting/frames/{i}/known.npy.blosc       which of those are known

What waits is decoded frames, raw 84x84 bytes compressed with Blosc zstd-3: about 10 µs
a frame both ways, under half the PNG decode's time; 42 bytes a frame of Pong, a fifth of
the shard's bytes (random play; the real shards hold about 450 bytes a frame), never the
shard itself. A part's frames are dropped once it is written;
the whole work area goes when the store is complete.
"""

from __future__ import annotations

import numpy as np
from numcodecs import Blosc

from atari_zarr.conversion.workdir import WorkDir
from atari_zarr.layout import FRAME_SHAPE

__all__ = ["BLOCK", "FrameBlocks", "KeptFrameBlocks", "drop_kept", "has_kept"]

#: Frames per kept block (29 MB decoded).
BLOCK = 4096
_DONE = "complete"
#: Kept steps: raw frames, quick to compress and to decompress (they wait minutes at most).
_CODEC = Blosc(cname="zstd", clevel=3, shuffle=Blosc.NOSHUFFLE)


def _dir(unit: int) -> str:
    return f"frames/{int(unit)}"


class FrameBlocks:
    """A :class:`~atari_zarr.sources.kind.FrameSink` writing part ``unit``'s frames to
    ``work`` in blocks of :data:`BLOCK` frames.

    Examples
    --------
    >>> import tempfile
    >>> work = WorkDir(tempfile.mkdtemp() + "/Pong/1.zarr")
    >>> sink = FrameBlocks(work, 3)
    >>> sink.steps(np.full((5, 84, 84), 7, np.uint8)); sink.final(None)
    >>> sink.final(np.ones((84, 84), np.uint8)); sink.close()
    >>> kept = KeptFrameBlocks(work, 3)
    >>> out = np.empty((2, 84, 84), np.uint8); kept.steps(3, 5, out)
    >>> int(out.max()), kept.final(0) is None, int(kept.final(1).max())
    (7, True, 1)
    """

    def __init__(self, work: WorkDir, unit: int) -> None:
        self.work, self.unit = work, int(unit)
        work.drop(_dir(self.unit))  # what an interrupted scan left
        self._block = np.empty((BLOCK, *FRAME_SHAPE), dtype=np.uint8)
        self._filled = 0
        self._written = 0  # blocks written
        self._finals: list[np.ndarray | None] = []

    def steps(self, frames: np.ndarray) -> None:
        a = 0
        while a < len(frames):
            b = min(len(frames), a + BLOCK - self._filled)
            self._block[self._filled : self._filled + b - a] = frames[a:b]
            self._filled += b - a
            a = b
            if self._filled == BLOCK:
                self._flush()

    def final(self, frame: np.ndarray | None) -> None:
        self._finals.append(None if frame is None else np.array(frame, dtype=np.uint8))

    def _flush(self) -> None:
        if self._filled:
            data = self._block[: self._filled]
            self.work.save_bytes(
                _dir(self.unit), f"steps-{self._written}.blosc", data=_CODEC.encode(data)
            )
            self._written += 1
            self._filled = 0

    def close(self) -> None:
        self._flush()
        finals = np.zeros((len(self._finals), *FRAME_SHAPE), dtype=np.uint8)
        known = np.zeros(len(self._finals), dtype=bool)
        for i, frame in enumerate(self._finals):
            if frame is not None:
                finals[i], known[i] = frame, True
        self.work.save_array(_dir(self.unit), "finals.npy.blosc", data=finals)
        self.work.save_array(_dir(self.unit), "known.npy.blosc", data=known)
        self.work.save_array(_dir(self.unit), _DONE, data=np.array(self._written))


class KeptFrameBlocks:
    """The frames :class:`FrameBlocks` kept of part ``unit``: a
    :class:`~atari_zarr.sources.kind.KeptFrames`. One decoded block is held at a time
    (reads are in order)."""

    def __init__(self, work: WorkDir, unit: int) -> None:
        self.work, self.unit = work, int(unit)
        self._index = -1
        self._data = np.empty((0, *FRAME_SHAPE), dtype=np.uint8)
        self._finals: np.ndarray | None = None
        self._known: np.ndarray | None = None

    def _load(self, k: int) -> np.ndarray:
        if k != self._index:
            raw = _CODEC.decode(self.work.load_bytes(_dir(self.unit), f"steps-{k}.blosc"))
            self._data = np.frombuffer(raw, dtype=np.uint8).reshape(-1, *FRAME_SHAPE)
            self._index = k
        return self._data

    def steps(self, lo: int, hi: int, out: np.ndarray) -> None:
        at = lo
        while at < hi:
            k = at // BLOCK
            block = self._load(k)
            a = at - k * BLOCK
            b = min(len(block), hi - k * BLOCK)
            if b <= a:
                raise ValueError(  # pragma: no cover - the work area was tampered with
                    f"{self.work.url}: kept frames of part {self.unit} end at "
                    f"{k * BLOCK + len(block)}; expected rows up to {hi}. Convert again "
                    f"with --overwrite."
                )
            out[at - lo : at - lo + b - a] = block[a:b]
            at += b - a

    def final(self, record: int) -> np.ndarray | None:
        if self._finals is None:
            self._finals = self.work.load_array(_dir(self.unit), "finals.npy.blosc")
            self._known = self.work.load_array(_dir(self.unit), "known.npy.blosc")
        assert self._known is not None
        return self._finals[record] if bool(self._known[record]) else None


def has_kept(work: WorkDir, unit: int) -> bool:
    """Whether the scan of part ``unit`` kept all its frames in ``work``."""
    return bool(work.fs.exists(f"{work.path.rstrip('/')}/{_dir(unit)}/{_DONE}"))


def drop_kept(work: WorkDir, unit: int) -> None:
    """Remove part ``unit``'s kept frames once the part is written."""
    work.drop(_dir(unit))
