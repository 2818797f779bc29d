"""The frames of RL Unplugged's episodes: one 84x84 8-bit grayscale PNG per step.

:func:`decode_frames` checks each PNG's header itself (signature, ``IHDR``: 84x84,
bit depth 8, color type 0), so the check does not depend on what a decoder
converts silently (palette, 16-bit, 1-bit gray, alpha), then decodes with the one
decoder :data:`DECODERS` names first among those installed: imagecodecs, the
dependency (its libspng decoder, then its libpng one), then the others by their
speed on real ALE frames (``benchmarks/bench_rlu_decode.py``,
``docs/rl-unplugged-reading.md``).

:func:`encode_frame` writes a PNG with zlib alone, for fixtures and tests.

Examples
--------
>>> import numpy as np
>>> frame = np.arange(84 * 84, dtype=np.uint8).reshape(84, 84)
>>> frames = decode_frames([encode_frame(frame)] * 2, "run_1-00000-of-00050", 0)
>>> frames.shape, bool((frames[1] == frame).all())
((2, 84, 84), True)
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from atari_zarr.errors import MissingDependencyError, SourceFormatError, damaged_advice
from atari_zarr.layout import FRAME_SHAPE

__all__ = ["DECODERS", "FRAME_SHAPE", "decode_frames", "decoder_name", "encode_frame"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: signature, IHDR length and type, width, height, bit depth, color type
_IHDR = struct.Struct(">8sI4sIIBB")
_GRAY = 0

#: ``decode(png, dest)`` decodes ``png`` into ``dest``, an (84, 84) uint8 array, or raises.
Decoder = Callable[[bytes, np.ndarray], None]


def _checked(decode: Callable[[bytes], Any]) -> Decoder:
    """A decoder for those that return a new array: check what it gave, then copy it."""

    def into(png: bytes, dest: np.ndarray) -> None:
        frame = decode(png)
        if frame is None or frame.shape != FRAME_SHAPE or frame.dtype != np.uint8:
            found = "nothing" if frame is None else f"{frame.shape} {frame.dtype}"
            raise ValueError(f"decoded to {found}, not (84, 84) uint8")
        dest[...] = frame

    return into


def _into(decode: Callable[..., Any]) -> Decoder:
    """A decoder for those that write into a caller's array (``out=``)."""

    def into(png: bytes, dest: np.ndarray) -> None:
        decode(png, out=dest)  # straight into the output: no array made, nothing copied

    return into


def _imagecodecs_spng() -> Decoder:
    import imagecodecs

    if not imagecodecs.SPNG.available:  # a build without libspng
        raise ImportError("imagecodecs was built without libspng")
    return _into(imagecodecs.spng_decode)


def _imagecodecs() -> Decoder:
    import imagecodecs

    return _into(imagecodecs.png_decode)


def _pyspng() -> Decoder:
    import pyspng

    return _checked(pyspng.load)


def _cv2() -> Decoder:
    import cv2

    imdecode, flags = cv2.imdecode, cv2.IMREAD_UNCHANGED
    return _checked(lambda png: imdecode(np.frombuffer(png, np.uint8), flags))


def _pillow() -> Decoder:
    import io

    from PIL import Image

    def decode(png: bytes) -> Any:
        with Image.open(io.BytesIO(png)) as image:
            return np.asarray(image)

    return _checked(decode)


#: PNG decoders in the order of preference: the first installed is used. imagecodecs
#: is the declared dependency (the fastest well-kept decoder measured,
#: ``docs/rl-unplugged-reading.md``). Its libspng decoder comes first: as fast as its
#: libpng one on one core, and it releases the GIL, so threads decode in parallel
#: (libpng's, and pyspng, hold it: two threads decode no faster than one). The others,
#: fastest first, serve where it is missing.
DECODERS: dict[str, Callable[[], Decoder]] = {
    "imagecodecs-spng": _imagecodecs_spng,
    "imagecodecs": _imagecodecs,
    "pyspng": _pyspng,
    "cv2": _cv2,
    "pillow": _pillow,
}


@functools.cache
def _decoder() -> tuple[str, Decoder]:
    for name, load in DECODERS.items():
        try:
            return name, load()
        except ImportError:
            continue
    raise MissingDependencyError(
        "decoding RL Unplugged's PNG frames needs one of imagecodecs, pyspng, "
        "opencv-python-headless or Pillow; install it with: pip install imagecodecs"
    )


