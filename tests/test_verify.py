"""`verify` finds flipped bytes, missing chunks, inconsistent attributes and source mismatches."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys

import pytest
from atari_zarr_testkit import write_fixture_run

from atari_zarr import convert
from atari_zarr.layout import ATTRS_KEY, OBSERVATION, TERMINATED, TRUNCATED
from atari_zarr.verify import verify_store


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A run of four checkpoints (never modified: tests that damage it copy it)."""
    root = tmp_path_factory.mktemp("src")
    write_fixture_run(
        str(root), "Pong", "1", capacity=3000, steps=9000, seed=2, max_episode_length=300
    )
    return root


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
    dest = tmp_path_factory.mktemp("dst")
    [store] = convert(str(source), str(dest), scheduler="synchronous", progress=False)
    return source / "Pong" / "1", store


@pytest.fixture
def copy(converted, tmp_path):
    """A private copy of the converted store, to damage."""
    src, store = converted
    path = tmp_path / "1.zarr"
    shutil.copytree(store.url, path)
    return src, path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atari_zarr", "verify", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_sound_store_passes(converted):
    src, store = converted
    report = verify_store(store.url, source=str(src))
    assert report.ok, report.format()
    assert report.checked["compared"] == report.checked["transitions"] == store.transitions
    res = cli(store.url, "--source", str(src))
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr


@pytest.mark.parametrize("where", ["frame chunk", "shard index", "step chunk"])
def test_any_flipped_byte_is_caught(copy, where):
    _, path = copy
    if where == "step chunk":
        target, offset = path.joinpath(*TERMINATED.split("/"), "c", "0"), -2
    else:
        target = path / OBSERVATION / "c" / "1" / "0" / "0"
        # the index (start of the shard: 16 bytes per chunk + crc32c) or the last chunk's bytes
        offset = 5 if where == "shard index" else -7
    flip(target, offset % target.stat().st_size)
    report = verify_store(str(path))
    assert not report.ok
    text = report.format()
    name = TERMINATED if where == "step chunk" else OBSERVATION
    assert f"{name}: " in text and "cannot be decoded" in text
    if where == "frame chunk":
        # located to the last 16-frame chunk of shard 1
        assert "chunks at rows [8176] of shard 1 (rows 4096..8191)" in text
    assert "The store is damaged; convert it again with --overwrite." in text
    res = cli(str(path))
    first = res.stderr.splitlines()[0]
    assert res.returncode == 1 and re.search(r": (1 problem|[\d,]+ problems) found", first), first
    assert "(s)" not in first and "()" not in first, first


def test_the_summary_line_counts_problems_in_words(copy):
    """``verify`` printed "1 problem(s) found ()" for a store it could not check: one
    problem is "1 problem found", and nothing checked gives no empty parentheses."""
    _, path = copy
    doc = json.loads((path / "zarr.json").read_text())
    version = doc["attributes"][ATTRS_KEY]["format_version"]
    doc["attributes"][ATTRS_KEY]["format_version"] = 999
    (path / "zarr.json").write_text(json.dumps(doc))
    res = cli(str(path))
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines()[0] == f"{path}: 1 problem found", res.stderr
    doc["attributes"][ATTRS_KEY]["format_version"] = version
    doc["attributes"][ATTRS_KEY]["counts"]["transitions"] = 5
    (path / "zarr.json").write_text(json.dumps(doc))
    first = cli(str(path)).stderr.splitlines()[0]
    assert re.fullmatch(rf"{re.escape(str(path))}: \d+ problems found \(5 transitions\)", first)


def test_an_index_entry_running_past_its_object_is_reported(copy):
    """A crafted entry (valid index crc32c) with a chunk's offset and a length past the
    end of the shard: the bytes there (the last chunk's, whose own crc32c holds) stop
    short of it, which is damage, never another chunk's frames taken for its own."""
    import numpy as np

    from atari_zarr.shard_format import crc_bytes

    _, path = copy
    target = path / OBSERVATION / "c" / "1" / "0" / "0"
    raw = target.read_bytes()
    entries = np.frombuffer(raw, "<u8", count=2 * 256).reshape(-1, 2).copy()
    last = int(np.argmax(entries[:, 0]))  # the chunk stored last, ending the object
    entries[3] = [entries[last, 0], entries[last, 1] + 10]
    index = entries.tobytes()
    target.write_bytes(index + crc_bytes(index) + raw[len(index) + 4 :])
    text = verify_store(str(path)).format()
    assert f"{OBSERVATION}: " in text and "is cut short" in text, text
    assert "The store is damaged; convert it again with --overwrite." in text


