"""Dataset ids to stores: the cache, mirrors, and pulls from RL Unplugged's public copy.

The public copy is fake-gcs-server holding ``rl_unplugged/atari_episodes_ordered`` with
the public layout's object names (``public_copy`` in conftest.py); the code's default
source URL is the public one, and only ``STORAGE_EMULATOR_HOST`` (the variable gcsfs
honours) sends it to the emulator, through a proxy that counts what is fetched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import store_files
from atari_zarr_testkit.pause import pause_command
from atari_zarr_testkit.ports import fresh_port
from atari_zarr_testkit.rl_unplugged import read_shard_records

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import (
    InvalidArgumentError,
    RemoteAccessError,
    SourceFormatError,
    SourceNotFoundError,
    StoreNotFoundError,
    StoreWriteError,
)
from atari_zarr.layout import ARRAYS, ATTRS_KEY, store_path
from atari_zarr.pull import (
    GAMES,
    Request,
    available,
    game_name,
    mirror_roots,
    pull,
    resolve,
)
from atari_zarr.subsets import Subset

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

#: A fraction whose count (400 rows) is a prefix of two or three Asterix episodes.
FRACTION = 0.0004


def shard_bytes(proxy, run: str = "run_1-") -> int:
    """Response bytes of the shard objects' content fetched through the proxy (not of
    their metadata, which each read asks to check the object is the one listed)."""
    return sum(
        n
        for method, path, _, n in proxy.log
        if method == "GET" and run in path and "alt=media" in path
    )


def compressed_prefix(path: str, records: int) -> int:
    """Compressed bytes of ``path`` that hold its first ``records`` records (to 1 KB)."""
    need = sum(12 + len(r) + 4 for r in read_shard_records(path)[:records])
    raw = Path(path).read_bytes()
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = 0
    for at in range(0, len(raw), 1024):
        out += len(inflate.decompress(raw[at : at + 1024]))
        if out >= need:
            return min(at + 1024, len(raw))
    return len(raw)


def records_for(fixture, shard: int, rows: int) -> int:
    """Records of a shard that the played-order prefix of ``rows`` rows reads."""
    total = 0
    for k, episode in enumerate(fixture.episodes_of(shard)):
        total += episode.real_steps
        if total >= rows:
            return k + 1
    return len(fixture.episodes_of(shard))


def arrays_of(url: str) -> dict[str, np.ndarray]:
    group = zarr.open_group(url, mode="r")
    return {name: group[name][...] for name in ARRAYS}


# -- ids ---------------------------------------------------------------------------------
def test_ids_as_the_loaders_spell_them():
    assert game_name("space_invaders") == game_name("space-invaders") == "SpaceInvaders"
    assert game_name("up_n_down") == "UpNDown" and game_name("pong") == "Pong"
    r = Request.parse("Pong/5")
    assert (r.game, r.run, r.whole, r.label) == ("Pong", "5", True, "")
    r = Request.parse("breakout", run=3, fraction=0.01)
    assert r.dataset_id == "Breakout/3" and r.label == "fraction-0.01-played"
    assert r.command() == "atari-zarr pull Breakout/3 --fraction 0.01"
    r = Request.parse("Pong/1", fraction=0.1, order="random", seed=2)
    assert r.label == "fraction-0.1-seed2"
    assert r.command() == (
        "atari-zarr pull Pong/1 --fraction 0.1 --fraction-order random --subset-seed 2"
    )
    # two fractions that print alike under :g never share a cache path
    near = [Request.parse("Pong/1", fraction=f) for f in (0.0001, 0.00009999999)]
    assert [n.label for n in near] == ["fraction-0.0001-played", "fraction-9.999999e-05-played"]
    assert near[0].root("/h") != near[1].root("/h")
    assert near[1].command().endswith("--fraction 9.999999e-05")
    r = Request.parse("Pong/1", checkpoints="0-2,9")
    assert r.checkpoints == (0, 1, 2, 9) and r.label == "checkpoints-0-2,9"
    dt = Request.parse("Pong", subset=Subset.decision_transformer(4, 1000, 2, seed=123))
    assert dt.label == "dt-4-1000-2-seed123"
    assert dt.source_checkpoints() == (46, 47, 48, 49)  # the last num_buffers shards only
    assert len(GAMES) == 46 and {g.shards for g in GAMES.values()} == {49, 50}
    assert [g for g, v in GAMES.items() if v.shards == 49] == ["Carnival", "Gravitar", "StarGunner"]
    assert mirror_roots(" gs://a/x/ ,, /data ") == ["gs://a/x", "/data"]


@pytest.mark.parametrize(
    "bad", ["Pong/", "/5", "Pong/x", "Pong/0", "Pong/1/2", ("Pong/1", {"checkpoints": "a"})]
)
def test_malformed_ids_are_one_line(bad):
    text, kwargs = (bad, {}) if isinstance(bad, str) else bad
    with pytest.raises(InvalidArgumentError) as info:
        Request.parse(text, **kwargs)
    assert "\n" not in str(info.value)


def test_what_cannot_be_pulled_is_refused_before_any_request(public_copy, tmp_path):
    with pytest.raises(StoreNotFoundError, match="Pongg is not a game of RL Unplugged.*Pong"):
        pull(Request.parse("pongg/1"), home=tmp_path)
    with pytest.raises(StoreNotFoundError, match="runs 1 to 5 of Pong, not 6"):
        pull(Request.parse("Pong/6"), home=tmp_path)
    with pytest.raises(InvalidArgumentError, match="has 50 checkpoints"):
        pull(Request.parse("Pong/1", checkpoints=[50]), home=tmp_path)
    assert public_copy.proxy.requests == 0


# -- pulls -------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_fraction_fetches_only_a_prefix_of_each_shard_once(public_copy, tmp_path):
    """d3rlpy's 1% rule in the order played: every shard is read only as far as the
    fraction's count, each byte once; the store equals a conversion of the whole files
    with the same rule; a second call fetches nothing."""
    proxy = public_copy.proxy
    fixture = public_copy.runs["Asterix/1"]
    request = Request.parse("Asterix/1", fraction=FRACTION)
    found = resolve(request, scheduler="threads", workers=2)
    assert found.origin == "pulled" and found.exact
    assert found.url == str(
        tmp_path / "home" / "subsets" / "fraction-0.0004-played" / "Asterix" / "1.zarr"
    )
    rows = int(FRACTION * 1_000_000)
    needed = {
        i: compressed_prefix(p, records_for(fixture, i, rows)) for i, p in fixture.paths.items()
    }
    got = {i: shard_bytes(proxy, f"run_1-{i:05d}-of-00050") for i in public_copy.bytes["Asterix/1"]}
    for i, n in got.items():
        # read once, and no further than the prefix and one read-ahead block past it
        assert needed[i] <= n <= needed[i] + (256 << 10) + 2048, (i, n, needed[i])
    big = (0, 1, 2)  # the shards of several episodes: only their prefix is read
    assert sum(got[i] for i in big) < 0.75 * sum(public_copy.bytes["Asterix/1"][i] for i in big)
    # the same rows as the whole files converted with the same rule
    [local] = convert(
        fixture.game_dir,
        str(tmp_path / "local"),
        subset=Subset.fraction_of(FRACTION, order="played"),
        scheduler="synchronous",
        progress=False,
    )
    ours, theirs = arrays_of(found.url), arrays_of(local.url)
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    # the fraction's count of every checkpoint, or all of a shorter one
    shard_rows = [sum(e.real_steps for e in fixture.episodes_of(i)) for i in fixture.paths]
    assert len(fixture.paths) == 50
    assert len(AtariZarrDataset(found.url)) == sum(min(rows, n) for n in shard_rows)
    proxy.reset()
    again = resolve(request)
    assert again.origin == "cache" and again.url == found.url and proxy.requests == 0


@pytest.mark.slow
def test_one_whole_checkpoint_is_one_shard_fetched_once(public_copy):
    proxy = public_copy.proxy
    found = resolve(Request.parse("Asterix/1", checkpoints=[1]), scheduler="synchronous")
    shard = public_copy.bytes["Asterix/1"][1]
    assert shard_bytes(proxy, "run_1-00001-of-00050") == shard  # streamed once, not twice
    assert shard_bytes(proxy, "run_1-00000") == shard_bytes(proxy, "run_1-00002") == 0
    meta = zarr.open_group(found.url, mode="r").attrs[ATTRS_KEY]
    assert [s["shard"] for s in meta["conversion"]["shards"]] == [1]
    assert meta["source"]["url"] == "gs://rl_unplugged/atari_episodes_ordered/Asterix"


@pytest.mark.slow
def test_download_false_never_touches_the_network(public_copy):
    request = Request.parse("Asterix/1", fraction=FRACTION)
    with pytest.raises(StoreNotFoundError) as info:
        resolve(request, download=False, mirrors="gs://elsewhere/atari")
    text = str(info.value)
    assert "\n" not in text and "download=False" in text
    assert "`atari-zarr pull Asterix/1 --fraction 0.0004`" in text
    assert public_copy.proxy.requests == 0


@pytest.mark.slow
def test_force_fetches_again_and_a_whole_run_in_the_cache_serves_parts(public_copy, tmp_path):
    proxy = public_copy.proxy
    whole = resolve(Request.parse("Asterix/1"), scheduler="synchronous")
    assert whole.origin == "pulled"
    total = sum(public_copy.bytes["Asterix/1"].values())
    assert shard_bytes(proxy) == total
    proxy.reset()
    part = resolve(Request.parse("Asterix/1", fraction=FRACTION), download=False)
    assert (part.origin, part.url, part.exact) == ("cache", whole.url, False)
    assert proxy.requests == 0
    again = resolve(Request.parse("Asterix/1"), download="force", scheduler="synchronous")
    assert again.origin == "pulled" and shard_bytes(proxy) == total


@pytest.mark.slow
def test_mirrors_are_read_in_place(public_copy, tmp_path, pong_store):
    """A mirror with a catalog.json answers with one request and is never copied."""
    import gcsfs

    from atari_zarr.catalog import write_catalog

    server = public_copy.server
    server.create_bucket("mirror")
    options = server.storage_options()
    root = "gs://mirror/atari"
    fs = gcsfs.GCSFileSystem(**options)
    fs.put(pong_store.url, "mirror/atari/Pong/1.zarr", recursive=True)
    write_catalog(root, options)
    found = resolve(Request.parse("Pong/1"), mirrors=["/nonexistent", root], mirror_options=options)
    assert (found.origin, found.url, found.entry is not None) == (
        "mirror",
        "gs://mirror/atari/Pong/1.zarr",
        True,
    )
    assert not (tmp_path / "home").exists()  # nothing copied into the cache
    ds = AtariZarrDataset(found.url, storage_options=found.storage_options)
    assert len(ds) == len(AtariZarrDataset(pong_store.url))
    # a part of the run: the mirror's whole run, of which the reader takes the part
    part = resolve(Request.parse("pong", fraction=0.5), mirrors=root, mirror_options=options)
    assert part.url == found.url and not part.exact
    # download=False skips mirrors over a network
    with pytest.raises(StoreNotFoundError):
        resolve(Request.parse("Pong/1"), mirrors=root, mirror_options=options, download=False)
    # from the environment, the same
    os.environ["ATARI_ZARR_MIRRORS"] = root
    try:
        assert resolve(Request.parse("Pong/1"), mirror_options=options).origin == "mirror"
    finally:
        del os.environ["ATARI_ZARR_MIRRORS"]


def test_offline_is_one_line_naming_the_url_and_what_to_do(public_copy, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{fresh_port()}")
    start = time.monotonic()
    with pytest.raises(RemoteAccessError) as info:
        resolve(Request.parse("Asterix/1"), scheduler="synchronous", timeout=3)
    assert time.monotonic() - start < 30
    text = str(info.value)
    assert "\n" not in text
    assert "gs://rl_unplugged/atari_episodes_ordered/Asterix" in text
    assert "root=" in text and "mirror" in text and "atari-zarr pull Asterix/1" in text


@pytest.mark.slow
def test_a_corrupt_shard_names_shard_and_record_and_nothing_is_complete(
    public_copy, tmp_path, monkeypatch
):
    """A damaged record: one line naming the shard and the record; the store in the cache
    stays unfinished (never complete); once the shard is whole again, the pull resumes."""
    import gcsfs
    from atari_zarr_testkit.rl_unplugged import corrupt_record_byte

    from atari_zarr.catalog import store_state

    server = public_copy.server
    server.create_bucket("broken")
    fs = gcsfs.GCSFileSystem(**server.storage_options())
    fixture = public_copy.runs["Asterix/1"]
    bad = tmp_path / "bad"
    bad.write_bytes(Path(fixture.paths[1]).read_bytes())
    corrupt_record_byte(bad, 1)
    for i, path in fixture.paths.items():
        fs.put_file(str(bad) if i == 1 else path, f"broken/rlu/Asterix/{Path(path).name}")
    request = Request.parse("Asterix/1")
    with pytest.raises(SourceFormatError) as info:
        pull(request, source="gs://broken/rlu", scheduler="synchronous", progress=False)
    text = str(info.value)
    assert "\n" not in text and "run_1-00001-of-00050" in text and "record 1" in text
    url = str(tmp_path / "home" / "Asterix" / "1.zarr")
    assert store_state(url) != "complete"
    with pytest.raises(StoreNotFoundError):  # an unfinished store is never served
        resolve(request, download=False)
    fs.put_file(fixture.paths[1], f"broken/rlu/Asterix/{Path(fixture.paths[1]).name}")
    fs.invalidate_cache()
    done = pull(request, source="gs://broken/rlu", scheduler="synchronous", progress=False)
    assert store_state(done.url) == "complete"


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_same_pull_resumes(public_copy, tmp_path):
    from atari_zarr_testkit.faults import full_disk_after

    request = Request.parse("Asterix/1")
    with full_disk_after(2), pytest.raises(StoreWriteError) as info:
        pull(request, scheduler="synchronous", progress=False)
    text = str(info.value)
    assert "\n" not in text and "the disk is full" in text and "Asterix/1.zarr" in text
    done = pull(request, scheduler="synchronous", progress=False)
    clean = pull(request, home=tmp_path / "clean", scheduler="synchronous", progress=False)
    assert store_files(done.url, tmp_path / "home") == store_files(clean.url, tmp_path / "clean")


# -- several processes -------------------------------------------------------------------
PULL_SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from atari_zarr.pull import Request, resolve
found = resolve(Request.parse(sys.argv[1]), scheduler="synchronous")
print(found.origin, found.url, flush=True)
"""


