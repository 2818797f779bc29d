"""No credential is written or logged: what a store, its work area, a catalog and a card
hold, and what the storage libraries log at DEBUG, carry no password of the source URL.
"""

from __future__ import annotations

import logging
import re
import shutil
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from atari_zarr.redaction import redact, redact_tree

PASSWORD = "pw-Hq72secret"
PASSWORD_WITH_AT = "S3c@retPw-Hq72"

_passwords = st.text(alphabet="@:/%#?aZ9-_.~", min_size=1, max_size=16)
_hosts = st.sampled_from(["127.0.0.1:8080", "nobucket", "host.example", "[::1]:9"])
_paths = st.sampled_from(["", "/", "/x", "/Pong/1.zarr", "/a/b?x=1"])
_schemes = st.sampled_from(["http", "https", "gs", "s3"])


def test_a_raw_at_in_the_password_is_redacted_up_to_the_host() -> None:
    """``http://alice:S3c@retPw@host`` was written as ``http://***@retPw@host``: the
    clients take the user info up to the last ``@`` before the host."""
    assert redact("http://alice:S3c@retPw@127.0.0.1:80/x") == "http://***@127.0.0.1:80/x"
    assert redact("home gs://alice:S3c@retPw@nobucket/x: no") == "home gs://***@nobucket/x: no"
    encoded = "GET /storage/v1/b/alice%3AS3c%40retPw%40nobucket/o?a=1"
    assert redact(encoded) == "GET /storage/v1/b/***%40nobucket/o?a=1"
    # an @ in a path is no user info
    for kept in ("http://host:8080/me@x", "http://[::1]:80/a@b", "gs://b/d@v/x"):
        assert redact(kept) == kept


@given(_schemes, st.text("aZ9-_.", min_size=1, max_size=8), _passwords, _hosts, _paths)
def test_user_info_as_a_client_takes_it_is_redacted(scheme, user, password, host, path) -> None:
    """A password spelled as clients take it (``@`` and ``:`` raw, ``/ ? # %`` and the
    rest percent-encoded, or everything encoded) is gone; host and path stay."""
    for spelled in (urllib.parse.quote(password, safe="@:"), urllib.parse.quote(password, safe="")):
        url = f"{scheme}://{user}:{spelled}@{host}{path}"
        assert urllib.parse.urlsplit(url).password == spelled  # what a client reads
        assert redact(f"open {url} failed") == f"open {scheme}://***@{host}{path} failed"
        # the same user info spelled into a request path by a client (gcsfs)
        bucket = urllib.parse.quote(f"{user}:{password}@nobucket", safe="")
        assert redact(f"GET /b/{bucket}/o?x=1") == "GET /b/***%40nobucket/o?x=1"


def _typed_unambiguously(password: str) -> bool:
    """A raw ``/`` in a password leaves ``user:<part>`` before it; where that part holds
    an ``@`` or is digits, the text reads as a user and host, or a host and port, with
    a path (and ``://`` in it reads as a second URL): the password must then be
    percent-encoded, as every client asks anyway."""
    head = password.split("/", 1)[0]
    if "/" not in password:
        return True
    if "://" in f":{password}":
        return False
    return "@" not in head and not re.split(r"[?#]", head)[0].rpartition(":")[2].isdigit()


@given(_schemes, _passwords, _hosts, _paths)
def test_a_password_typed_raw_is_redacted(scheme, password, host, path) -> None:
    """A password typed with raw ``@ : / % # ?`` (a URL no client opens, named by the
    error that says so) leaves no part of itself in the text."""
    assume(_typed_unambiguously(password))
    url = f"{scheme}://alice:{password}@{host}{path}"
    assert redact(f"open {url} failed") == f"open {scheme}://***@{host}{path} failed"


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


@pytest.mark.parametrize("password", [PASSWORD, PASSWORD_WITH_AT])
def test_a_password_in_the_source_url_is_written_nowhere(
    pong_source, tmp_path: Path, caplog, password: str
) -> None:
    """Converting from ``http://user:PW@host/`` wrote the password in cleartext into the
    store's ``zarr.json`` (the command and the source URL), which users mirror and
    publish; fsspec's DEBUG log showed it to an application logging at DEBUG. A raw
    ``@`` in the password left the part after it there."""
    from atari_zarr_testkit.web import DirectoryServer

    from atari_zarr import convert
    from atari_zarr.catalog import write_catalog
    from atari_zarr.explore.card import write_card

    served = tmp_path / "served"
    shutil.copytree(Path(pong_source.url).parents[1], served)
    out = tmp_path / "out"
    with DirectoryServer(served) as server, caplog.at_level(logging.DEBUG):
        url = f"http://user:{password}@{server.host}:{server.port}/"
        [store] = convert(url, str(out), progress=False)
    assert any("fsspec" in r.name for r in caplog.records)  # the log was on, and redacted
    pieces = password.split("@")  # each piece of the password, on its own
    assert not [r.getMessage() for r in caplog.records if any(p in r.getMessage() for p in pieces)]
    write_catalog(str(out))
    write_card(str(out))
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "zarr.json" for p in written)
    assert any(p.name == "catalog.json" for p in written)
    assert any(p.name == "README.md" for p in written)
    leaked = [str(p) for p in written if any(x.encode() in p.read_bytes() for x in pieces)]
    assert not leaked
    meta = (Path(store.url) / "zarr.json").read_text()
    assert "http://***@" in meta  # the source is still named, without its password
