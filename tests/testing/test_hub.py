"""The test kit's Hub emulator: huggingface_hub's own file system reads through it, a
store reads from ``hf://`` exactly, and resolves past the rate limit are 429s that the
client waits out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from atari_zarr_testkit.hub import HubEmulator

pytest.importorskip("huggingface_hub")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "big.bin").write_bytes(bytes(range(256)) * 16)  # 4 KB: LFS
    (tmp_path / "small.txt").write_text("hello hub")
    return tmp_path


def _fs(hub: HubEmulator):
    from huggingface_hub import HfFileSystem

    return HfFileSystem(endpoint=hub.endpoint, token=False, skip_instance_cache=True)


def test_huggingface_hubs_file_system_lists_and_reads_through_it(repo: Path) -> None:
    with HubEmulator({"org/data": repo}) as hub:
        fs = _fs(hub)
        names = sorted(fs.ls("datasets/org/data", detail=False))
        assert names == ["datasets/org/data/small.txt", "datasets/org/data/sub"]
        assert sorted(fs.find("datasets/org/data")) == [
            "datasets/org/data/small.txt",
            "datasets/org/data/sub/big.bin",
        ]
        info = fs.info("datasets/org/data/sub/big.bin")
        assert info["size"] == 4096 and info["type"] == "file" and info["lfs"] is not None
        assert fs.cat_file("datasets/org/data/small.txt") == b"hello hub"
        assert fs.cat_file("datasets/org/data/sub/big.bin", start=10, end=14) == bytes(
            [10, 11, 12, 13]
        )
        with pytest.raises(FileNotFoundError):
            fs.info("datasets/org/data/missing.bin")
    assert any(path.endswith("/resolve/main/small.txt") for _, path, _ in hub.log)


def test_resolves_past_the_limit_are_429s_with_retry_after(repo: Path) -> None:
    import urllib.error
    import urllib.request

    with HubEmulator({"org/data": repo}, limit=2, window=60) as hub:
        url = f"{hub.endpoint}/datasets/org/data/resolve/main/small.txt"
        for _ in range(2):
            with urllib.request.urlopen(url) as answer:
                assert answer.read() == b"hello hub"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url)
        err.value.close()
        assert err.value.code == 429
        assert int(err.value.headers["Retry-After"]) >= 1
        assert "q=2" in err.value.headers["RateLimit-Policy"]
        assert "r=0" in err.value.headers["RateLimit"]


def test_a_store_reads_exactly_from_hf(pong_store, tmp_path: Path) -> None:
    import shutil

    from atari_zarr import AtariZarrDataset

    shutil.copytree(pong_store.url, tmp_path / "Pong" / "1.zarr")
    with HubEmulator({"org/atari": tmp_path}) as hub:
        remote = AtariZarrDataset(
            "hf://datasets/org/atari/Pong/1.zarr", storage_options=hub.storage_options()
        )
        local = AtariZarrDataset(pong_store.url)
        rows = np.random.default_rng(0).integers(0, len(local), 64)
        got, want = remote[rows], local[rows]
        for key in want.keys(include_nested=True, leaves_only=True):
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=str(key))
        assert hub.resolves > 0


def test_random_batches_keep_going_at_a_scaled_down_rate_limit(
    pong_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Hub's anonymous rate (3,000 resolves in 5 minutes) scaled down to 2 per 2
    seconds, nothing kept between batches (the object cache off: byte ranges through
    huggingface_hub's file system) so that every batch resolves: the batches that meet
    429s wait as the Hub says and come back exact."""
    import shutil

    monkeypatch.setenv("ATARI_ZARR_OBJECT_CACHE_SIZE", "0")

    from atari_zarr import AtariZarrDataset, ReadOptions

    shutil.copytree(pong_store.url, tmp_path / "Pong" / "1.zarr")
    local = AtariZarrDataset(pong_store.url)
    rng = np.random.default_rng(1)
    with HubEmulator({"org/atari": tmp_path}, limit=2, window=2.0) as hub:
        remote = AtariZarrDataset(
            "hf://datasets/org/atari/Pong/1.zarr",
            storage_options=hub.storage_options(),
            options=ReadOptions(kept_bytes=0, frame_cache_bytes=0),
        )
        for _ in range(6):
            rows = rng.integers(0, len(local), 32)
            got, want = remote[rows], local[rows]
            np.testing.assert_array_equal(got["observation"].numpy(), want["observation"].numpy())
        limited = [entry for entry in hub.log if entry[2] == 429]
    assert limited, "the limit was never reached: the test did not test it"