def _spawn(script: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _reap(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


@pytest.mark.slow
def test_two_processes_pulling_one_id_convert_it_once(public_copy):
    """The second waits for the first, says so, and reads what the first converted: each
    shard is fetched once in all."""
    # every request takes a quarter second (a run is some 50 requests): whichever process
    # takes the work area first is still converting when the other asks, however fast
    # this machine imports and plans
    public_copy.proxy.delay = 0.25
    procs = [_spawn(PULL_SCRIPT, "Asterix/1")]
    time.sleep(0.2)
    procs.append(_spawn(PULL_SCRIPT, "Asterix/1"))
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        _reap(*procs)
    assert [p.returncode for p in procs] == [0, 0], outs
    origins = sorted(out.split()[0] for out, _ in outs)
    assert origins == ["cache", "pulled"], outs
    assert len({out.split()[1] for out, _ in outs}) == 1
    waiter = next(err for out, err in outs if out.startswith("cache"))
    assert "is being pulled into" in waiter and "waiting for it to finish" in waiter, outs
    assert shard_bytes(public_copy.proxy) == sum(public_copy.bytes["Asterix/1"].values())


@pytest.mark.slow
def test_ranks_other_than_0_wait_for_rank_0(public_copy):
    """RANK=1 never pulls: it waits until rank 0's pull is complete, and says so."""
    follower = _spawn(PULL_SCRIPT, "Asterix/1", env={"RANK": "1"})
    try:
        time.sleep(3.0)
        assert follower.poll() is None  # still waiting
        assert public_copy.proxy.requests == 0  # and fetched nothing
        leader = resolve(Request.parse("Asterix/1"), scheduler="synchronous")
        out, err = follower.communicate(timeout=120)
    finally:
        _reap(follower)
    assert follower.returncode == 0, err
    assert out.split() == ["cache", leader.url]
    assert "rank 1 ($RANK) waits for rank 0" in err
    assert shard_bytes(public_copy.proxy) == sum(public_copy.bytes["Asterix/1"].values())


@pytest.mark.slow
def test_a_rank_whose_rank_0_never_pulls_gives_up_in_one_line(public_copy):
    """Nobody pulls: rank 1 waits no longer than the timeout, then says why and what to do."""
    follower = _spawn(PULL_SCRIPT, "Asterix/1", env={"RANK": "1", "ATARI_ZARR_TIMEOUT": "2"})
    try:
        out, err = follower.communicate(timeout=300)
    finally:
        _reap(follower)
    assert follower.returncode != 0 and out == ""
    line = err.strip().splitlines()[-1]
    assert "rank 1 ($RANK) waited 2 s for rank 0" in line, err
    assert "no process is pulling it" in line and "atari-zarr pull Asterix/1" in line
    assert public_copy.proxy.requests == 0


class _Who:
    """A dataset whose one item is who the worker reading it is, to ``pull``."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        from atari_zarr.pull.fetch import _follower

        return _follower()


def _first(items):
    return items[0]


def test_dataloader_workers_never_pull():
    import torch

    from atari_zarr.pull.fetch import _follower

    loader = torch.utils.data.DataLoader(_Who(), num_workers=1, collate_fn=_first)
    assert next(iter(loader)) == "DataLoader worker 0"
    assert _follower() is None


def _pull_killed_midway(tmp_path, *args: str, env: dict | None = None) -> None:
    """``atari-zarr pull ARGS``, killed with ``kill -9`` once its first shard is written."""
    proc = subprocess.Popen(
        [
            *pause_command(tmp_path, "-shard-", 1),
            "pull",
            *args,
            "--scheduler",
            "synchronous",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stdout.readline() == "paused\n", proc.stderr.read()
        proc.kill()
        proc.wait(timeout=60)
    finally:
        _reap(proc)


@pytest.mark.slow
def test_kill_9_during_a_pull_then_the_same_pull_resumes_to_the_same_store(public_copy, tmp_path):
    home = tmp_path / "home"
    _pull_killed_midway(tmp_path, "Asterix/1")
    url = home / "Asterix" / "1.zarr"
    assert not zarr.open_group(str(url), mode="r").attrs[ATTRS_KEY].get("complete")
    done = pull(Request.parse("Asterix/1"), scheduler="synchronous", progress=False)
    clean = pull(
        Request.parse("Asterix/1"), home=tmp_path / "clean", scheduler="synchronous", progress=False
    )
    assert store_files(done.url, home) == store_files(clean.url, tmp_path / "clean")


# -- what can be pulled ------------------------------------------------------------------
def test_available_lists_every_run_with_sizes_where_known(public_copy, tmp_path):
    rows = available(source_sizes=True)
    assert len(rows) == 230
    by_id = {r["id"]: r for r in rows}
    assert by_id["Pong/1"]["gib"] == 21.0 and by_id["Gravitar/3"]["shards"] == 49
    listed = by_id["Asterix/1"]["source_bytes"]
    assert listed == sum(public_copy.bytes["Asterix/1"].values())
    assert by_id["Pong/4"]["source_bytes"] == sum(public_copy.bytes["Pong/4"].values())
    assert not any(r["cached"] for r in rows)


@pytest.mark.slow
def test_a_pull_spreads_its_shards_over_a_dask_cluster(public_copy, tmp_path):
    """``scheduler=`` a dask.distributed address: the shard tasks run in the cluster's
    workers (which reach the source and the cache under the same names), and the store
    is the one a local pull writes."""
    pytest.importorskip("distributed")
    from atari_zarr_testkit.cluster import local_cluster

    request = Request.parse("Asterix/1")
    with local_cluster(2) as (cluster, client):
        found = pull(request, scheduler=cluster.scheduler_address, progress=False)
        pids = client.run(os.getpid)
    assert os.getpid() not in pids.values() and len(pids) == 2
    local = pull(request, home=tmp_path / "local", scheduler="synchronous", progress=False)
    assert store_files(found.url, tmp_path / "home") == store_files(local.url, tmp_path / "local")


# -- what a hostile user tried (each refused or bounded, in one line) --------------------
def test_a_run_missing_a_shard_is_refused_naming_it_before_any_fetch(public_copy, tmp_path):
    """The table knows a run's shard count: a whole run whose source lacks a shard fails
    in one line naming the missing object, fetches no shard and leaves nothing complete;
    the shards that are there can still be pulled by name."""
    import gcsfs

    from atari_zarr.catalog import store_state
    from atari_zarr.errors import SourceNotFoundError

    server = public_copy.server
    server.create_bucket("gappy")
    fs = gcsfs.GCSFileSystem(**server.storage_options())
    fixture = public_copy.runs["Asterix/1"]
    for i, path in fixture.paths.items():
        if i != 3:
            fs.put_file(path, f"gappy/rlu/Asterix/{Path(path).name}")
    texts = []
    for request in (Request.parse("Asterix/1"), Request.parse("Asterix/1", fraction=FRACTION)):
        public_copy.proxy.reset()
        with pytest.raises(SourceNotFoundError) as info:
            pull(request, source="gs://gappy/rlu", scheduler="synchronous", progress=False)
        text = str(info.value)
        assert "\n" not in text
        assert "gs://gappy/rlu/Asterix/run_1-00003-of-00050" in text, text
        assert "never stored as the run" in text
        assert shard_bytes(public_copy.proxy) == 0  # listed, nothing fetched
        url = store_path(request.root(str(tmp_path / "home")), "Asterix", "1")
        assert store_state(url) != "complete"
        texts.append(text)
    # the whole run's error names the pull of the shards that are there
    assert "`atari-zarr pull Asterix/1 --checkpoints 0-2,4-49`" in texts[0], texts[0]
    part = pull(
        Request.parse("Asterix/1", checkpoints=[4]),
        source="gs://gappy/rlu",
        scheduler="synchronous",
        progress=False,
    )
    assert store_state(part.url) == "complete"


def test_a_fraction_of_no_rows_is_refused_before_any_request(public_copy):
    for call in (
        lambda: Request.parse("Pong/1", fraction=1e-9),
        lambda: Subset.fraction_of(0.01, checkpoint_rows=64, where="Pong/1"),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            call()
        text = str(info.value)
        assert "\n" not in text and "0 transitions" in text and "Pong/1" in text
    assert public_copy.proxy.requests == 0


def test_huge_checkpoint_ranges_are_refused_before_they_are_spelled_out():
    for dataset_id in ("Pong/1", "NotAGame/1"):
        with pytest.raises(InvalidArgumentError) as info:
            Request.parse(dataset_id, checkpoints="0-100000000000")
        assert "\n" not in str(info.value) and "100000000000" in str(info.value)
    with pytest.raises(InvalidArgumentError, match="50 checkpoints"):
        Request.parse("Pong/1", checkpoints="3-50")
    with pytest.raises(InvalidArgumentError):
        Request.parse("Pong/1", checkpoints="5-3")


def test_every_checkpoint_is_the_whole_run():
    assert Request.parse("Asterix/1", checkpoints="0-49") == Request.parse("Asterix/1")
    assert Request.parse("Gravitar/1", checkpoints=range(49)).whole  # 49 shards
    assert not Request.parse("Asterix/1", checkpoints="0-48").whole


def test_a_tilde_is_the_home_directory(public_copy, tmp_path, monkeypatch):
    from atari_zarr.pull import cache_home

    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATARI_ZARR_HOME", "~/az")
    assert cache_home() == str(tmp_path / "user" / "az")
    assert cache_home("~/other") == str(tmp_path / "user" / "other")
    # a blank home is not given, as a blank $ATARI_ZARR_HOME is: never the working directory
    assert cache_home("") == cache_home("  ") == cache_home(None) == str(tmp_path / "user" / "az")
    monkeypatch.setenv("ATARI_ZARR_HOME", " ")
    assert cache_home("") == str(tmp_path / "user" / ".cache" / "atari_zarr")
    monkeypatch.setenv("ATARI_ZARR_HOME", "~/az")
    found = resolve(Request.parse("Asterix/1", checkpoints=[1]), scheduler="synchronous")
    assert found.url.startswith(str(tmp_path / "user" / "az"))
    assert not (tmp_path / "~").exists()
    again = resolve(Request.parse("Asterix/1", checkpoints=[1]), home="~/az", download=False)
    assert again.url == found.url


def test_download_false_never_advises_pulling_what_does_not_exist(tmp_path):
    with pytest.raises(StoreNotFoundError) as info:
        resolve(Request.parse("pong", run=6), home=tmp_path, download=False)
    text = str(info.value)
    assert "\n" not in text and "runs 1 to 5" in text and "atari-zarr pull" not in text


@pytest.mark.slow
def test_the_timeout_of_the_environment_bounds_the_drop_ins(public_copy, monkeypatch):
    """``$ATARI_ZARR_TIMEOUT`` is what ``timeout="default"`` means, for the drop-ins too;
    and they take ``timeout=``."""
    from atari_zarr.compat.decision_transformer import create_dataset
    from atari_zarr.errors import RemoteTimeoutError

    public_copy.proxy.delay = 20.0  # every request held far past the deadline
    monkeypatch.setenv("ATARI_ZARR_TIMEOUT", "2")
    start = time.monotonic()
    with pytest.raises(RemoteTimeoutError) as info:
        create_dataset(2, 300, "Breakout", None, 2)
    assert "within 2 s" in str(info.value)
    monkeypatch.delenv("ATARI_ZARR_TIMEOUT")
    with pytest.raises(RemoteTimeoutError) as info:
        create_dataset(2, 300, "Breakout", None, 2, timeout=1.5)
    assert "within 1.5 s" in str(info.value)
    assert time.monotonic() - start < 20  # neither waited for a held request
    public_copy.proxy.delay = 0.0


@pytest.mark.slow
def test_every_checkpoint_asked_is_the_cached_run_and_a_pull_keeps_the_catalog(
    public_copy, tmp_path, pong_store
):
    """Asked as every checkpoint, the whole run in the cache answers (nothing fetched);
    a pull into a cache someone indexed rewrites its catalog, which then lists it."""
    import shutil

    from atari_zarr.catalog import complete_stores, read_catalog, write_catalog

    home = tmp_path / "home"
    shutil.copytree(pong_store.url, home / "Pong" / "1.zarr")
    write_catalog(str(home))
    whole = resolve(Request.parse("Asterix/1"), scheduler="synchronous")
    assert whole.origin == "pulled"
    doc = read_catalog(str(home))
    assert doc is not None
    assert sorted(e["path"] for e in doc["stores"]) == ["Asterix/1.zarr", "Pong/1.zarr"]
    assert complete_stores(str(home)) == ["Asterix/1", "Pong/1"]
    public_copy.proxy.reset()
    again = resolve(Request.parse("Asterix/1", checkpoints="0-49"))
    assert (again.origin, again.url, again.exact) == ("cache", whole.url, True)
    assert public_copy.proxy.requests == 0


@pytest.mark.slow
def test_a_shard_republished_with_the_same_size_is_not_mixed_into_a_resumed_pull(
    public_copy, tmp_path
):
    """The scan's fingerprint holds each object's generation: a pull killed midway, whose
    shard is then uploaded again (same name, same size), starts over instead of mixing."""
    import gcsfs

    from atari_zarr.sources.rl_unplugged.files import RluRun

    server = public_copy.server
    server.create_bucket("repub")
    fs = gcsfs.GCSFileSystem(**server.storage_options())
    fixture = public_copy.runs["Asterix/1"]
    for i in (0, 1):
        fs.put_file(fixture.paths[i], f"repub/rlu/Asterix/{Path(fixture.paths[i]).name}")
    options = server.storage_options()
    before = RluRun("gs://repub/rlu/Asterix", "Asterix", "1", options).names()
    home = tmp_path / "home"
    _pull_killed_midway(
        tmp_path,
        "Asterix/1",
        "--checkpoints",
        "0-1",
        "--source",
        "gs://repub/rlu",
        env={"STORAGE_EMULATOR_HOST": server.endpoint_url},
    )
    name = Path(fixture.paths[1]).name
    fs.put_file(fixture.paths[1], f"repub/rlu/Asterix/{name}")  # republished: same bytes
    fs.invalidate_cache()
    after = RluRun("gs://repub/rlu/Asterix", "Asterix", "1", options).names()
    assert [(n, s) for n, s, _ in before] == [(n, s) for n, s, _ in after]  # names, sizes
    assert before[1][2] != after[1][2]  # the generation tells them apart
    request = Request.parse("Asterix/1", checkpoints="0-1")
    done = pull(
        request,
        source="gs://repub/rlu",
        source_options=options,
        progress=False,
        scheduler="synchronous",
    )
    clean = pull(
        request,
        home=tmp_path / "clean",
        source="gs://repub/rlu",
        source_options=options,
        progress=False,
        scheduler="synchronous",
    )
    assert store_files(done.url, home) == store_files(clean.url, tmp_path / "clean")


def test_an_unreachable_http_source_is_unreachable_not_absent(tmp_path):
    """Cloud Storage's anonymous token is for gs:// sources only; an http(s) source
    that does not answer is named as unreachable, never as missing."""
    from atari_zarr.errors import RemoteAccessError

    url = f"http://127.0.0.1:{fresh_port()}/rlu"
    with pytest.raises(RemoteAccessError) as info:
        pull(
            Request.parse("Pong/1", checkpoints=[0]),
            source=url,
            home=tmp_path,
            timeout=5,
            progress=False,
        )
    text = str(info.value)
    assert "\n" not in text and f"{url}/Pong" in text
    assert "Cannot connect" in text and "does not exist" not in text and "token" not in text


DISTRIBUTED_FOLLOWER = """
import os, sys, torch.distributed as dist
from atari_zarr.errors import AtariZarrError
from atari_zarr.pull import Request, resolve
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=rank, world_size=2)
if rank == 1:  # rank 0 never pulls
    try:
        resolve(Request.parse("Asterix/1"), scheduler="synchronous")
    except AtariZarrError as exc:
        print(exc)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_rank_of_torch_distributed_waits_for_rank_0_and_no_longer(public_copy, tmp_path):
    """With torch.distributed initialised (and no RANK variable), its rank decides who
    pulls: rank 1 waits, gives up in one line, and fetched nothing."""
    env = {"ATARI_ZARR_TIMEOUT": "2"}
    store = str(tmp_path / "rendezvous")
    procs = [_spawn(DISTRIBUTED_FOLLOWER, str(r), store, env=env) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        _reap(*procs)
    assert [p.returncode for p in procs] == [0, 0], outs
    line = outs[1][0].strip()
    assert "rank 1 (torch.distributed) waited 2 s for rank 0" in line, outs
    assert public_copy.proxy.requests == 0


@pytest.mark.parametrize("password", ["pw-Home81secret", "pw-Ho@me81secret"])
def test_a_home_bucket_that_does_not_exist_is_one_line_without_its_password(
    public_copy, capsys, password: str
):
    """``--home gs://user:PW@missing-bucket/x`` ended in gcsfs's traceback (120 lines, the
    password percent-encoded in the upload URL): it is one line naming the home. A raw
    ``@`` in the password printed the part after it."""
    from atari_zarr.cli import main

    home = f"gs://user:{password}@missing-bucket/x"
    code = main(["pull", "Asterix/1", "--checkpoints", "0", "--no-progress", "--home", home])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "gs://***@missing-bucket/x/" in err and "bucket does not exist" in err
    assert not [piece for piece in password.split("@") if piece in err], err


def _asterix_in_bucket(server, bucket: str, paths) -> Any:
    """Asterix/1's shards at ``paths`` uploaded under ``gs://{bucket}/rlu/Asterix`` with
    their own names: gcsfs on the emulator."""
    import gcsfs

    server.create_bucket(bucket)
    fs = gcsfs.GCSFileSystem(**server.storage_options())
    for path in paths:
        fs.put_file(path, f"{bucket}/rlu/Asterix/{Path(path).name}")
    return fs


def _pull_from_bucket(server, bucket: str, request: Request, home: Path):
    """``pull`` of ``request`` from ``gs://{bucket}/rlu`` into ``home``, on one thread."""
    return pull(
        request,
        home=home,
        source=f"gs://{bucket}/rlu",
        source_options=server.storage_options(),
        progress=False,
        scheduler="synchronous",
    )


def _once_a_shard_is_scanned(act) -> Any:
    """A dask callback calling ``act(other)`` once, when the first of shards 0 and 1 is
    scanned, with the index of the other one (not scanned yet)."""
    from dask.callbacks import Callback

    done: list[int] = []

    class Once(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if "-scan-" in str(key) and not done:
                done.append(1 - int(str(key).rsplit("-", 1)[1]))
                act(done[0])

    return Once()


def test_a_shard_deleted_after_the_listing_is_one_line_naming_it(public_copy, tmp_path):
    """A shard that answers 404 when it is fetched, after it was listed, ended in 120 lines
    of traceback with the raw download URL: it is one line naming the shard's URL."""
    server = public_copy.server
    paths = [public_copy.runs["Asterix/1"].paths[i] for i in (0, 1)]
    fs = _asterix_in_bucket(server, "gone", paths)
    gone: list[str] = []

    def delete(other: int) -> None:  # once one shard is scanned, the other goes
        gone.append(Path(paths[other]).name)
        fs.rm(f"gone/rlu/Asterix/{gone[0]}")

    request = Request.parse("Asterix/1", checkpoints="0-1")
    with _once_a_shard_is_scanned(delete), pytest.raises(SourceNotFoundError) as info:
        _pull_from_bucket(server, "gone", request, tmp_path / "home")
    text = str(info.value)
    assert "\n" not in text and f"gs://gone/rlu/Asterix/{gone[0]}" in text, text
    assert "storage/v1" not in text and "download" not in text  # not the raw request URL


def _two_publications(tmp_path, present=(0, 1)):
    """Asterix/1's shards ``present`` as published twice (other episodes, same names)."""
    from atari_zarr_testkit.rl_unplugged import write_fixture_rlu

    return [
        write_fixture_rlu(
            str(tmp_path / name),
            "Asterix",
            1,
            num_shards=50,
            present=present,
            episodes_per_shard={i: 4 for i in present},
            seed=seed,
            cut_length=40,
        )
        for name, seed in (("old", 0), ("new", 9))
    ]


@pytest.mark.slow
def test_a_resumed_pull_from_a_web_server_never_mixes_two_publications(tmp_path):
    """A web server lists shards with neither size nor version: a pull killed midway,
    whose every shard is then replaced, resumed with the old scans and completed a store
    of both publications that `verify` passed. Each shard's Content-Length and
    Last-Modified are asked for, and the resume starts over."""
    import shutil

    from atari_zarr_testkit.web import DirectoryServer

    old, new = _two_publications(tmp_path)
    served = tmp_path / "served" / "Asterix"
    served.mkdir(parents=True)
    for path in old.paths.values():
        shutil.copy(path, served)
    home = tmp_path / "home"
    with DirectoryServer(served.parent) as server:
        source = server.endpoint_url
        _pull_killed_midway(
            tmp_path,
            "Asterix/1",
            "--checkpoints",
            "0-1",
            "--source",
            source,
            env={"ATARI_ZARR_HOME": str(home)},
        )
        later = time.time() + 100  # Last-Modified has whole seconds
        for path in new.paths.values():
            shutil.copy(path, served)
            os.utime(served / Path(path).name, (later, later))
        request = Request.parse("Asterix/1", checkpoints="0-1")
        done = pull(request, home=home, source=source, progress=False, scheduler="synchronous")
        clean = pull(
            request, home=tmp_path / "clean", source=source, progress=False, scheduler="synchronous"
        )
    got, want = arrays_of(done.url), arrays_of(clean.url)
    assert all(np.array_equal(got[name], want[name]) for name in ARRAYS)


def test_a_shard_deleted_between_the_check_and_the_conversion_is_never_served(
    public_copy, tmp_path, monkeypatch
):
    """The conversion listed the run again after the pull's check: a shard deleted in
    between gave a "complete" whole run with ``shards_missing: [7]``. The run checked is
    the run converted, and a shard gone is one line; nothing is complete."""
    from atari_zarr.catalog import store_state
    from atari_zarr.pull import fetch

    server = public_copy.server
    fixture = public_copy.runs["Asterix/1"]
    fs = _asterix_in_bucket(server, "late", fixture.paths.values())
    seventh = f"late/rlu/Asterix/{Path(fixture.paths[7]).name}"
    checked = fetch._check_source

    def check_then_delete(*args, **kwargs):
        run = checked(*args, **kwargs)
        fs.rm(seventh)
        return run

    monkeypatch.setattr(fetch, "_check_source", check_then_delete)
    home = tmp_path / "home"
    with pytest.raises(SourceNotFoundError) as info:
        _pull_from_bucket(server, "late", Request.parse("Asterix/1"), home)
    text = str(info.value)
    assert "\n" not in text and f"gs://{seventh}" in text, text
    assert store_state(str(home / "Asterix" / "1.zarr")) != "complete"


def test_a_shard_replaced_after_the_listing_is_one_line_and_never_mixed(public_copy, tmp_path):
    """A shard replaced after the listing (the same name, other bytes) was read without
    a check, so one pull could mix publications: each read checks the object listed
    (its generation), and a changed one is one line; nothing is complete."""
    from atari_zarr.catalog import store_state
    from atari_zarr.errors import SourceChangedError

    old, new = _two_publications(tmp_path)
    server = public_copy.server
    fs = _asterix_in_bucket(server, "repl", [old.paths[i] for i in (0, 1)])
    replaced: list[str] = []

    def replace(other: int) -> None:  # the same name, the other publication's bytes
        replaced.append(Path(new.paths[other]).name)
        fs.put_file(new.paths[other], f"repl/rlu/Asterix/{replaced[0]}")

    home = tmp_path / "home"
    request = Request.parse("Asterix/1", checkpoints="0-1")
    with _once_a_shard_is_scanned(replace), pytest.raises(SourceChangedError) as info:
        _pull_from_bucket(server, "repl", request, home)
    text = str(info.value)
    assert "\n" not in text and f"gs://repl/rlu/Asterix/{replaced[0]}" in text, text
    assert "changed since the run was listed" in text and "generation" in text
    url = home / "subsets" / "checkpoints-0-1" / "Asterix" / "1.zarr"
    assert store_state(str(url)) != "complete"


def test_a_byte_flipped_in_transit_is_read_again_not_called_damage(public_copy, tmp_path):
    """One byte changed in transit ended with "fetching it again gives the same bytes",
    yet running again succeeded: a shard that fails its checks is read once more (the
    object listed) before it is called damaged."""
    proxy = public_copy.proxy
    request = Request.parse("Asterix/1", checkpoints=[1])
    proxy.corrupt_next(1, path_contains="alt=media")
    done = pull(request, home=tmp_path / "a", progress=False, scheduler="synchronous")
    media = [p for m, p, _, _ in proxy.log if m == "GET" and "alt=media" in p]
    assert len(media) >= 2  # the flipped read, then the read again
    clean = pull(request, home=tmp_path / "b", progress=False, scheduler="synchronous")
    got, want = arrays_of(done.url), arrays_of(clean.url)
    assert all(np.array_equal(got[name], want[name]) for name in ARRAYS)


@pytest.mark.slow
def test_a_stale_catalog_in_the_cache_is_never_trusted_over_the_stores(public_copy, tmp_path):
    """The drop-ins trusted the cache's ``catalog.json``: after its store was deleted they
    said it did not exist instead of pulling it again, and after a killed ``pull --force``
    they advised `atari-zarr convert` instead of resuming, while `ls` called the unfinished
    store complete. Each store's own zarr.json says whether it is there."""
    import shutil

    from atari_zarr.catalog import list_stores, write_catalog

    home = tmp_path / "home"
    first = resolve(Request.parse("Asterix/1"), scheduler="synchronous")
    write_catalog(str(home))
    shutil.rmtree(first.url)  # the cache cleaned by hand; the catalog still lists it
    again = resolve(Request.parse("Asterix/1"), scheduler="synchronous")
    assert (again.origin, again.url) == ("pulled", first.url)
    write_catalog(str(home))
    _pull_killed_midway(tmp_path, "Asterix/1", "--force")
    [row] = [r for r in list_stores(str(home)) if r["game"] == "Asterix"]
    assert row["status"] == "incomplete"
    resumed = resolve(Request.parse("Asterix/1"), scheduler="synchronous")
    assert (resumed.origin, resumed.url) == ("pulled", first.url)
    assert [r["status"] for r in list_stores(str(home))] == ["complete"]


@pytest.mark.slow
def test_pulling_a_part_of_a_cached_whole_run_fetches_nothing(public_copy, tmp_path, capsys):
    """`pull --checkpoints 3` downloaded shard 3 again while the whole run was cached:
    the whole run serves it, as it serves the drop-ins."""
    from atari_zarr.cli import main

    whole = pull(Request.parse("Pong/4"), progress=False, scheduler="synchronous")
    public_copy.proxy.reset()
    assert main(["pull", "Pong/4", "--checkpoints", "3", "-q"]) == 0
    assert f"AtariZarrDataset({whole.url!r})" in capsys.readouterr().out  # rows of it
    assert public_copy.proxy.requests == 0
    part = pull(Request.parse("Pong/4", checkpoints=[3]), progress=False)
    assert (part.url, part.exact) == (whole.url, False)


def test_a_home_that_is_a_file_is_one_line(public_copy, tmp_path):
    """A ``--home`` that is a file was reported as a failed directory creation deep in
    the store: it is one line naming the home, before any request."""
    home = tmp_path / "home-file"
    home.write_text("not a directory")
    with pytest.raises(InvalidArgumentError, match="home-file is a file, not a directory"):
        pull(Request.parse("Pong/4", checkpoints=[0]), home=home, progress=False)
    assert public_copy.proxy.requests == 0


def test_the_rank_wait_advises_the_timeout_that_was_given(public_copy, monkeypatch):
    """A rank given ``timeout=`` (the CLI's ``--timeout``) was told to allow more time with
    ``$ATARI_ZARR_TIMEOUT``, which it did not use: it is told to raise its timeout."""
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(StoreNotFoundError) as info:
        pull(Request.parse("Asterix/1"), progress=False, timeout=1)
    text = str(info.value)
    assert "waited 1 s for rank 0" in text and "a larger timeout (--timeout" in text, text
    assert "ATARI_ZARR_TIMEOUT" not in text


def _opened(line: str) -> Any:
    """What the Python line a pull prints opens (its imports, then its last expression)."""
    *imports, expression = line.split("; ")
    scope: dict[str, Any] = {}
    exec("; ".join(imports), scope)
    return eval(expression, scope)


def test_pull_asks_the_mirrors_of_the_environment_as_the_drop_ins_do(
    public_copy, pong_store, monkeypatch, capsys
):
    """`pull Pong/1` went to the public copy with ``$ATARI_ZARR_MIRRORS`` set, failed
    offline and advised setting that mirror: it resolves as the drop-ins do."""
    from atari_zarr.cli import main

    mirror = str(Path(pong_store.url).parent.parent)
    monkeypatch.setenv("ATARI_ZARR_MIRRORS", mirror)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{fresh_port()}")  # offline
    assert main(["pull", "Pong/1", "--no-progress", "--timeout", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Pong/1 -> {pong_store.url}", out
    assert main(["pull", "Pong/1", "-q"]) == 0
    assert capsys.readouterr().out.strip() == pong_store.url
    assert not (public_copy.proxy.requests or os.path.exists(os.environ["ATARI_ZARR_HOME"]))


@pytest.mark.slow
def test_a_part_served_by_a_cached_whole_run_prints_what_opens_only_the_part(
    public_copy, tmp_path, capsys
):
    """With the whole run cached, `pull --checkpoints 3` printed the whole run's path and
    `AtariZarrDataset(whole)`: every transition of the run. What it prints (with and
    without -q) opens exactly what a pull into an empty home stores, and nothing is fetched."""
    from atari_zarr.cli import main

    whole = pull(Request.parse("Pong/4"), progress=False, scheduler="synchronous")
    for argv, request in (
        (["--checkpoints", "3"], Request.parse("Pong/4", checkpoints="3")),
        (["--checkpoints", "0,3"], Request.parse("Pong/4", checkpoints="0,3")),
        (
            ["--dt-buffers", "3", "--dt-steps", "50", "--dt-trajectories", "1"],
            Request.parse("Pong/4", subset=Subset.decision_transformer(3, 50, 1)),
        ),
        (
            ["--dt-buffers", "50", "--dt-steps", "50", "--dt-trajectories", "1"],
            Request.parse("Pong/4", subset=Subset.decision_transformer(50, 50, 1)),
        ),
    ):
        public_copy.proxy.reset()
        assert main(["pull", "Pong/4", *argv, "--no-progress"]) == 0
        told, line = capsys.readouterr().out.splitlines()
        assert "taken from the whole run" in told and whole.url in told, told
        assert main(["pull", "Pong/4", *argv, "-q"]) == 0
        assert capsys.readouterr().out.strip() == line
        assert public_copy.proxy.requests == 0  # the whole run serves it
        exact = pull(request, home=tmp_path / "clean", progress=False, scheduler="synchronous")
        assert exact.exact and exact.url != whole.url
        got = _opened(line)
        if request.subset is None:
            want = AtariZarrDataset(exact.url)
            assert len(got) == len(want) < len(AtariZarrDataset(whole.url))
            for i in range(len(want)):
                a, b = got[i], want[i]
                for key in ("observation", "action", ("next", "observation"), ("next", "reward")):
                    assert (a[key] == b[key]).all(), (argv, i, key)
        else:  # the trajectories drawn are the rows of the store the rule wrote
            want = AtariZarrDataset(exact.url)
            assert len(got.rows) == len(want), argv
            rows = np.sort(got.rows)
            for name in ("action", "reward", "terminated"):
                np.testing.assert_array_equal(
                    AtariZarrDataset(whole.url).read_steps(rows, [name])[name],
                    want.read_steps(range(len(want)), [name])[name],
                )


@pytest.mark.slow
def test_a_fraction_pull_from_a_server_that_ignores_range(tmp_path, capsys):
    """`pull --fraction` from ``python -m http.server`` (a ranged GET answered 200 with the
    whole shard) ended in ``ValueError: memoryview assignment``: it pulls the same store
    as a conversion of the files themselves."""
    import shutil

    from atari_zarr_testkit.web import DirectoryServer

    from atari_zarr.cli import main

    old, _ = _two_publications(tmp_path)
    served = tmp_path / "served" / "Asterix"
    served.mkdir(parents=True)
    for path in old.paths.values():
        shutil.copy(path, served)
    home = tmp_path / "home"
    argv = ["Asterix/1", "--checkpoints", "0-1", "--fraction", str(FRACTION)]
    with DirectoryServer(served.parent) as server:
        code = main(
            ["pull", *argv, "--source", server.endpoint_url, "--home", str(home), "-q"]
            + ["--scheduler", "synchronous"]
        )
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    [local] = convert(
        old.game_dir,
        str(tmp_path / "local"),
        checkpoints=[0, 1],
        subset=Subset.fraction_of(FRACTION, order="played"),
        scheduler="synchronous",
        progress=False,
    )
    got, want = arrays_of(out.strip()), arrays_of(local.url)
    assert all(np.array_equal(got[name], want[name]) for name in ARRAYS)


@pytest.mark.slow
def test_a_damaged_pulled_store_advises_the_pull_that_writes_it_again(
    public_copy, tmp_path, capsys
):
    """A pulled store recorded a `convert` line as its command, so a damaged chunk advised a
    `convert` that then failed ("already holds a complete store"): it records the `pull`
    that made it (credentials out), and the advice, `pull ... --force`, repairs it."""
    import shlex

    from atari_zarr.cli import main
    from atari_zarr.errors import StoreCorruptError

    home = tmp_path / "home"
    assert main(["pull", "Pong/4", "--checkpoints", "0", "-q", "--home", str(home)]) == 0
    url = capsys.readouterr().out.strip()
    command = zarr.open_group(url, mode="r").attrs[ATTRS_KEY]["command"]
    assert command == f"atari-zarr pull Pong/4 --checkpoints 0 --home {home}"
    shard = max((Path(url) / "observation" / "c").rglob("*"), key=lambda p: p.stat().st_size)
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 3] ^= 0xFF
    shard.write_bytes(bytes(raw))
    ds = AtariZarrDataset(url)
    with pytest.raises(StoreCorruptError) as info:
        ds[range(len(ds))]
    text = str(info.value)
    advised = f"atari-zarr pull Pong/4 --checkpoints 0 --home {home} --force"
    assert "\n" not in text and f"pull it again ({advised})" in text, text
    assert main([*shlex.split(advised)[1:], "-q"]) == 0
    again = AtariZarrDataset(url)
    assert len(again[range(len(again))]) == len(ds)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_pull_stopped_by_a_signal_leaves_no_semaphore_behind(public_copy, tmp_path, signum):
    """A pull on worker processes killed with ``kill -TERM`` left its pool's queues (named
    semaphores) to Python's resource tracker, which printed "leaked semaphore objects":
    SIGTERM stops it as Ctrl-C does, in one line, and the same pull then resumes. So does
    SIGHUP (the terminal closed), which had the same warning."""
    proc = subprocess.Popen(
        [
            *pause_command(tmp_path, "-shard-", 1),
            "pull",
            "Asterix/1",
            "--scheduler",
            "processes",
            "--workers",
            "2",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "paused\n", proc.stderr.read()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        _reap(proc)
    assert proc.returncode == 128 + signum, err
    assert "leaked" not in err and "resource_tracker" not in err, err
    assert err.count("\n") == 1 and ("interrupted" in err or "terminated" in err), err
    done = pull(Request.parse("Asterix/1"), scheduler="synchronous", progress=False)
    assert zarr.open_group(done.url, mode="r").attrs[ATTRS_KEY]["complete"]


MEMORY_PULL_SCRIPT = """
import contextlib, io, sys
from atari_zarr import AtariZarrDataset
from atari_zarr.cli import main
with contextlib.redirect_stdout(io.StringIO()) as said:
    code = main(sys.argv[1:])
print(said.getvalue(), end="")
if code == 0:  # the store lives in this process: read it here
    url = said.getvalue().split(" -> ", 1)[1].split()[0]
    print(len(AtariZarrDataset(url)), flush=True)
sys.exit(code)
"""


@pytest.mark.slow
def test_a_pull_into_memory_ends_with_the_default_scheduler(public_copy, tmp_path):
    """``pull --home memory://x`` ran for minutes with both workers busy, past
    ``--timeout``: each worker process scanned into a ``memory://`` of its own, which the
    planning process never saw. The workers are threads of the process that holds the
    memory, and the pull gives the store a pull into a directory gives."""
    home = f"memory://pull-home-{tmp_path.name}"
    args = ["pull", "Asterix/1", "--checkpoints", "0-2", "--no-progress", "--timeout", "10"]
    proc = _spawn(MEMORY_PULL_SCRIPT, *args, "--workers", "2", "--home", home)
    try:
        out, err = proc.communicate(timeout=240)  # a hang guard: it takes seconds
    finally:
        _reap(proc)
    assert proc.returncode == 0, err
    assert f"-> {home}/" in out
    local = pull(
        Request.parse("Asterix/1", checkpoints=[0, 1, 2]),
        home=tmp_path / "local",
        scheduler="synchronous",
        progress=False,
    )
    assert out.strip().splitlines()[-1] == str(len(AtariZarrDataset(local.url)))


def test_a_web_source_that_fails_is_retried_and_never_called_not_holding(tmp_path):
    """Three 503s on an http source gave "the source does not hold ..." with no retry,
    and so did a lasting 500: transient answers are retried (the pull completes), a
    lasting one is named by its status."""
    from atari_zarr_testkit.proxy import CountingProxy
    from atari_zarr_testkit.rl_unplugged import write_fixture_rlu
    from atari_zarr_testkit.web import DirectoryServer

    write_fixture_rlu(
        str(tmp_path / "served"), "Asterix", 1, num_shards=50, episodes_per_shard=1, cut_length=40
    )
    request = Request.parse("Asterix/1", checkpoints=[0])
    with (
        DirectoryServer(tmp_path / "served") as server,
        CountingProxy(server.endpoint_url) as proxy,
    ):
        source = proxy.endpoint_url
        options = {"source": source, "progress": False, "scheduler": "synchronous"}
        proxy.fail_next(3, 503)
        done = pull(request, home=tmp_path / "home", timeout=60, **options)
        assert [e[2] for e in proxy.log].count(503) == 3, proxy.log
        assert len(AtariZarrDataset(done.url)) > 0
        proxy.fail_next(10_000, 500)
        with pytest.raises(RemoteAccessError) as info:
            pull(request, home=tmp_path / "other", timeout=60, **options)
        proxy.reset()
    text = str(info.value)
    assert "\n" not in text and "does not hold" not in text, text
    assert f"{source}/Asterix" in text and "500 Internal Server Error" in text, text
