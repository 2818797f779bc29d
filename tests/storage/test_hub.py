"""Stores read from the Hugging Face Hub (``hf://``), against the test kit's emulator of
the Hub's API: objects fetched whole at one commit, each once, checked; rate limits waited
out quietly; private repos read with the user's token, which no message shows."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from atari_zarr_testkit.hub import HubEmulator

from atari_zarr import AtariZarrDataset, ReadOptions
from atari_zarr.errors import RemoteAccessError, RemoteTimeoutError, StoreCorruptError
from atari_zarr.storage.hub import parse_hf_url, retry_after

pytest.importorskip("huggingface_hub")

URL = "hf://datasets/org/atari/Pong/1.zarr"


@pytest.fixture
def repo(pong_store, tmp_path: Path) -> Path:
    """A dataset repo holding the Pong/1 store."""
    root = tmp_path / "repo"
    shutil.copytree(pong_store.url, root / "Pong" / "1.zarr")
    return root


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("ATARI_ZARR_HOME", str(home))
    return home


def _objects(store: Path) -> int:
    return sum(1 for p in store.rglob("*") if p.is_file())


def _same(got, want) -> None:
    for key in want.keys(include_nested=True, leaves_only=True):
        np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=str(key))


def test_urls_and_waits_are_read_as_the_hub_writes_them() -> None:
    where = parse_hf_url("hf://datasets/org/atari@refs%2Fpr%2F1/Pong/1.zarr")
    assert (where.repo_id, where.revision, where.path) == ("org/atari", "refs/pr/1", "Pong/1.zarr")
    assert where.url() == "hf://datasets/org/atari@refs%2Fpr%2F1/Pong/1.zarr"
    assert parse_hf_url("hf://datasets/org/atari").url() == "hf://datasets/org/atari"
    with pytest.raises(Exception, match="hf://datasets/ORG/NAME"):
        parse_hf_url("hf://org")
    assert retry_after({"Retry-After": "12"}) == 12
    assert retry_after({"RateLimit": '"resolvers";r=0;t=4'}) == 4
    assert retry_after({}) == 1


def test_random_batches_fetch_each_object_once_at_the_rate_limit(
    pong_store, repo: Path, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rate limit met (every third resolve is a 429, however slowly they come):
    random batches come back exact, each object is resolved once (429s aside), and the
    waits are logged at INFO, never as warnings."""
    local = AtariZarrDataset(pong_store.url, frame_stack=4)
    rng = np.random.default_rng(0)
    caplog.set_level(logging.INFO)
    # the package's own logger too: a command line run in this process set its level
    caplog.set_level(logging.INFO, logger="atari_zarr")
    with HubEmulator({"org/atari": repo}, refuse_every=3) as hub:
        remote = AtariZarrDataset(
            URL,
            storage_options=hub.storage_options(),
            frame_stack=4,
            options=ReadOptions(kept_bytes=0, frame_cache_bytes=0),
        )
        for _ in range(20):
            rows = rng.integers(0, len(local), 64)
            _same(remote[rows], local[rows])
        answered = [path for _, path, status in hub.log if "/resolve/" in path and status == 200]
        limited = [path for _, path, status in hub.log if status == 429]
    assert len(answered) == len(set(answered)) <= _objects(repo / "Pong" / "1.zarr")
    assert limited, "the limit was never reached: the test did not test it"
    ours = ("atari_zarr", "huggingface_hub", "fsspec", "aiohttp", "zarr")
    loud = [r for r in caplog.records if r.name.startswith(ours) and r.levelno > logging.INFO]
    assert any("429" in r.getMessage() for r in caplog.records if r.name == "atari_zarr")
    assert not loud, caplog.text


def test_an_epoch_costs_one_resolve_per_object_and_the_next_none(
    pong_store, repo: Path, home: Path
) -> None:
    local = AtariZarrDataset(pong_store.url)
    with HubEmulator({"org/atari": repo}) as hub:
        remote = AtariZarrDataset(URL, storage_options=hub.storage_options())
        rows = sum(len(b["action"]) for b in remote.stream(batch_size=64, shuffle=False))
        first = hub.resolves
        # a new dataset, as a new job would open it: the objects are on local disk
        again = AtariZarrDataset(URL, storage_options=hub.storage_options())
        batches = list(again.stream(batch_size=64, shuffle=False))
        second = hub.resolves - first
    assert rows == len(local)
    assert first <= _objects(repo / "Pong" / "1.zarr")
    assert second == 0
    np.testing.assert_array_equal(
        np.concatenate([b["observation"].numpy() for b in batches]),
        local[np.arange(len(local))]["observation"].numpy(),
    )
    kept = list((home / "objects").rglob("observation/c/*/0/0"))
    assert kept, "the objects were not kept under $ATARI_ZARR_HOME/objects"


def test_a_commit_is_the_cache_key_and_a_branch_is_resolved_once(repo: Path, home: Path) -> None:
    with HubEmulator({"org/atari": repo}) as hub:
        AtariZarrDataset(URL, storage_options=hub.storage_options())
        revisions = [path for _, path, _ in hub.log if path.startswith("/api/")]
        resolves = [path for _, path, _ in hub.log if "/resolve/" in path]
    assert revisions == ["/api/datasets/org/atari"]
    assert all(f"/resolve/{hub.sha['org/atari']}/" in path for path in resolves)
    assert (home / "objects").is_dir()
    assert list((home / "objects").rglob(hub.sha["org/atari"]))


def test_a_rate_limit_past_the_deadline_is_a_wait_never_damage(repo: Path, home: Path) -> None:
    with HubEmulator({"org/atari": repo}, limit=1, window=30.0) as hub:
        with pytest.raises(RemoteTimeoutError) as err:
            AtariZarrDataset(URL, storage_options=hub.storage_options(), timeout=2)[0:4]
    message = str(err.value)
    assert "rate-limits" in message and "asked to wait" in message
    assert "damage" not in message.replace("nothing is damaged", "")
    assert "\n" not in message


def test_a_private_repo_is_read_with_the_users_token_never_shown(
    pong_store, repo: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hf_secretTokenValue123"
    with HubEmulator({"org/atari": repo}, private={"org/atari": secret}) as hub:
        endpoint = {"endpoint": hub.endpoint}
        monkeypatch.delenv("HF_TOKEN", raising=False)
        with pytest.raises(RemoteAccessError) as err:
            AtariZarrDataset(URL, storage_options={**endpoint, "token": False})
        assert "401" in str(err.value) and "HF_TOKEN" in str(err.value)
        with pytest.raises(RemoteAccessError) as wrong:
            AtariZarrDataset(URL, storage_options={**endpoint, "token": "hf_wrongTokenValue99"})
        assert "hf_wrongTokenValue99" not in str(wrong.value)
        monkeypatch.setenv("HF_TOKEN", secret)
        remote = AtariZarrDataset(URL, storage_options=endpoint)
        _same(remote[0:32], AtariZarrDataset(pong_store.url)[0:32])
        assert secret not in repr(remote)
        sent = [auth for path, auth in hub.authorizations if "resolve" in path]
        assert sent and set(sent) == {f"Bearer {secret}"}


def test_a_body_spoiled_in_transit_is_fetched_again_and_never_kept(
    pong_store, repo: Path, home: Path
) -> None:
    with HubEmulator({"org/atari": repo}, redirect=True, lfs_from=64) as hub:
        hub.spoil("observation/c/0/0/0", times=1)
        remote = AtariZarrDataset(URL, storage_options=hub.storage_options())
        _same(remote[0:40], AtariZarrDataset(pong_store.url)[0:40])
        cdn = [path for _, path, _ in hub.log if path.startswith("/cdn/")]
        assert cdn.count("/cdn/org/atari/Pong/1.zarr/observation/c/0/0/0") == 2
        hub.spoil("observation/c/0/0/0", times=2)
        shutil.rmtree(home / "objects")
        with pytest.raises(RemoteAccessError, match="checksum") as err:
            AtariZarrDataset(URL, storage_options=hub.storage_options())[0:40]
    assert "twice" in str(err.value) and "\n" not in str(err.value)
    assert not list((home / "objects").rglob("observation/c/0/0/0"))


_READER = """
import sys
from atari_zarr import AtariZarrDataset
ds = AtariZarrDataset(sys.argv[1], storage_options={"endpoint": sys.argv[2], "token": False})
print(int(ds[list(range(len(ds)))]["observation"].numpy().sum()))
"""


def test_processes_share_the_objects_and_a_killed_download_leaves_nothing_taken(
    pong_store, repo: Path, home: Path
) -> None:
    """Two processes reading at once resolve each object once between them; a process
    killed (SIGKILL) mid-download leaves no object a later reader takes for whole."""
    import os
    import signal
    import time

    env = {**os.environ, "ATARI_ZARR_HOME": str(home)}
    local = AtariZarrDataset(pong_store.url)
    want = int(local[list(range(len(local)))]["observation"].numpy().sum())
    with HubEmulator({"org/atari": repo}, delay=0.3) as hub:
        victim = subprocess.Popen(
            [sys.executable, "-c", _READER, URL, hub.endpoint], env=env, stdout=subprocess.DEVNULL
        )
        while not any("/observation/c/" in path for _, path, _ in hub.log):
            time.sleep(0.02)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        hub.delay = 0.02
        while hub.in_flight:  # what the victim asked is answered (to no one) first
            time.sleep(0.02)
        before = len(hub.log)
        readers = [
            subprocess.Popen(
                [sys.executable, "-c", _READER, URL, hub.endpoint], env=env, stdout=subprocess.PIPE
            )
            for _ in range(2)
        ]
        sums = [int(r.communicate()[0]) for r in readers]
        answered = [path for _, path, st in hub.log[before:] if "/resolve/" in path and st == 200]
    assert sums == [want, want]
    assert len(answered) == len(set(answered)), "an object was fetched by both processes"


def test_a_catalogued_root_opens_in_a_few_requests_at_one_commit(repo: Path, home: Path) -> None:
    """``from_root`` reads the repo's catalog and opens nothing else; its stores, opened
    when batches need them, are read at one commit, resolved once."""
    from atari_zarr import MultiGameDataset
    from atari_zarr.catalog import write_catalog

    shutil.copytree(repo / "Pong" / "1.zarr", repo / "Pong" / "2.zarr")
    write_catalog(str(repo))
    with HubEmulator({"org/atari": repo}) as hub:
        mixed = MultiGameDataset.from_root(
            "hf://datasets/org/atari", storage_options=hub.storage_options()
        )
        opened = len(hub.log)
        for _ in range(4):
            mixed.sample(64)
        asked = [path for _, path, _ in hub.log if path == "/api/datasets/org/atari"]
    assert opened <= 3, hub.log[:opened]
    # one for the catalog (huggingface_hub's file system), one for both stores' commit
    assert len(asked) == 2, hub.log


def test_the_token_of_huggingface_cli_login_reads_a_private_repo(
    repo: Path, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``HF_TOKEN``, no ``token=``: the token ``huggingface-cli login`` stored is used."""
    import huggingface_hub.constants

    secret = "hf_storedByLoginToken77"
    stored = tmp_path / "hf-home" / "token"
    stored.parent.mkdir()
    stored.write_text(secret)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(stored))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    with HubEmulator({"org/atari": repo}, private={"org/atari": secret}) as hub:
        remote = AtariZarrDataset(URL, storage_options={"endpoint": hub.endpoint})
        assert len(remote[0:8]["action"]) == 8
        assert secret not in repr(remote)


def test_the_command_line_waits_out_429s_without_a_word_below_v(repo: Path, home: Path) -> None:
    """``verify``, ``info`` and ``ls`` of an ``hf://`` store meeting 429s (every third
    resolve): their answers, and nothing on stderr; with ``-v``, the waits are shown."""
    import os

    from atari_zarr.catalog import write_catalog

    write_catalog(str(repo))
    env = {**os.environ, "ATARI_ZARR_HOME": str(home)}
    with HubEmulator({"org/atari": repo}, refuse_every=3) as hub:
        options = ["-s", f"endpoint={hub.endpoint}", "-s", "token=false"]

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "atari_zarr", *args, *options],
                capture_output=True,
                text=True,
                env=env,
            )

        for args in (
            ("verify", URL, "--no-progress"),
            ("info", URL),
            ("ls", "hf://datasets/org/atari"),
        ):
            done = run(*args)
            assert done.returncode == 0 and done.stdout, (args, done.stderr)
            assert done.stderr == "", (args, done.stderr)
        limited = sum(1 for _, _, status in hub.log if status == 429)
        shutil.rmtree(home / "objects", ignore_errors=True)
        loud = run("-v", "info", URL)
    assert limited, "no 429 was met: the test did not test it"
    assert loud.returncode == 0 and "429" in loud.stderr


def test_a_server_that_resolves_branches_only_is_read_by_the_branch(
    pong_store, repo: Path, home: Path
) -> None:
    with HubEmulator({"org/atari": repo}, branches_only=True) as hub:
        remote = AtariZarrDataset(URL, storage_options=hub.storage_options())
        _same(remote[0:32], AtariZarrDataset(pong_store.url)[0:32])
        by_commit = [p for _, p, st in hub.log if f"/resolve/{hub.sha['org/atari']}/" in p]
    assert len(by_commit) == 1  # asked once by commit, then by the branch


def test_a_password_in_the_endpoint_is_never_written_to_disk_or_printed(
    pong_store, repo: Path, home: Path, tmp_path: Path
) -> None:
    """An endpoint with user info (``HF_ENDPOINT`` or ``storage_options["endpoint"]``):
    the object cache's folders are named by host and port alone, and no file under the
    cache, nor anything a command prints, holds the password."""
    import os

    secret = "hf_UrlSecret0xDEAD"
    hf_home = tmp_path / "hf-home"
    with HubEmulator({"org/atari": repo}) as hub:
        endpoint = hub.endpoint.replace("http://", f"http://me:{secret}@")
        remote = AtariZarrDataset(URL, storage_options={"endpoint": endpoint, "token": False})
        _same(remote[0:40], AtariZarrDataset(pong_store.url)[0:40])
        env = {**os.environ, "ATARI_ZARR_HOME": str(home), "HF_ENDPOINT": endpoint}
        env.update(HF_HOME=str(hf_home), HF_TOKEN="")
        printed = ""
        for args in (("info", URL), ("verify", URL, "--no-progress")):
            shutil.rmtree(home / "objects", ignore_errors=True)
            done = subprocess.run(
                [sys.executable, "-m", "atari_zarr", "-v", *args],
                capture_output=True,
                text=True,
                env=env,
            )
            assert done.returncode == 0, done.stderr
            printed += done.stdout + done.stderr
    assert "127.0.0.1" in printed  # the endpoint was used, and shown without its user info
    assert secret not in printed
    written = [p for d in (home, hf_home) if d.exists() for p in d.rglob("*")]
    assert [p for p in written if p.is_file() and "observation" in p.as_posix()]
    assert not [p for p in written if secret in p.as_posix() or "me_" in p.name]
    assert not [p for p in written if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.parametrize("bound", ["100", "4K", "50K"])
def test_an_object_cache_smaller_than_an_object_reads_through(
    pong_store, repo: Path, home: Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    """A bound below one object (or a few): every read comes back exact, never "not a
    Zarr store" nor an object "evicted as fast as it was fetched"."""
    monkeypatch.setenv("ATARI_ZARR_OBJECT_CACHE_SIZE", bound)
    local = AtariZarrDataset(pong_store.url, frame_stack=4)
    rows = np.random.default_rng(1).integers(0, len(local), 64)
    with HubEmulator({"org/atari": repo}) as hub:
        remote = AtariZarrDataset(URL, storage_options=hub.storage_options(), frame_stack=4)
        _same(remote[rows], local[rows])
        _same(remote[0:300], local[0:300])


@pytest.mark.parametrize("bound", ["nan", "inf", "-5G", "lots"])
def test_an_object_cache_size_that_is_no_size_is_one_line(
    repo: Path, home: Path, bound: str
) -> None:
    import os

    env = {**os.environ, "ATARI_ZARR_HOME": str(home), "ATARI_ZARR_OBJECT_CACHE_SIZE": bound}
    with HubEmulator({"org/atari": repo}) as hub:
        done = subprocess.run(
            [sys.executable, "-m", "atari_zarr", "info", URL, "-s", f"endpoint={hub.endpoint}"],
            capture_output=True,
            text=True,
            env=env,
        )
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"ATARI_ZARR_OBJECT_CACHE_SIZE={bound!r}" in done.stderr


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["index", "chunk"])
def test_a_damaged_kept_object_is_fetched_again_and_the_hubs_damage_is_said(
    pong_store, repo: Path, home: Path, where: str
) -> None:
    """A kept object whose chunk fails its crc32c is thrown away and fetched once more
    (the rows come back exact); where the Hub's own copy fails too, the error says so."""
    local = AtariZarrDataset(pong_store.url)
    key = "Pong/1.zarr/observation/c/0/0/0"
    with HubEmulator({"org/atari": repo}) as hub:
        AtariZarrDataset(URL, storage_options=hub.storage_options())[0:40]
        [kept] = [p for p in (home / "objects").rglob("observation/c/0/0/0") if p.is_file()]
        # in the shard's index, or in a chunk's bytes: a crc32c fails
        at = 100 if where == "index" else kept.stat().st_size // 2
        _flip(kept, at)
        before = [p for _, p, _ in hub.log].count(
            f"/datasets/org/atari/resolve/{hub.sha['org/atari']}/{key}"
        )
        again = AtariZarrDataset(URL, storage_options=hub.storage_options())
        _same(again[:], local[:])
        resolves = [p for _, p, _ in hub.log].count(
            f"/datasets/org/atari/resolve/{hub.sha['org/atari']}/{key}"
        )
        assert resolves == before + 1
        # the Hub's own copy damaged (its checksum the damaged bytes'): said, once fetched anew
        _flip(repo / key, at)
        _flip(kept, at)
        with pytest.raises(StoreCorruptError) as err:
            AtariZarrDataset(URL, storage_options=hub.storage_options())[:]
    message = str(err.value)
    assert "fetched again from the Hub" in message and "\n" not in message
    assert "hf://datasets/org/atari/Pong/1.zarr" in message


