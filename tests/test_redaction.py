"""No credential is written or logged: what a store, its work area, a catalog and a card
hold, and what the storage libraries log at DEBUG, carry no password of the source URL.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from atari_zarr.redaction import redact, redact_tree

PASSWORD = "pw-Hq72secret"


def test_percent_encoded_user_info_is_redacted() -> None:
    # gcsfs spells the "bucket" of gs://user:PW@bucket/x into its request path
    text = f"GET https://storage.googleapis.com/storage/v1/b/user%3A{PASSWORD}%40bkt/o?x=1"
    assert PASSWORD not in redact(text)
    assert "%40bkt/o?x=1" in redact(text)
    assert redact("a%3Ab/c") == "a%3Ab/c"  # no %40: not user info


def test_redact_tree_walks_dicts_lists_and_tuples() -> None:
    tree = {"a": [f"http://u:{PASSWORD}@h/x", 3], "b": (f"s3://k:{PASSWORD}@b/",), "c": None}
    out = redact_tree(tree)
    assert PASSWORD not in repr(out)
    assert out["a"][1] == 3 and out["c"] is None and isinstance(out["b"], tuple)


def test_a_password_in_the_source_url_is_written_nowhere(
    pong_source, tmp_path: Path, caplog
) -> None:
    """Converting from ``http://user:PW@host/`` wrote the password in cleartext into the
    store's ``zarr.json`` (the command and the source URL), which users mirror and
    publish; fsspec's DEBUG log showed it to an application logging at DEBUG."""
    from atari_zarr_testkit.web import DirectoryServer

    from atari_zarr import convert
    from atari_zarr.catalog import write_catalog
    from atari_zarr.explore.card import write_card

    served = tmp_path / "served"
    shutil.copytree(Path(pong_source.url).parents[1], served)
    out = tmp_path / "out"
    with DirectoryServer(served) as server, caplog.at_level(logging.DEBUG):
        url = f"http://user:{PASSWORD}@{server.host}:{server.port}/"
        [store] = convert(url, str(out), progress=False)
    assert any("fsspec" in r.name for r in caplog.records)  # the log was on, and redacted
    assert not [r.getMessage() for r in caplog.records if PASSWORD in r.getMessage()]
    write_catalog(str(out))
    write_card(str(out))
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "zarr.json" for p in written)
    assert any(p.name == "catalog.json" for p in written)
    assert any(p.name == "README.md" for p in written)
    leaked = [str(p) for p in written if PASSWORD.encode() in p.read_bytes()]
    assert not leaked
    meta = (Path(store.url) / "zarr.json").read_text()
    assert "http://***@" in meta  # the source is still named, without its password
