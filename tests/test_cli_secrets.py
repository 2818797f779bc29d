"""No verb of the command line prints a credential: URL user info, signed queries, and
secret storage options, in stdout, stderr and the log at ``-v``, on success and failure.

Real servers on 127.0.0.1 only: fake-gcs-server (read over plain http, as a public
bucket is) and moto's S3 server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from atari_zarr_testkit.gcs import FakeGCSServer
from atari_zarr_testkit.ports import fresh_port
from atari_zarr_testkit.s3 import ACCESS_KEY, SECRET_KEY, MotoS3Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSWORD = "pw-Zq81secret"
SIGNATURE = "sig-Xm93secret"
TOKEN = "tok-Lp27secret"
SECRETS = (PASSWORD, SIGNATURE, TOKEN, SECRET_KEY, ACCESS_KEY)


def _run(*args: str) -> tuple[int, str]:
    env = {**os.environ, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "atari_zarr", "-v", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _clean(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, (leaked, text[-3000:])


@pytest.fixture(scope="module")
def servers(pong_store, pong_source) -> Iterator[dict[str, Any]]:
    with FakeGCSServer() as gcs, MotoS3Server() as s3:
        gcs.create_bucket("pub")
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **gcs.storage_options())
        fs.put(pong_store.url, "pub/Pong/1.zarr", recursive=True)
        s3.create_bucket("priv")
        host = gcs.endpoint_url.split("://", 1)[1]
        yield {
            "http": f"http://user:{PASSWORD}@{host}/pub",
            "query": f"?X-Goog-Signature={SIGNATURE}&X-Amz-Credential={TOKEN}",
            "s3": s3,
            "source_root": str(Path(pong_source.url).parents[1]),
        }


def _s3_options(s3: MotoS3Server) -> list[str]:
    return [
        "-s", f"endpoint_url={s3.storage_options()['endpoint_url']}",
        "-s", f"key={ACCESS_KEY}",
        "-s", f"secret={SECRET_KEY}",
    ]


def test_reading_verbs_over_http_print_no_credentials(servers) -> None:
    store = f"{servers['http']}/Pong/1.zarr{servers['query']}"
    for args in (
        ("info", store),
        ("info", "--json", store),
        ("verify", store),
        ("ls", servers["http"] + servers["query"]),
        ("info", f"{servers['http']}/Nope/1.zarr{servers['query']}"),  # a failure
    ):
        code, out = _run(*args)
        _clean(out)
        assert "***" in out or code != 0, out[-2000:]


def test_verbs_with_a_secret_storage_option_print_no_credentials(servers) -> None:
    s3 = servers["s3"]
    opts = _s3_options(s3)
    dest = "s3://priv/stores"
    code, out = _run("convert", servers["source_root"], dest, "--no-progress", *opts)
    _clean(out)
    assert code == 0, out[-2000:]
    for args in (
        ("info", f"{dest}/Pong/1.zarr", *opts),
        ("ls", dest, *opts),
        ("verify", f"{dest}/Pong/1.zarr", *opts),
        ("info", "s3://no-such-bucket/x.zarr", *opts),  # a failure
    ):
        code, out = _run(*args)
        _clean(out)
    # a refused connection, with the secret in the options: one line, no secret
    dead = f"http://127.0.0.1:{fresh_port()}"
    code, out = _run(
        "info", "s3://priv/stores/Pong/1.zarr", "--timeout", "5",
        "-s", f"endpoint_url={dead}", "-s", f"key={ACCESS_KEY}", "-s", f"secret={SECRET_KEY}",
    )
    _clean(out)
    assert code == 1 and "Traceback" not in out, out[-2000:]


def test_a_file_system_that_cannot_be_set_up_is_one_line() -> None:
    """gcsfs checks a string token with Google while it is set up; a failure there was a
    traceback whose message carried ``access_token=<the token>``."""
    from atari_zarr.errors import RemoteAccessError
    from atari_zarr.storage.filesystem import backend_errors

    options = {"token": TOKEN}
    with pytest.raises(RemoteAccessError) as info:
        with backend_errors("gs://b/x.zarr", options):
            raise ConnectionError(f"Max retries exceeded with url: /tokeninfo?access_token={TOKEN}")
    text = str(info.value)
    assert "\n" not in text and TOKEN not in text and "could not be set up" in text


def test_a_bugs_traceback_carries_no_credentials(monkeypatch, capsys) -> None:
    from atari_zarr import cli

    def boom(args):
        raise RuntimeError(f"unexpected, with {TOKEN} and http://u:{PASSWORD}@h/x")

    verbs = tuple((b, boom if c is cli._cmd_info else c) for b, c in cli._VERBS)
    monkeypatch.setattr(cli, "_VERBS", verbs)
    code = cli.main(["info", "gs://b/x.zarr", "-s", f"token={TOKEN}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" in err and "RuntimeError" in err, err
    _clean(err)
