"""An episode as a video: decoded back with the same library, the frames are the store's."""

from __future__ import annotations

import subprocess
import sys

import av
import numpy as np
import pytest

from atari_zarr import AtariZarrDataset
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.explore.video import caption_lines, write_video


def _decode(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="gray") for f in container.decode(video=0)])


def _episode_frames(ds: AtariZarrDataset, i: int) -> np.ndarray:
    table = ds.episode_table
    a, n = int(table["first_row"][i]), int(table["length"][i])
    return ds.read_frames(np.arange(a, a + n))


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_the_frames_come_back_at_the_given_upscale(pong_store, tmp_path, suffix):
    ds = AtariZarrDataset(pong_store.url)
    out = ds.episode_video(1, tmp_path / f"e{suffix}", scale=3, caption=False, lossless=True)
    got = _decode(out)
    want = np.repeat(np.repeat(_episode_frames(ds, 1), 3, axis=1), 3, axis=2)
    assert got.shape == want.shape
    # a GIF of gray frames is exact; lossless H.264 is 4:4:4 at quantizer 0, and FFmpeg's
    # gray <-> YUV conversion rounds by at most one level (a wrong frame differs by far more)
    tolerance = 0 if suffix == ".gif" else 1
    assert np.abs(got.astype(np.int16) - want).max() <= tolerance
    neighbours = np.abs(got[1:].astype(np.int16) - want[:-1]).max()
    assert neighbours > tolerance  # the comparison can tell one frame from the next


def test_the_caption_is_a_strip_under_the_frame(pong_store, tmp_path):
    ds = AtariZarrDataset(pong_store.url)
    out = ds.episode_video(0, tmp_path / "c.gif", scale=2)
    got = _decode(out)
    frames = _episode_frames(ds, 0)
    assert got.shape[1] > 84 * 2 and got.shape[2] == 84 * 2
    np.testing.assert_array_equal(got[:, : 84 * 2], np.repeat(np.repeat(frames, 2, 1), 2, 2))
    strip = got[:, 84 * 2 :]
    assert (strip > 128).any(axis=(1, 2)).all()  # text on every frame
    assert not np.array_equal(strip[0], strip[-1])  # the step changes


def test_caption_lines_count_the_return_so_far():
    lines = caption_lines(np.array([1, 0, 2]), np.array([1.0, 0.0, -1.0]), ["NOOP", "FIRE"])
    assert lines == [
        "step 0  FIRE  reward 1  return 1",
        "step 1  NOOP  reward 0  return 1",
        "step 2  action 2  reward -1  return 0",
    ]


def test_bad_input_is_one_line(pong_store, tmp_path):
    ds = AtariZarrDataset(pong_store.url)
    with pytest.raises(InvalidArgumentError, match=r"suffix '\.avi'.*\.mp4, \.gif"):
        write_video(np.zeros((2, 84, 84), np.uint8), tmp_path / "x.avi")
    with pytest.raises(IndexError, match=r"episode 999 is out of range .* \(0 to \d+\)"):
        ds.episode_video(999, tmp_path / "x.gif")
    assert not list(tmp_path.iterdir())  # nothing half written


