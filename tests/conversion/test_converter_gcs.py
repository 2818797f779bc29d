"""Parallel conversion into a bucket (fake-gcs-server): same store, then verified remotely."""

from __future__ import annotations

import pytest
from atari_zarr_testkit.gcs import FakeGCSServer

from atari_zarr import convert
from atari_zarr.verify import verify_store


@pytest.mark.slow
def test_convert_into_a_bucket_resumable_and_verified(pong_run, source_root, tmp_path):
    gcsfs = pytest.importorskip("gcsfs")
    with FakeGCSServer() as server:
        server.create_bucket("out")
        opts = server.storage_options()
        [store] = convert(
            str(source_root),
            "gs://out/atari",
            storage_options=opts,
            source_storage_options={},
            scheduler="threads",
            workers=2,
            progress=False,
        )
        assert store.url == "gs://out/atari/Pong/1.zarr"
        fs = gcsfs.GCSFileSystem(**opts)
        # the work area (markers, pieces, lock) is gone once the store is complete
        assert not fs.exists("out/atari/Pong/1.zarr.converting")
        report = verify_store(
            store.url,
            source=str(source_root / "Pong" / "1"),
            storage_options=opts,
            source_storage_options={},
        )
        assert report.ok, report.format()
        # same bytes as a local conversion
        convert(str(source_root), str(tmp_path), scheduler="synchronous", progress=False)
        for path in sorted(p for p in (tmp_path / "Pong" / "1.zarr").rglob("*") if p.is_file()):
            rel = path.relative_to(tmp_path / "Pong" / "1.zarr").as_posix()
            remote = fs.cat_file(f"out/atari/Pong/1.zarr/{rel}")
            if rel == "zarr.json":
                remote = remote.replace(b"gs://out/atari", str(tmp_path).encode())
            assert remote == path.read_bytes(), rel
