"""MotoS3Server: a real S3 server process on loopback, started and stopped cleanly."""

from __future__ import annotations

import socket

import fsspec
import pytest
from atari_zarr_testkit.s3 import MotoS3Server

pytestmark = pytest.mark.timeout(300)


def test_server_serves_s3_and_stops() -> None:
    with MotoS3Server() as server:
        assert server.running and server.endpoint_url.startswith("http://127.0.0.1:")
        server.create_bucket("harness")
        server.create_bucket("harness")  # exists: nothing happens
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **server.storage_options())
        fs.pipe("harness/a/b.bin", b"0123456789")
        assert fs.cat_file("harness/a/b.bin", start=2, end=5) == b"234"
        assert fs.ls("harness/a") == ["harness/a/b.bin"]
        port = server.port
        server.kill()
        assert not server.running
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0  # refused: nothing listens
    assert server.pid is None
    with pytest.raises(RuntimeError, match="not running"):
        server.create_bucket("late")