def test_an_unfinished_store_is_never_called_damaged(copy):
    _, path = copy
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"][ATTRS_KEY]["complete"] = False
    (path / "zarr.json").write_text(json.dumps(doc))
    target = path / OBSERVATION / "c" / "1" / "0" / "0"
    flip(target, target.stat().st_size - 7)
    text = verify_store(str(path)).format()
    assert "cannot be decoded" in text and "damaged" not in text
    assert "The store is unfinished; finish it by running atari-zarr convert " in text


def test_missing_chunk_is_reported(copy):
    _, path = copy
    path.joinpath(*TRUNCATED.split("/"), "c", "0").unlink()
    report = verify_store(str(path))
    assert f"{TRUNCATED}: chunk 0 (rows 0.." in report.format()
    assert "is missing from the store" in report.format()


@pytest.mark.parametrize(
    "content, what",
    [
        (b"garbage{", "is not array metadata zarr can read"),
        (b'{"zarr_format": 3, "node_type": "array"}', "is not array metadata zarr can read"),
        (None, "differs from the root's consolidated metadata in ['shape']"),
    ],
)
def test_an_array_metadata_file_zarr_cannot_use_is_reported(copy, content, what):
    """Readers that open an array by itself (tensorstore, zarr without consolidated
    metadata) read its own zarr.json, which verify read nowhere else."""
    _, path = copy
    target = path / "action" / "zarr.json"
    if content is None:  # valid metadata of another shape
        doc = json.loads(target.read_text())
        doc["shape"] = [5]
        content = json.dumps(doc).encode()
    target.write_bytes(content)
    report = verify_store(str(path))
    assert not report.ok
    [line] = [p for p in report.problems if p.startswith("action/zarr.json")]
    assert what in line and "\n" not in line


def test_attributes_that_disagree_with_the_arrays(copy):
    _, path = copy
    meta_file = path / "zarr.json"
    doc = json.loads(meta_file.read_text())
    meta = doc["attributes"][ATTRS_KEY]
    meta["episodes"]["length"][1] += 1
    meta["counts"]["episodes"] += 1
    meta_file.write_text(json.dumps(doc))
    text = verify_store(str(path)).format()
    assert "episode 1 (ending at row" in text
    assert "counts.episodes = " in text


def test_malformed_episode_table_is_reported(copy):
    _, path = copy
    meta_file = path / "zarr.json"
    doc = json.loads(meta_file.read_text())
    doc["attributes"][ATTRS_KEY]["episodes"]["return"].pop()  # one return short
    meta_file.write_text(json.dumps(doc))
    report = verify_store(str(path))
    assert "attribute episodes is not a per-episode table" in report.format()
    assert "episodes.length has 0" in report.format()


def test_source_mismatch_is_reported(converted, tmp_path):
    src, store = converted
    other = tmp_path / "Pong" / "1"
    shutil.copytree(src, other)
    obs = other / "replay_logs" / "$store$_observation_ckpt.1.gz"
    with gzip.open(obs, "rb") as f:
        raw = bytearray(f.read())
    raw[-100] ^= 0xFF  # a pixel of the last buffer row
    with gzip.open(obs, "wb", compresslevel=1) as f:
        f.write(bytes(raw))
    report = verify_store(store.url, source=str(other))
    assert not report.ok
    assert f"{OBSERVATION}: frames at rows" in report.format()
    assert "checkpoint 1" in report.format()


def test_incomplete_and_foreign(tmp_path, copy):
    _, path = copy
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"][ATTRS_KEY]["complete"] = False
    (path / "zarr.json").write_text(json.dumps(doc))
    assert "the store is incomplete" in verify_store(str(path)).format()
    res = cli(str(tmp_path / "nothing-here"))
    # the one opening error of every reader: what is there, what was expected, what to do
    assert res.returncode == 1 and "nothing-here does not exist" in res.stderr
    assert "Check the path" in res.stderr


@pytest.mark.parametrize(
    "selection",
    [
        {"max_transitions": 5000},
        {"max_episodes": 7},
        {"checkpoints": "mixed"},
        {"checkpoints": [1, 3], "max_episodes": 4},
    ],
    ids=["max-transitions", "max-episodes", "preset", "checkpoints-and-limit"],
)
def test_selected_store_passes_against_its_source(source, converted, tmp_path, selection):
    """verify --source plans the run with the selection the store records."""
    _, whole = converted
    [store] = convert(
        str(source), str(tmp_path), scheduler="synchronous", progress=False, **selection
    )
    assert 0 < store.transitions < whole.transitions
    report = verify_store(store.url, source=str(source / "Pong" / "1"))
    assert report.ok, report.format()
    assert report.checked["compared"] == store.transitions
    res = cli(store.url, "--source", str(source / "Pong" / "1"))
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr


def test_progress_total_is_the_rows_read_and_compared(source, tmp_path, capsys):
    [store] = convert(
        str(source), str(tmp_path), scheduler="synchronous", progress=False, max_transitions=5000
    )
    capsys.readouterr()
    report = verify_store(store.url, source=str(source / "Pong" / "1"), progress=True)
    assert report.ok, report.format()
    # frames read once, then every transition compared with the source
    total = store.transitions + report.checked["compared"]
    assert report.rows_to_check == total == 2 * 5000
    err = capsys.readouterr().err
    assert "verify Pong/1.zarr: 100%" in err and f"{total}/{total}" in err
    # without a source, only the store's own rows
    report = verify_store(store.url, progress=True)
    assert report.rows_to_check == store.transitions
    assert f"{store.transitions}/{store.transitions}" in capsys.readouterr().err


def test_selection_that_does_not_fit_the_source_is_reported(source, tmp_path, capsys):
    """The stored selection is used as recorded: a store of other rows is not the same."""
    [store] = convert(
        str(source), str(tmp_path), scheduler="synchronous", progress=False, max_transitions=5000
    )
    meta_file = tmp_path / "Pong" / "1.zarr" / "zarr.json"
    doc = json.loads(meta_file.read_text())
    doc["attributes"][ATTRS_KEY]["selection"]["max_transitions"] = 4000
    meta_file.write_text(json.dumps(doc))
    capsys.readouterr()
    report = verify_store(store.url, source=str(source / "Pong" / "1"), progress=True)
    assert not report.ok
    assert "gives 4000 transitions with the store's selection" in report.format()
    assert "the store holds 5000" in report.format()
    # nothing is compared, and the bar does not count on it
    assert report.checked["compared"] == 0
    assert "5000/5000" in capsys.readouterr().err


def test_frames_decoded_on_processes_report_what_one_process_reports(copy, monkeypatch):
    """Frames spread over worker processes (here from 2 units, not 256) find the same
    damaged chunks, reported in the same order, as one process does."""
    import atari_zarr.verify as verify

    _, path = copy
    shards = sorted((path / OBSERVATION / "c").rglob("*"))
    shards = [s for s in shards if s.is_file()]
    assert len(shards) >= 3  # 9,000 rows: three shards of 4,096 frames
    for shard in (shards[2], shards[0]):
        flip(shard, 100)  # the first chunk's bytes of each shard
    serial = verify_store(str(path), workers=1)
    monkeypatch.setattr(verify, "PARALLEL_UNITS", 2)
    import atari_zarr.conversion.scheduling as scheduling

    pools = []
    start = scheduling.worker_processes
    monkeypatch.setattr(scheduling, "worker_processes", lambda n: pools.append(n) or start(n))
    parallel = verify_store(str(path), workers=2)
    assert pools == [2]  # the frames were read on two processes
    assert not serial.ok and len(serial.problems) == 2, serial.format()
    assert parallel.problems == serial.problems
    assert parallel.checked == serial.checked
    assert "shard 0" in parallel.problems[0] and "shard 2" in parallel.problems[1]


def test_a_store_in_memory_is_verified_in_its_own_process(copy, monkeypatch):
    """A ``memory://`` store is in this process's memory only: worker processes, which
    see a ``memory://`` of their own, found none of its frames. Its frames are read here."""
    import fsspec

    import atari_zarr.verify as verify

    _, path = copy
    url = f"memory://verify-{path.parent.name}/1.zarr"
    fsspec.filesystem("memory").put(str(path), url[len("memory://") :], recursive=True)
    monkeypatch.setattr(verify, "PARALLEL_UNITS", 2)  # 9,000 rows: three units of frames
    report = verify_store(url, workers=2)
    assert report.ok, report.format()
    assert report.checked == verify_store(str(path), workers=1).checked


def test_a_store_whose_objects_digest_is_not_its_objects_is_not_verified(copy):
    """``objects_digest`` (what the content id covers of the objects) was written with
    the completion marker and never checked: a store whose attribute disagrees with the
    crc32c its arrays record passed ``verify``. A store completed before the attribute
    was recorded (none) still passes."""
    _, path = copy
    doc = json.loads((path / "zarr.json").read_text())
    meta = doc["attributes"][ATTRS_KEY]
    assert verify_store(str(path)).ok and len(meta["objects_digest"]) == 64
    for forged in ("0" * 64, 7):
        meta["objects_digest"] = forged
        (path / "zarr.json").write_text(json.dumps(doc))
        report = verify_store(str(path))
        assert not report.ok
        [problem] = report.problems
        assert problem.startswith("attribute objects_digest") and "\n" not in problem
    del meta["objects_digest"]
    (path / "zarr.json").write_text(json.dumps(doc))
    assert verify_store(str(path)).ok