@pytest.mark.parametrize("how", ["random", "stream"])
def test_a_kept_object_damaged_in_many_chunks_is_fetched_again_once(
    pong_store, repo: Path, home: Path, how: str
) -> None:
    """Most of a kept frame shard zeroed: the batch's chunks of it all fail, and the
    object is fetched again once for them all (not once per damaged chunk); exact."""
    local = AtariZarrDataset(pong_store.url)
    key = "Pong/1.zarr/observation/c/0/0/0"
    with HubEmulator({"org/atari": repo}) as hub:
        path = f"/datasets/org/atari/resolve/{hub.sha['org/atari']}/{key}"
        AtariZarrDataset(URL, storage_options=hub.storage_options())[:]
        [kept] = [p for p in (home / "objects").rglob("observation/c/0/0/0") if p.is_file()]
        data = bytearray(kept.read_bytes())
        data[len(data) // 10 : len(data) * 8 // 10] = bytes(len(data) * 8 // 10 - len(data) // 10)
        kept.write_bytes(bytes(data))
        before = [p for _, p, _ in hub.log].count(path)
        remote = AtariZarrDataset(URL, storage_options=hub.storage_options())
        if how == "random":
            _same(remote[:], local[:])
        else:
            got = list(remote.stream(64, seed=1, unit_rows=128))
            want = list(local.stream(64, seed=1, unit_rows=128))
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                _same(g, w)
        assert [p for _, p, _ in hub.log].count(path) == before + 1


def test_a_damaged_kept_metadata_object_is_fetched_again(
    pong_store, repo: Path, home: Path
) -> None:
    """The kept copy of a store's ``zarr.json`` spoiled on disk: thrown away and fetched
    once more, the store read exact (never "convert the source again" for every later
    run); where the Hub's own copy fails too, the error says so."""
    from atari_zarr.errors import StoreFormatError

    key = "Pong/1.zarr/zarr.json"
    with HubEmulator({"org/atari": repo}) as hub:
        path = f"/datasets/org/atari/resolve/{hub.sha['org/atari']}/{key}"
        AtariZarrDataset(URL, storage_options=hub.storage_options())[0:8]
        [kept] = [p for p in (home / "objects").rglob("1.zarr/zarr.json") if p.is_file()]
        _flip(kept, kept.stat().st_size // 2)
        before = [p for _, p, _ in hub.log].count(path)
        _same(
            AtariZarrDataset(URL, storage_options=hub.storage_options())[:],
            AtariZarrDataset(pong_store.url)[:],
        )
        assert [p for _, p, _ in hub.log].count(path) == before + 1
        _flip(repo / key, 0)
        _flip(kept, 0)
        with pytest.raises(StoreFormatError) as err:
            AtariZarrDataset(URL, storage_options=hub.storage_options())
    message = str(err.value)
    assert "fetched again from the Hub" in message and "\n" not in message


def test_a_crafted_shard_index_from_a_hub_repo_is_damage_named_in_one_line(
    pong_store, repo: Path, home: Path
) -> None:
    """A repo's shard index crafted with an entry ``(2**64 - 50, 60)`` (valid crc32c,
    fingerprints recorded again): the kept object is never read at an offset ``pread``
    cannot take (a raw ``OverflowError``); reads and ``verify`` say in one line that the
    chunk in that object is cut short."""
    from atari_zarr_testkit import craft_index_entry

    from atari_zarr.errors import StoreCorruptError
    from atari_zarr.verify import verify_store

    craft_index_entry(repo / "Pong" / "1.zarr", "observation", 0, 3, (2**64 - 50, 60))
    with HubEmulator({"org/atari": repo}) as hub:
        options = hub.storage_options()
        ds = AtariZarrDataset(URL, storage_options=options)
        for read in (lambda: ds[np.arange(40, 70)], lambda: list(ds.stream(64, seed=1))):
            with pytest.raises(StoreCorruptError) as err:
                read()
            text = str(err.value)
            assert "\n" not in text and "'observation/c/0/0/0'" in text, text
            assert "is cut short" in text and "is damaged" in text, text
        report = verify_store(URL, storage_options=options).format()
        assert "rows [48]" in report and "is cut short" in report, report