def decoder_name() -> str:
    """The PNG decoder in use: the first of :data:`DECODERS` that is installed.

    Examples
    --------
    >>> decoder_name() in DECODERS
    True
    """
    return _decoder()[0]


def _bad(where: str, record: int, step: int, what: str) -> SourceFormatError:
    return SourceFormatError(
        f"{where}: record {record}: step {step}: {what}; expected an 84x84 8-bit grayscale "
        f"PNG, or the shard is not from RL Unplugged's Atari episodes. {damaged_advice(where)}"
    )


def _check_header(png: bytes, where: str, record: int, step: int) -> None:
    if len(png) < _IHDR.size or not png.startswith(_SIGNATURE):
        raise _bad(where, record, step, f"not a PNG (starts {bytes(png[:8])!r})")
    _, _, chunk, width, height, depth, color = _IHDR.unpack_from(png)
    if chunk != b"IHDR":
        raise _bad(where, record, step, f"not a PNG (first chunk {chunk!r}, not IHDR)")
    if (height, width) != FRAME_SHAPE or depth != 8 or color != _GRAY:
        raise _bad(
            where,
            record,
            step,
            f"a {width}x{height} PNG of bit depth {depth} and color type {color}",
        )


def decode_frames(
    pngs: Sequence[bytes],
    where: str,
    record: int,
    out: np.ndarray | None = None,
    first_step: int = 0,
) -> np.ndarray:
    """Decode PNGs into a ``(len(pngs), 84, 84)`` uint8 array.

    Parameters
    ----------
    pngs : sequence of bytes
        One PNG per step.
    where : str
        The shard's path or URL, for messages.
    record : int
        The record's index in the shard, for messages.
    out : ndarray, optional
        ``(len(pngs), 84, 84)`` uint8 array (or a view) to decode into.
    first_step : int
        Step index of ``pngs[0]`` in its episode, for messages.

    Raises
    ------
    SourceFormatError
        Naming ``where``, ``record`` and the step: a PNG that does not decode, or
        is not 84x84 8-bit grayscale.

    Examples
    --------
    >>> import numpy as np
    >>> decode_frames([encode_frame(np.zeros((84, 84), np.uint8)), b"oops"], "shard", 5)
    Traceback (most recent call last):
        ...
    atari_zarr.errors.SourceFormatError: shard: record 5: step 1: not a PNG (starts b'oops'); ...
    """
    n = len(pngs)
    if out is None:
        out = np.empty((n, *FRAME_SHAPE), dtype=np.uint8)
    elif out.shape != (n, *FRAME_SHAPE) or out.dtype != np.uint8:
        raise ValueError(
            f"out has shape {out.shape} and dtype {out.dtype}, not ({n}, 84, 84) uint8"
        )
    _, decode = _decoder()
    for i, png in enumerate(pngs):
        _check_header(png, where, record, first_step + i)
        try:
            decode(png, out[i])
        except Exception as exc:  # each decoder has its own errors
            raise _bad(where, record, first_step + i, f"the PNG does not decode ({exc})") from None
    return out


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def encode_frame(frame: np.ndarray) -> bytes:
    """An 84x84 uint8 frame as an 8-bit grayscale PNG (every row filtered with "Up").

    Examples
    --------
    >>> import numpy as np
    >>> png = encode_frame(np.full((84, 84), 7, np.uint8))
    >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", len(png) < 200
    (True, True)
    """
    frame = np.asarray(frame)
    if frame.shape != FRAME_SHAPE or frame.dtype != np.uint8:
        raise ValueError(f"expected an (84, 84) uint8 frame, got {frame.shape} {frame.dtype}")
    height, width = FRAME_SHAPE
    up = np.empty((height, width + 1), dtype=np.uint8)
    up[:, 0] = 2  # filter type "Up": each byte minus the byte above it
    up[0, 1:] = frame[0]
    up[1:, 1:] = frame[1:] - frame[:-1]
    header = struct.pack(">IIBBBBB", width, height, 8, _GRAY, 0, 0, 0)
    return (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(up.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )
