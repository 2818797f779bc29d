"""Converting RL Unplugged shards: every transition equals the fixture's ground truth."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import store_files
from atari_zarr_testkit.rl_unplugged import (
    RluFixture,
    corrupt_record_byte,
    rename_shard,
    spoil_record,
    truncate_shard,
    write_fixture_rlu,
)
from dask.callbacks import Callback

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.catalog import store_state
from atari_zarr.cli import main
from atari_zarr.conversion.workdir import work_url
from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.layout import (
    ACTION,
    ATTRS_KEY,
    EPISODE,
    FINAL_OBSERVATION,
    OBSERVATION,
    REWARD,
    SOURCE_ROW,
    TERMINATED,
    TRUNCATED,
    UNCLIPPED_REWARD,
)
from atari_zarr.sources.rl_unplugged.planner import SHARD_STRIDE, return_disagreements


@pytest.fixture(scope="module")
def rlu(tmp_path_factory: pytest.TempPathFactory) -> RluFixture:
    """Asterix run 1: shards 0 and 2 of 3 (shard 1 is missing), terminal and cut episodes."""
    return write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=3, present=(0, 2))


@pytest.fixture(scope="module")
def rlu_store(rlu: RluFixture, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``rlu`` converted once with the defaults (synchronous). Read-only."""
    [store] = convert(
        rlu.root, str(tmp_path_factory.mktemp("rlu-out")), progress=False, scheduler="synchronous"
    )
    return store.url


@pytest.fixture
def rlu_copy(rlu: RluFixture, tmp_path: Path) -> RluFixture:
    """This test's own copy of the fixture's files (to damage); the truth is shared."""
    root = tmp_path / "src"
    shutil.copytree(rlu.root, root)
    paths = {i: str(root / Path(p).relative_to(rlu.root)) for i, p in rlu.paths.items()}
    return RluFixture(
        str(root), rlu.game, rlu.run, rlu.num_shards, rlu.present, paths, rlu.episodes
    )


def test_every_transition_equals_the_truth(rlu, rlu_store):
    truth = rlu.truth()
    ds = AtariZarrDataset(rlu_store)
    assert len(ds) == len(truth)
    batch = ds[np.arange(len(ds))]
    assert np.array_equal(batch["observation"].numpy(), truth.observation)
    # next frames, terminal frames included (final_observation); zeros after a cut
    assert np.array_equal(batch["next", "observation"].numpy(), truth.next_observation)
    assert np.array_equal(batch["action"].numpy().reshape(-1), truth.action)
    assert np.array_equal(batch["next", "reward"].numpy().reshape(-1), truth.reward)
    assert np.array_equal(batch["next", "terminated"].numpy().reshape(-1), truth.terminated)
    assert np.array_equal(batch["next", "truncated"].numpy().reshape(-1), truth.truncated)
    g = zarr.open_group(rlu_store, mode="r")
    assert np.array_equal(g[EPISODE][:], truth.episode)
    assert np.array_equal(g[UNCLIPPED_REWARD][:], truth.unclipped_reward)
    assert np.array_equal(g[FINAL_OBSERVATION][:], truth.final_observation)
    assert not np.array_equal(truth.reward, truth.unclipped_reward)  # clipping mattered
    # source_row: shard * stride + the Example step within the shard
    rows = g[SOURCE_ROW][:]
    assert (np.diff(rows) > 0).all() and set(rows // SHARD_STRIDE) == {0, 2}

    meta = g.attrs[ATTRS_KEY]
    assert meta["kind"] == "rl-unplugged" and meta["game"] == rlu.game and meta["run"] == "1"
    assert meta["source"]["num_shards"] == 3
    assert meta["source"]["shards_present"] == [0, 2]
    assert meta["source"]["shards_missing"] == [1]
    assert meta["conversion"]["gaps"] == [
        {"from_shard": 1, "to_shard": 2, "shards": 1, "absent": [1]}
    ]
    table = meta["episodes"]
    assert table["length"] == truth.length.tolist()
    assert table["terminated"] == truth.episode_terminated.tolist()
    assert table["checkpoint_idx"] == truth.checkpoint_idx.tolist()
    assert table["episode_idx"] == truth.episode_idx.tolist()
    assert table["episode_return"] == truth.episode_return.tolist()
    assert table["clipped_episode_return"] == truth.clipped_episode_return.tolist()
    assert return_disagreements(meta) == []
    assert meta["counts"]["episodes"] == len(truth.length)
    assert "--source-kind rl-unplugged" in meta["command"]


@pytest.mark.slow
def test_same_bytes_whatever_the_scheduler(rlu, rlu_store, tmp_path):
    expected = store_files(rlu_store, Path(rlu_store).parents[1])
    for scheduler in ("threads", "processes"):
        dest = tmp_path / scheduler
        [store] = convert(rlu.root, str(dest), progress=False, scheduler=scheduler, workers=2)
        assert store_files(store.url, dest) == expected, scheduler


class _Keys(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []

    def _posttask(self, key, result, dsk, state, worker_id):
        self.keys.append(str(key))


def test_graph_has_a_scan_and_a_write_task_per_shard(rlu, tmp_path):
    with _Keys() as seen:
        convert(rlu.root, str(tmp_path), progress=False, scheduler="synchronous")
    scans = sorted(k.rsplit("-", 1)[-1] for k in seen.keys if "-scan-" in k)
    writes = sorted(k.rsplit("-", 1)[-1] for k in seen.keys if k.split("-")[-2] == "shard")
    assert scans == ["0", "2"] and writes == ["0", "2"]
    # units shared by the two shards are assembled from pieces by their own tasks
    assert any("-unit-observation-0" in k for k in seen.keys)
    assert any("-unit-final_observation-0" in k for k in seen.keys)


@pytest.mark.slow
def test_source_kind_selection_and_limits_from_the_cli(rlu, tmp_path, capsys):
    dest = tmp_path / "out"
    game_dir = rlu.game_dir
    args = ["convert", game_dir, str(dest), "--source-kind", "rl-unplugged", "--no-progress"]
    assert main([*args, "--checkpoints", "2"]) == 0
    assert "1 gaps" in capsys.readouterr().out  # shards 0 and 1 come before it
    truth = rlu.truth([2])
    g = zarr.open_group(str(dest / rlu.game / "1.zarr"), mode="r")
    assert np.array_equal(g[OBSERVATION][:], truth.observation)
    assert g.attrs[ATTRS_KEY]["conversion"]["gaps"][0]["absent"] == [1]
    assert g.attrs[ATTRS_KEY]["source"]["shards_selected"] == [2]
    # the wrong kind is refused with one line
    assert main(["convert", game_dir, str(tmp_path / "x"), "--source-kind", "dqn-replay"]) == 1
    assert "replay_logs" in capsys.readouterr().err

    # a transition limit cuts the episode it falls into: truncated, frame after unknown
    full = rlu.truth()
    n = int(full.length[0]) + 10
    [store] = convert(rlu.root, str(tmp_path / "lim"), max_transitions=n, progress=False)
    g = zarr.open_group(store.url, mode="r")
    assert store.transitions == n and store.episodes == 2
    assert np.array_equal(g[OBSERVATION][:], full.observation[:n])
    assert g[TRUNCATED][n - 1] and not g[TERMINATED][n - 1]
    assert not g[FINAL_OBSERVATION][1].any()
    table = g.attrs[ATTRS_KEY]["episodes"]
    assert table["length"] == [int(full.length[0]), 10]
    assert table["return"][1] == pytest.approx(float(full.reward[full.length[0] : n].sum()))
    # only the shard the limit falls into was scanned and written
    assert [s["shard"] for s in g.attrs[ATTRS_KEY]["conversion"]["shards"]] == [0]
    # whole episodes
    [store] = convert(rlu.root, str(tmp_path / "eps"), max_episodes=3, progress=False)
    g = zarr.open_group(store.url, mode="r")
    assert store.episodes == 3 and np.array_equal(
        g[ACTION][:], full.action[: full.length[:3].sum()]
    )
    assert np.array_equal(g[REWARD][:], full.reward[: full.length[:3].sum()])


def test_unclipped_only_and_no_returns(tmp_path):
    """Newer releases: no clipped_rewards, no returns: clipped here, to [-1, 1]."""
    fixture = write_fixture_rlu(
        str(tmp_path / "src"), present=(0, 1), num_shards=2, clipped=False, returns=False
    )
    [store] = convert(fixture.root, str(tmp_path / "out"), progress=False)
    truth = fixture.truth()
    g = zarr.open_group(store.url, mode="r")
    assert np.array_equal(g[REWARD][:], truth.reward)
    assert np.array_equal(g[UNCLIPPED_REWARD][:], truth.unclipped_reward)
    table = g.attrs[ATTRS_KEY]["episodes"]
    assert "episode_return" not in table and "clipped_episode_return" not in table
    assert g.attrs[ATTRS_KEY]["conversion"]["gaps"] == []


def test_returns_that_disagree_are_recorded(rlu_copy, tmp_path):
    from atari_zarr_testkit.rl_unplugged import replace_record

    from atari_zarr.sources.rl_unplugged.example import encode_episode

    episode = rlu_copy.episodes_of(2)[0]
    example = episode.example()
    example.episode_return = 12345.0
    replace_record(rlu_copy.paths[2], 0, encode_episode(example))
    [store] = convert(rlu_copy.root, str(tmp_path / "out"), progress=False)
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    check = meta["conversion"]["returns_check"]["episode_return"]
    assert check["disagree"] == 1 and check["first"][0]["shard"] == 2
    assert check["first"][0]["source"] == 12345.0
    [line] = return_disagreements(meta)
    assert "shard 2, record 0" in line


def _bad_shard(fixture: RluFixture, how: str) -> tuple[str, str]:
    """Damage shard 2 of ``fixture`` in one way; return (the shard's name, the record)."""
    path = fixture.paths[2]
    name = Path(path).name
    if how == "truncated":
        truncate_shard(path, 0.6)
        return name, r"record \d+"
    if how == "flipped_byte":
        corrupt_record_byte(path, 1)
        return name, "record 1"
    if how == "checkpoint_idx":
        spoil_record(path, 1, "checkpoint_idx")
        return name, "record 1"
    if how == "other_n":  # both names are named: the first shard's and the odd one
        new = rename_shard(path, num_shards=4)
        return Path(new).name, Path(fixture.paths[0]).name
    spoil = {
        "missing_feature": {"how": "missing_feature", "feature": "discounts"},
        "lengths": {"how": "lengths", "feature": "unclipped_rewards"},
        "png_size": {"how": "png_size", "step": 3},
        "png_rgb": {"how": "png_rgb", "step": 3},
        "png_corrupt": {"how": "png_corrupt", "step": 3},
    }[how]
    spoil_record(path, 1, **spoil)  # type: ignore[arg-type]
    return name, "record 1"


@pytest.mark.parametrize(
    "how",
    [
        "truncated",
        "flipped_byte",
        "missing_feature",
        "lengths",
        "png_size",
        "png_rgb",
        "png_corrupt",
        "checkpoint_idx",
        "other_n",
    ],
)
def test_bad_input_is_one_line_naming_shard_and_record(rlu_copy, tmp_path, capsys, how):
    name, where = _bad_shard(rlu_copy, how)
    dest = tmp_path / "out"
    code = main(["convert", rlu_copy.root, str(dest), "--no-progress", "--scheduler", "threads"])
    err = capsys.readouterr().err
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert name in err and re.search(where, err), err
    store = dest / rlu_copy.game / "1.zarr"
    assert store_state(str(store)) != "complete"
    if how != "other_n":
        with pytest.raises(SourceFormatError):
            convert(rlu_copy.root, str(tmp_path / "again"), progress=False, scheduler="synchronous")


def test_resume_does_not_scan_again(rlu, tmp_path):
    """A conversion stopped after pass 1 keeps its scans; the next one reads them."""
    dest = tmp_path / "out"
    store = dest / rlu.game / "1.zarr"

    class Stop(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if "-shard-" in str(key):
                raise KeyboardInterrupt

    with Stop(), pytest.raises(KeyboardInterrupt):
        convert(rlu.root, str(dest), progress=False, scheduler="synchronous")
    scans = Path(work_url(str(store))) / "scans" / "done"
    assert sorted(p.name for p in scans.iterdir()) == ["0", "2"]
    with _Keys() as seen:
        [done] = convert(rlu.root, str(dest), progress=False, scheduler="synchronous")
    assert not [k for k in seen.keys if "-scan-" in k]
    assert len([k for k in seen.keys if "-shard-" in k]) == 1  # one shard was written before
    fresh = tmp_path / "fresh"
    convert(rlu.root, str(fresh), progress=False, scheduler="synchronous")
    assert store_files(done.url, dest) == store_files(fresh / rlu.game / "1.zarr", fresh)


def test_detection_errors(rlu, source_root, tmp_path):
    with pytest.raises(SourceNotFoundError, match="holds neither source layout"):
        convert(str(tmp_path), str(tmp_path / "out"), progress=False)
    both = tmp_path / "both"
    shutil.copytree(rlu.game_dir, both / rlu.game)
    (both / "Pong" / "1" / "replay_logs").mkdir(parents=True)
    with pytest.raises(SourceFormatError, match="holds both source layouts"):
        convert(str(both), str(tmp_path / "out"), progress=False)
    [store] = convert(str(both), str(tmp_path / "out"), progress=False, source_kind="rl-unplugged")
    assert json.loads(Path(store.url, "zarr.json").read_text())["attributes"][ATTRS_KEY]["complete"]


#: Runs `atari-zarr ARGS`, pausing for good (in the scheduling thread) once the first
#: shard's write task has finished, after printing "paused"; the test then kills it.
PAUSE_SCRIPT = """
import sys
import threading

from dask.callbacks import Callback

from atari_zarr.cli import main


class PauseAfterShard(Callback):
    def _posttask(self, key, result, dsk, state, worker_id):
        if "-shard-" in str(key):
            print("paused", flush=True)
            threading.Event().wait()  # until killed


PauseAfterShard().register()
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_killed_conversion_resumes_to_the_same_bytes(rlu, rlu_store, tmp_path):
    import os
    import selectors
    import signal
    import subprocess
    import sys

    dest = tmp_path / "out"
    script = tmp_path / "pause.py"
    script.write_text(PAUSE_SCRIPT)
    args = [sys.executable, str(script), "convert", rlu.root, str(dest)]
    proc = subprocess.Popen(
        [*args, "--scheduler", "synchronous", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
            assert sel.select(120), "the conversion never reached the pause"
        assert proc.stdout.readline() == b"paused\n", proc.stderr.read()  # type: ignore[union-attr]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    store = dest / rlu.game / "1.zarr"
    assert store_state(str(store)) == "incomplete"
    done = Path(work_url(str(store))) / "done"
    assert len([p for p in done.iterdir() if p.name.startswith("shard-")]) == 1
    with _Keys() as seen:
        [again] = convert(rlu.root, str(dest), progress=False, scheduler="threads")
    assert not [k for k in seen.keys if "-scan-" in k]  # the scans were kept
    assert len([k for k in seen.keys if "-shard-" in k]) == 1
    assert store_files(again.url, dest) == store_files(rlu_store, Path(rlu_store).parents[1])


@pytest.mark.slow
def test_convert_from_a_bucket(rlu, rlu_store, tmp_path):
    gcsfs = pytest.importorskip("gcsfs")
    from atari_zarr_testkit.gcs import FakeGCSServer

    with FakeGCSServer() as server:
        server.create_bucket("rl_unplugged")
        opts = server.storage_options()
        fs = gcsfs.GCSFileSystem(**opts)
        for path in rlu.paths.values():
            fs.put_file(path, f"rl_unplugged/atari_episodes_ordered/{rlu.game}/{Path(path).name}")
        source = "gs://rl_unplugged/atari_episodes_ordered"
        [store] = convert(
            source,
            str(tmp_path),
            storage_options={},
            source_storage_options=opts,
            scheduler="threads",
            workers=2,
            progress=False,
        )
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    assert meta["source"]["url"] == f"{source}/{rlu.game}"
    got = store_files(store.url, tmp_path)
    expected = store_files(rlu_store, Path(rlu_store).parents[1])
    assert got.keys() == expected.keys()
    assert {k: v for k, v in got.items() if k != "zarr.json"} == {
        k: v for k, v in expected.items() if k != "zarr.json"
    }


def test_scans_of_a_source_that_tells_no_version_are_never_resumed() -> None:
    """A source whose objects have no size or version (a web server without ETag or
    Last-Modified) cannot tell whether it changed since a scan: its scan fingerprint is
    new on each conversion, so scans begun earlier are done again, never reused."""
    from types import SimpleNamespace

    from atari_zarr.conversion.converter import _scan_digest
    from atari_zarr.sources.registry import Selection

    def source(version):
        shards = [("run_1-00000-of-00050", 10, version), ("run_1-00001-of-00050", 12, version)]
        return SimpleNamespace(
            url="http://h/rlu/Asterix", game="Asterix", run="1", names=lambda: shards
        )

    selection = Selection(None, None, None, None)
    versioned = source("Last-Modified:Sun, 29 Nov 2026 01:00:00 GMT")
    assert _scan_digest(versioned, selection) == _scan_digest(versioned, selection)
    unversioned = source(None)
    assert _scan_digest(unversioned, selection) != _scan_digest(unversioned, selection)


@pytest.mark.timeout(300)  # a hang guard: the conversion takes seconds
def test_scans_the_work_area_does_not_list_are_never_run_again_for_ever(rlu, tmp_path, monkeypatch):
    """A work area whose listing of kept scans never shows them (as a listing cached by
    the planning process did, while worker processes wrote them) made planning scan the
    same shards again and again, past every deadline. A scan asked for twice is one line
    naming the work area, and a later run resumes."""
    from atari_zarr.conversion.workdir import WorkDir
    from atari_zarr.errors import StoreWriteError

    with monkeypatch.context() as patch:
        patch.setattr(WorkDir, "scans_done", lambda self: set())
        with pytest.raises(StoreWriteError) as info:
            convert(rlu.root, str(tmp_path / "out"), progress=False, scheduler="synchronous")
    text = str(info.value)
    where = work_url(str(tmp_path / "out" / "Asterix" / "1.zarr"))
    assert "\n" not in text and where in text and "scans/done" in text
    assert "run the same command again to resume" in text
    [store] = convert(rlu.root, str(tmp_path / "out"), progress=False, scheduler="synchronous")
    assert store_state(store.url) == "complete"
