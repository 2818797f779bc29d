"""An episode as a video: MP4 or GIF, frames upscaled, with a caption strip.

:func:`write_video` encodes frames with PyAV (FFmpeg's libraries in the wheel; never
an ``ffmpeg`` found on PATH): H.264 in MP4 (``yuv420p``, what browsers and notebooks
play; ``lossless=True`` for 4:4:4 at quantizer 0) or a GIF (a gray palette: lossless).
:func:`episode_video` takes an episode of a store, its actions, rewards and return so
far for the caption, and writes it; ``AtariZarrDataset.episode_video`` and
``atari-zarr video`` call it.

Examples
--------
>>> import tempfile
>>> from atari_zarr import AtariZarrDataset
>>> ds = AtariZarrDataset(store_url)  # a converted Pong/1 fixture store
>>> path = episode_video(ds, 0, tempfile.mkdtemp() + "/ep0.gif", scale=2)
>>> path.suffix, path.stat().st_size > 0
('.gif', True)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from atari_zarr.errors import InvalidArgumentError, import_optional
from atari_zarr.layout import FRAME_SHAPE
from atari_zarr.storage.filesystem import disk_full_error, local_write_error

__all__ = [
    "FORMATS",
    "MAX_SCALE",
    "EpisodeFrames",
    "caption_lines",
    "check_scale",
    "episode_frames",
    "episode_video",
    "video_codec",
    "write_video",
]

#: The largest upscale: 84x84 frames become 2,688 pixels wide.
MAX_SCALE = 32
#: Frames upscaled at a time while encoding (memory: this many upscaled frames).
_BLOCK = 16
#: File suffixes written, and the codec of each.
FORMATS = {".mp4": "libx264", ".gif": "gif"}
#: Height of the caption strip, in pixels of the upscaled frame per unit of ``scale``.
_CAPTION_ROWS = 4


def _upscale(frames: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(frames, scale, axis=1), scale, axis=2)


def _caption_strip(texts: Sequence[str], width: int, height: int) -> np.ndarray:
    """One gray strip per text, ``(len(texts), height, width)`` uint8, white on black."""
    image_module = import_optional("PIL.Image", extra="video", purpose="a video's caption")
    draw_module = import_optional("PIL.ImageDraw", extra="video", purpose="a video's caption")
    font_module = import_optional("PIL.ImageFont", extra="video", purpose="a video's caption")
    try:
        font = font_module.load_default(size=max(10, height * 2 // 3))
    except TypeError:  # pragma: no cover - Pillow < 10.1 has one bitmap size
        font = font_module.load_default()
    strips = np.zeros((len(texts), height, width), dtype=np.uint8)
    cache: dict[str, np.ndarray] = {}
    for k, text in enumerate(texts):
        if text not in cache:
            image = image_module.new("L", (width, height), 0)
            draw_module.Draw(image).text((4, height // 6), text, fill=255, font=font)
            cache[text] = np.asarray(image, dtype=np.uint8)
        strips[k] = cache[text]
    return strips


def write_video(
    frames: np.ndarray | EpisodeFrames,
    path: str | os.PathLike[str],
    *,
    scale: int = 4,
    fps: float = 15.0,
    captions: Sequence[str] | None = None,
    lossless: bool = False,
) -> Path:
    """Write gray ``frames`` ``(T, H, W)`` uint8 as a video, its format by ``path``'s suffix.

    Parameters
    ----------
    frames : numpy.ndarray or EpisodeFrames
        ``(T, H, W)`` uint8, or an episode read a block at a time.
    path : path
        ``.mp4`` (H.264) or ``.gif``.
    scale : int
        Each pixel becomes ``scale x scale`` (nearest neighbour; default 4: 336 x 336).
    fps : float
        Frames per second (default 15: Atari's 60 Hz at DQN's frame skip of 4).
    captions : sequence of str, optional
        One line per frame, drawn in a strip under the frame.
    lossless : bool
        MP4 only: 4:4:4 at quantizer 0 (the frames come back within one gray level, the
        rounding of FFmpeg's gray to YUV conversion). GIFs are always lossless.

    Returns
    -------
    pathlib.Path
    """
    av = import_optional("av", extra="video", purpose="writing a video")
    out = Path(path)
    codec = video_codec(out)
    if out.is_dir():
        raise InvalidArgumentError(
            f"{out} is a directory; expected the video's file name, e.g. {out / 'episode.mp4'}"
        )
    if not isinstance(frames, EpisodeFrames):  # else read a block at a time, below
        frames = np.asarray(frames, dtype=np.uint8)
    if frames.ndim != 3 or len(frames) == 0:
        raise InvalidArgumentError(
            f"{out}: expected frames (T, H, W) with T >= 1, found shape {frames.shape}. Pass "
            f"the frames of an episode."
        )
    scale = check_scale(scale, str(out))
    rate = _rate(fps, codec, str(out))
    if captions is not None and len(captions) != len(frames):
        raise InvalidArgumentError(
            f"{out}: {len(captions)} captions for {len(frames)} frames; expected one per frame"
        )
    strip = _CAPTION_ROWS * scale + 8 if captions is not None else 0
    height, width = frames.shape[1] * scale + strip, frames.shape[2] * scale
    pad = (height % 2, width % 2) if codec == "libx264" else (0, 0)  # 4:2:0: even sizes
    tmp = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with av.open(str(tmp), "w", format=out.suffix.lstrip(".").lower()) as container:
            stream = container.add_stream(codec, rate=rate)
            stream.width, stream.height = width + pad[1], height + pad[0]
            if codec == "gif":
                stream.pix_fmt = "gray"
            elif lossless:
                stream.pix_fmt, stream.options = "yuv444p", {"qp": "0", "preset": "veryfast"}
            else:
                stream.pix_fmt, stream.options = "yuv420p", {"crf": "18", "preset": "veryfast"}
            # frame by frame: memory is one upscaled frame (and a block of caption strips),
            # not the whole episode upscaled
            for lo in range(0, len(frames), _BLOCK):
                block = _upscale(frames[lo : lo + _BLOCK], scale)
                if captions is not None:
                    strips = _caption_strip(captions[lo : lo + _BLOCK], width, strip)
                    block = np.concatenate([block, strips], axis=1)
                if any(pad):
                    block = np.pad(block, ((0, 0), (0, pad[0]), (0, pad[1])))
                for frame in block:
                    for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="gray")):
                        container.mux(packet)
                del block  # before the next is made
            for packet in stream.encode():
                container.mux(packet)
        os.replace(tmp, out)  # a video is never left half written under its name
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()  # nothing left behind either
        full = disk_full_error(str(out), exc, resume="nothing was left half written")
        if full is not None:
            raise full from None
        if isinstance(exc, OSError):  # a place that cannot hold a file (/proc, read-only)
            raise local_write_error("writing", str(out), exc) from None
        raise
    return out


def check_scale(scale: object, where: str) -> int:
    """``scale`` as a whole number from 1 to :data:`MAX_SCALE`, or a one-line error.

    Examples
    --------
    >>> check_scale(4, "ep.gif")
    4
    """
    if isinstance(scale, bool) or not isinstance(scale, int | np.integer):
        scale = None
    if scale is None or not 1 <= int(scale) <= MAX_SCALE:  # type: ignore[call-overload]
        raise InvalidArgumentError(
            f"{where}: scale must be a whole number from 1 to {MAX_SCALE} (pixels per "
            f"pixel; {MAX_SCALE} makes 84x84 frames {84 * MAX_SCALE}x{84 * MAX_SCALE}); "
            f"found {scale!r}"
        )
    return int(scale)  # type: ignore[call-overload]


def check_fps(fps: object, where: str, *, gif: bool = False) -> float:
    """``fps`` as frames per second, or a one-line error: positive and finite; a GIF
    counts its delays in hundredths of a second, so at most 100 (``gif=True``).

    Examples
    --------
    >>> check_fps(15, "ep.gif", gif=True)
    15.0
    """
    try:
        value = float(fps)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(fps, bool) or not 0 < value < float("inf"):
        raise InvalidArgumentError(f"{where}: fps must be a positive number, found {fps!r}")
    if gif and value > 100:
        raise InvalidArgumentError(
            f"{where}: a GIF counts its frame delays in hundredths of a second, so fps can be "
            f"at most 100, found {fps!r}; write an .mp4 for a faster video"
        )
    return value


def _rate(fps: float, codec: str, where: str) -> Any:
    from fractions import Fraction

    return Fraction(check_fps(fps, where, gif=codec == "gif")).limit_denominator(1001)


def caption_lines(
    actions: np.ndarray,
    rewards: np.ndarray,
    action_names: Sequence[str] | None = None,
    first_step: int = 0,
) -> list[str]:
    """``step, action, reward, return so far`` for each step of an episode.

    ``first_step`` is the true step of the first row: a fragment's first steps are not
    in the store (the episode table's ``first_step``), and its steps count on from them.

    Examples
    --------
    >>> caption_lines(np.array([0, 3]), np.array([0.0, 1.0]), ["NOOP", "FIRE", "UP", "RIGHT"])
    ['step 0  NOOP  reward 0  return 0', 'step 1  RIGHT  reward 1  return 1']
    >>> caption_lines(np.array([0]), np.array([0.0]), first_step=346)
    ['step 346  action 0  reward 0  return 0']
    """
    actions = np.asarray(actions).reshape(-1)
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    so_far = np.cumsum(rewards)
    lines = []
    for t, (a, r) in enumerate(zip(actions.tolist(), np.asarray(rewards).tolist(), strict=True)):
        name = (
            action_names[a]
            if action_names is not None and 0 <= a < len(action_names)
            else (f"action {a}")
        )
        lines.append(f"step {first_step + t}  {name}  reward {r:g}  return {so_far[t]:g}")
    return lines


def video_codec(path: str | os.PathLike[str]) -> str:
    """The codec of a video written to ``path``, by its suffix; a one-line error for others.

    Examples
    --------
    >>> video_codec("ep.gif"), video_codec("ep.MP4")
    ('gif', 'libx264')
    """
    out = Path(path)
    codec = FORMATS.get(out.suffix.lower())
    if codec is None:
        raise InvalidArgumentError(
            f"{out}: cannot write a video with suffix {out.suffix!r}; expected one of "
            f"{', '.join(FORMATS)}. Name the file e.g. episode.mp4 or episode.gif."
        )
    return codec


def episode_video(
    ds: Any,
    episode: int,
    path: str | os.PathLike[str],
    *,
    scale: int = 4,
    fps: float = 15.0,
    caption: bool = True,
    lossless: bool = False,
) -> Path:
    """Write episode ``episode`` of the dataset ``ds`` as a video (see :func:`write_video`).

    Only that episode's frames are read, so this works on a store in a bucket. The
    caption names the actions as ALE does when the store has ``action_full`` or
    ale-py knows the game's minimal action set, else by their index.

    Raises
    ------
    IndexError
        ``episode`` is out of range: the message gives the valid range.
    """
    frames = EpisodeFrames(ds, episode)
    captions = frames.captions() if caption else None
    return write_video(frames, path, scale=scale, fps=fps, captions=captions, lossless=lossless)


class EpisodeFrames:
    """An episode's frames ``(T, 84, 84)`` (of frame stacks, the newest), read from the
    store a block at a time.

    ``frames[lo:hi]`` reads rows ``lo .. hi - 1`` of the episode (each chunk once), so
    :func:`write_video` holds one block of frames, never the episode: a 27,000-step
    episode costs what 16 steps do.
    """

    def __init__(self, ds: Any, episode: int) -> None:
        rows = ds.episode_rows(episode)
        self.ds, self.episode = ds, episode
        self.first, self.length = rows.start, len(rows)
        self.shape = (self.length, *FRAME_SHAPE)
        self.ndim = 3

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, rows: slice) -> np.ndarray:
        lo, hi, _ = rows.indices(self.length)
        return np.asarray(
            self.ds.read_frames(np.arange(self.first + lo, self.first + hi, dtype=np.int64))
        )

    def captions(self) -> list[str]:
        """One :func:`caption_lines` line per step (actions and rewards: a few bytes each)."""
        rows = np.arange(self.first, self.first + self.length, dtype=np.int64)
        steps = self.ds.read_steps(rows)
        first = int(self.ds.episode_table["first_step"].iloc[self.episode])
        return caption_lines(
            steps["action"], steps["reward"], action_names(self.ds), first_step=max(first, 0)
        )


def episode_frames(
    ds: Any, episode: int, *, captions: bool = True
) -> tuple[np.ndarray, list[str] | None]:
    """Episode ``episode`` of ``ds``: its frames ``(T, 84, 84)`` (of frame stacks, the
    newest) and, with ``captions``, one :func:`caption_lines` line per frame.

    Raises
    ------
    IndexError
        ``episode`` is out of range: the message gives the valid range.
    """
    frames = EpisodeFrames(ds, episode)
    return frames[:], (frames.captions() if captions else None)


def action_names(ds: Any) -> list[str] | None:
    """The names of ``ds``'s actions as its ``action`` column indexes them, if known."""
    from atari_zarr.ale import ALE_ACTIONS, game_action_names

    if getattr(ds, "full_action_space", False):
        return list(ALE_ACTIONS)
    game = ds.metadata.get("game")
    if not game:
        return None
    try:
        return game_action_names(str(game))
    except Exception:  # no ale-py, or a game it does not know: indices instead
        return None