def test_the_command_line_writes_a_video_and_names_the_valid_range(pong_store, tmp_path):
    out = tmp_path / "ep.mp4"
    done = subprocess.run(
        [sys.executable, "-m", "atari_zarr", "video", pong_store.url, str(out), "--episode", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout and len(_decode(out)) == int(
        AtariZarrDataset(pong_store.url).episode_table["length"][1]
    )
    bad = subprocess.run(
        [sys.executable, "-m", "atari_zarr", "video", pong_store.url, str(out), "--episode", "99"],
        capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode == 1
    [line] = bad.stderr.strip().splitlines()
    assert line.startswith("atari-zarr video: error: --episode 99: episode 99 is out of range")


def test_the_suffix_is_checked_first_and_quiet_prints_nothing(pong_store, tmp_path):
    """A suffix that cannot be written is said before the store is read (here it does not
    even exist); ``-q`` prints nothing at all, ALE's banner included."""
    bad = subprocess.run(
        [sys.executable, "-m", "atari_zarr", "video", str(tmp_path / "nope.zarr"),
         str(tmp_path / "ep.txt")],
        capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode == 1 and "suffix '.txt'" in bad.stderr and "nope" not in bad.stderr
    quiet = subprocess.run(
        [sys.executable, "-m", "atari_zarr", "video", "-q", pong_store.url,
         str(tmp_path / "ep.gif"), "--scale", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == "", quiet.stderr
    assert (tmp_path / "ep.gif").stat().st_size > 0


def test_rates_scales_and_outs_that_cannot_be_written_are_one_line(pong_store, tmp_path):
    """Each used to be a traceback, or was accepted; nothing is left behind."""
    ds = AtariZarrDataset(pong_store.url)
    (tmp_path / "dir.gif").mkdir()
    for out, kwargs, expected in (
        ("ep.gif", {"fps": 120}, "at most 100"),
        ("ep.mp4", {"fps": 0}, "fps must be a positive number"),
        ("ep.mp4", {"fps": float("nan")}, "fps must be a positive number"),
        ("ep.gif", {"scale": 1000}, "scale must be a whole number from 1 to 32"),
        ("ep.gif", {"scale": 0}, "scale must be"),
        ("ep.gif", {"scale": 2.5}, "scale must be"),
        ("dir.gif", {}, "is a directory"),
    ):
        with pytest.raises(InvalidArgumentError, match=expected) as info:
            ds.episode_video(0, tmp_path / out, **kwargs)
        assert "\n" not in str(info.value)
    for kwargs in ({"fps": 0}, {"fps": float("nan")}, {"scale": 0}, {"scale": -3}):
        with pytest.raises(InvalidArgumentError):
            ds.show_episode(0, **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.gif"]
    cli = subprocess.run(
        [sys.executable, "-m", "atari_zarr", "video", pong_store.url, str(tmp_path / "x.gif"),
         "--fps", "120"],
        capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and "at most 100" in cli.stderr


def test_a_failed_write_leaves_nothing_and_a_full_disk_is_one_line(
    pong_store, tmp_path, monkeypatch
):
    import errno

    from atari_zarr.errors import StoreWriteError

    real = av.container.OutputContainer.mux

    def full(self, packet):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".ep.gif.partial"))

    monkeypatch.setattr(av.container.OutputContainer, "mux", full)
    with pytest.raises(StoreWriteError, match="the disk is full") as info:
        AtariZarrDataset(pong_store.url).episode_video(0, tmp_path / "ep.gif")
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(av.container.OutputContainer, "mux", real)


def test_memory_is_a_block_of_frames_not_the_episode_upscaled(tmp_path):
    import tracemalloc

    frames = np.random.default_rng(0).integers(0, 255, (256, 84, 84), dtype=np.uint8)
    whole = frames.size * 8 * 8  # the episode upscaled 8x at once: 116 MB
    tracemalloc.start()
    try:
        write_video(frames, tmp_path / "ep.mp4", scale=8, captions=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < whole / 5, (peak, whole)


def test_an_out_where_no_file_can_be_is_one_line(pong_store):
    from atari_zarr.errors import StoreWriteError

    for out in ("/proc/ep.gif", "/sys/ep.gif"):
        with pytest.raises(StoreWriteError) as info:
            AtariZarrDataset(pong_store.url).episode_video(0, out, scale=1)
        assert "\n" not in str(info.value) and out in str(info.value)


def test_an_episode_video_reads_its_frames_a_block_at_a_time(tmp_path):
    """A long episode: memory is a block of frames, not the episode (nor it upscaled)."""
    import tracemalloc

    from tests.read.test_stream import write_store

    url = write_store(str(tmp_path / "s.zarr"), 3000, seed=0, max_len=3000, final=False)
    ds = AtariZarrDataset(url)
    longest = int(ds.episode_table["length"].idxmax())
    n = int(ds.episode_table["length"][longest])
    assert n >= 2500
    raw = n * 84 * 84  # the episode's frames, not upscaled
    tracemalloc.start()
    try:
        out = ds.episode_video(longest, tmp_path / "ep.mp4", scale=1, caption=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.stat().st_size > 0
    assert peak < raw / 4, (peak, raw)
