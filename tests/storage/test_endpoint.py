"""The host a URL's requests go to, and an offline machine failing at once.

"Offline" is real here: the call runs in a network namespace of its own (``unshare -n``)
with only loopback up, so the resolver cannot be reached and nothing leaves the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from atari_zarr.storage.endpoint import endpoint_host

OFFLINE = """
import time
from atari_zarr.errors import AtariZarrError
from atari_zarr.compat.decision_transformer import create_dataset
start = time.monotonic()
try:
    create_dataset(2, 300, "Breakout", None, 2)
except AtariZarrError as exc:
    print(f"{time.monotonic() - start:.2f}")
    print(exc)
"""


def test_the_host_is_the_one_the_file_system_connects_to(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert endpoint_host("gs://b/x", {}) == "storage.googleapis.com"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    assert endpoint_host("gs://b/x", {}) == "127.0.0.1"
    assert endpoint_host("s3://b/x", {}) == "s3.amazonaws.com"
    assert endpoint_host("s3://b/x", {"client_kwargs": {"endpoint_url": "http://h:9"}}) == "h"
    assert endpoint_host("https://data.example.org/a.zarr", {}) == "data.example.org"
    assert endpoint_host("/local/path", {}) is None


@pytest.mark.slow
def test_offline_a_drop_in_fails_at_once_in_one_line_and_silently(tmp_path):
    """Before: 41 s of gcsfs's retries and 65 lines of their logged tracebacks; the
    deadline is 60 s, and the look-up that fails is asked once."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("STORAGE_EMULATOR_HOST", "ATARI_ZARR_TIMEOUT", "ATARI_ZARR_MIRRORS")
    }
    env["ATARI_ZARR_HOME"] = str(tmp_path / "home")
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1"', sys.executable,
         OFFLINE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no third-party log lines, no traceback
    seconds, message = proc.stdout.strip().split("\n")
    assert float(seconds) < 10, seconds  # not the file system's rounds of retries
    assert "storage.googleapis.com does not resolve" in message
    assert "gs://rl_unplugged/atari_episodes_ordered/Breakout" in message
    assert "offline" in message and "root=" in message


def test_other_libraries_log_only_into_the_applications_logging():
    script = (
        "import logging, atari_zarr.storage.filesystem\n"
        "logging.getLogger('gcsfs').error('gcsfs retry round')\n"
        "logging.basicConfig()\n"
        "logging.getLogger('gcsfs').error('asked for')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "gcsfs retry round" not in proc.stderr and "asked for" in proc.stderr


@pytest.mark.parametrize("where", ["url", "endpoint"])
def test_a_url_python_cannot_parse_is_one_line(where):
    """``http://[::1`` (an unclosed IPv6 bracket) was a raw ``ValueError: Invalid IPv6
    URL`` traceback from the host look-up, whether the URL or its endpoint held it."""
    from atari_zarr.errors import InvalidArgumentError
    from atari_zarr.storage.filesystem import get_fs

    url, options = (
        ("http://alice:pw@[::1/x", {})
        if where == "url"
        else ("gs://bucket/x", {"endpoint_url": "http://alice:pw@[::1"})
    )
    with pytest.raises(InvalidArgumentError) as info:
        get_fs(url, options, timeout=5)
    text = str(info.value)
    assert "\n" not in text and "is not a URL (Invalid IPv6 URL)" in text, text
    assert "pw" not in text and "[::1" in text, text
