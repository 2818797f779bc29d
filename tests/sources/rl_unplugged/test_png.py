"""PNG frames: every installed decoder agrees on real ALE frames, every bad frame is named."""

from __future__ import annotations

import numpy as np
import pytest
from atari_zarr_testkit.rl_unplugged import make_png, played_episodes, spoil_example

from atari_zarr.errors import MissingDependencyError, SourceFormatError
from atari_zarr.sources.rl_unplugged import png
from atari_zarr.sources.rl_unplugged.png import (
    DECODERS,
    FRAME_SHAPE,
    decode_frames,
    decoder_name,
    encode_frame,
)

WHERE = "gs://rl_unplugged/atari_episodes_ordered/Asterix/run_2-00011-of-00050"


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    """Real ALE frames (the default fixture's play, cached per process)."""
    return played_episodes("Asterix", 0, (None, 30, None, 33))[0].frames[:60]


def libpng(frames: np.ndarray) -> list[bytes]:
    cv2 = pytest.importorskip("cv2")
    return [cv2.imencode(".png", f, [cv2.IMWRITE_PNG_COMPRESSION, 6])[1].tobytes() for f in frames]


def test_round_trip_of_real_frames(frames):
    decoded = decode_frames([encode_frame(f) for f in frames], WHERE, 0)
    assert decoded.shape == (len(frames), *FRAME_SHAPE) and decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, frames)


@pytest.mark.parametrize("name", list(DECODERS))
def test_every_installed_decoder_agrees(name, frames, monkeypatch):
    try:
        decode = DECODERS[name]()
    except ImportError:
        pytest.skip(f"{name} is not installed")
    dest = np.zeros(FRAME_SHAPE, np.uint8)
    for pngs in ([encode_frame(f) for f in frames], libpng(frames)):
        for p, f in zip(pngs, frames, strict=True):
            decode(p, dest)
            np.testing.assert_array_equal(dest, f)
    monkeypatch.setattr(png, "DECODERS", {name: DECODERS[name]})
    png._decoder.cache_clear()
    try:
        assert decoder_name() == name
        np.testing.assert_array_equal(decode_frames(libpng(frames), WHERE, 0), frames)
    finally:
        png._decoder.cache_clear()


def test_decodes_into_out_and_counts_steps_from_first_step(frames):
    out = np.zeros((10, *FRAME_SHAPE), np.uint8)
    result = decode_frames([encode_frame(f) for f in frames[:10]], WHERE, 3, out=out)
    assert result is out
    np.testing.assert_array_equal(out, frames[:10])
    pngs = [encode_frame(f) for f in frames[:3]] + [b"garbage"]
    with pytest.raises(SourceFormatError, match=r"record 3: step 103: not a PNG"):
        decode_frames(pngs, WHERE, 3, first_step=100)
    with pytest.raises(ValueError, match="out has shape"):
        decode_frames(pngs, WHERE, 3, out=out)


@pytest.mark.parametrize(
    ("pixels", "bit_depth", "what"),
    [
        (np.zeros((64, 64), np.uint8), 8, "a 64x64 PNG of bit depth 8 and color type 0"),
        (np.zeros((84, 84, 3), np.uint8), 8, "a 84x84 PNG of bit depth 8 and color type 2"),
        (np.zeros((84, 84), np.uint16), 16, "a 84x84 PNG of bit depth 16 and color type 0"),
        (np.zeros((84, 100), np.uint8), 8, "a 100x84 PNG"),
    ],
)
def test_a_frame_that_is_not_84x84_gray_is_named(pixels, bit_depth, what, frames):
    pngs = [encode_frame(frames[0]), make_png(pixels, bit_depth=bit_depth)]
    with pytest.raises(SourceFormatError) as excinfo:
        decode_frames(pngs, WHERE, 9)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"{WHERE}: record 9: step 1: {what}"), message
    assert "expected an 84x84 8-bit grayscale PNG" in message


def test_a_frame_that_does_not_decode_is_named(frames):
    good = bytearray(encode_frame(frames[0]))
    start = good.index(b"IDAT") + 4
    good[start : start + 12] = bytes(12)  # the header is intact, the image data is not
    with pytest.raises(SourceFormatError, match=rf"^{WHERE}: record 0: step 2: the PNG does not"):
        decode_frames([encode_frame(frames[0])] * 2 + [bytes(good)], WHERE, 0)
    with pytest.raises(SourceFormatError, match=r"step 0: not a PNG \(starts b'\\x89PNG"):
        decode_frames([encode_frame(frames[0])[:20]], WHERE, 0)


def test_spoiled_pngs_of_the_fixture_writer_fail(frames):
    from atari_zarr.sources.rl_unplugged.example import Episode, encode_episode, parse_episode

    ep = Episode(
        0,
        0,
        None,
        None,
        [encode_frame(f) for f in frames[:3]],
        np.zeros(3, int),
        np.zeros(3),
        None,
        np.ones(3),
    )
    for how in ("png_size", "png_rgb", "png_16bit", "png_corrupt", "png_garbage"):
        spoiled = parse_episode(spoil_example(encode_episode(ep), how, step=2), WHERE, 4)
        with pytest.raises(SourceFormatError, match=r"record 4: step 2: "):
            decode_frames(spoiled.observations, WHERE, 4)


def test_no_decoder_installed_names_the_install(monkeypatch):
    def missing():
        raise ImportError("no")

    monkeypatch.setattr(png, "DECODERS", {"none": missing})
    png._decoder.cache_clear()
    try:
        with pytest.raises(MissingDependencyError, match="pip install"):
            decode_frames([b""], WHERE, 0)
    finally:
        png._decoder.cache_clear()


def test_encode_frame_refuses_other_shapes():
    with pytest.raises(ValueError, match=r"expected an \(84, 84\) uint8 frame"):
        encode_frame(np.zeros((84, 84, 1), np.uint8))
