"""Bad source data: each case gets a clear error naming the file, and no complete store."""

from __future__ import annotations

import gzip
import io
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.errors import (
    InvalidNameError,
    SourceFormatError,
    SourceNotFoundError,
    StoreExistsError,
    StoreIncompleteError,
)
from atari_zarr.sources.dqn_replay.files import RunSource, filename, find_runs


def logs(root: Path) -> Path:
    return root / "Pong" / "1" / "replay_logs"


def save_gz(path: Path, array: np.ndarray) -> None:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        np.save(gz, array, allow_pickle=False)
    path.write_bytes(raw.getvalue())


def load_gz(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.load(io.BytesIO(f.read()), allow_pickle=False)


def assert_no_complete_store(dest: Path) -> None:
    store = dest / "Pong" / "1.zarr"
    if store.exists():
        with pytest.raises(StoreIncompleteError, match="is incomplete"):
            AtariZarrDataset(str(store))


def test_missing_file(pong_run, source_root, dest_root):
    (logs(source_root) / filename("reward", 2)).unlink()
    with pytest.raises(
        SourceNotFoundError, match=r"checkpoint 2 .* is missing \$store\$_reward_ckpt\.2\.gz"
    ):
        convert(str(source_root), str(dest_root), progress=False)
    assert_no_complete_store(dest_root)


@pytest.mark.parametrize("kind", ["action", "reward", "terminal"])
def test_lengths_disagree(pong_run, source_root, dest_root, kind):
    """The odd file out is named, with the length expected (the others') and found."""
    path = logs(source_root) / filename(kind, 1)
    save_gz(path, load_gz(path)[:-1])
    others = " and ".join(
        re.escape(filename(k, 1)) for k in ("action", "reward", "terminal") if k != kind
    )
    message = (
        rf"replay_logs/{re.escape(filename(kind, 1))} holds 63 rows; expected 64, the length "
        rf"of {others} \(the buffer capacity of checkpoint 1\)\. .* copy checkpoint 1 again"
    )
    with pytest.raises(SourceFormatError, match=message):
        convert(str(source_root), str(dest_root), progress=False)
    assert_no_complete_store(dest_root)
    with pytest.raises(SourceFormatError, match=message):
        RunSource(pong_run.url, "Pong", "1").read_small(1)


def test_capacity_differs_between_checkpoints(pong_run, source_root, dest_root):
    """Checkpoints of one run share one capacity; the file of another is named."""
    for kind in ("action", "reward", "terminal"):
        path = logs(source_root) / filename(kind, 2)
        save_gz(path, load_gz(path)[:-4])
    message = (
        r"replay_logs/\$store\$_action_ckpt\.2\.gz holds 60 rows; expected 64, the capacity of "
        r"checkpoint 0"
    )
    with pytest.raises(SourceFormatError, match=message):
        convert(str(source_root), str(dest_root), progress=False)


def test_observation_count_disagrees(pong_run, source_root, dest_root):
    path = logs(source_root) / filename("observation", 3)
    save_gz(path, load_gz(path)[:-2])
    with pytest.raises(
        SourceFormatError, match=r"observation_ckpt\.3\.gz holds uint8 of shape \(62, 84, 84\)"
    ):
        convert(str(source_root), str(dest_root), progress=False)
    assert_no_complete_store(dest_root)


def test_truncated_gzip_of_frames(pong_run, source_root, dest_root):
    path = logs(source_root) / filename("observation", 4)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        SourceFormatError, match=r"observation_ckpt\.4\.gz (is truncated or corrupt|ended early)"
    ):
        convert(str(source_root), str(dest_root), progress=False)
    assert_no_complete_store(dest_root)


def test_corrupt_gzip(pong_run, source_root, dest_root):
    path = logs(source_root) / filename("terminal", 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(SourceFormatError, match=r"terminal_ckpt\.2\.gz"):
        convert(str(source_root), str(dest_root), progress=False)
    assert_no_complete_store(dest_root)


def test_pickled_file_is_never_loaded(pong_run, source_root, dest_root, monkeypatch):
    path = logs(source_root) / filename("action", 0)
    path.write_bytes(gzip.compress(pickle.dumps(load_gz(path))))

    def forbidden(*args, **kwargs):  # pragma: no cover - must not be called
        raise AssertionError("unpickling attempted")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    with pytest.raises(SourceFormatError, match=r"action_ckpt\.0\.gz is not a plain \.npy file"):
        convert(str(source_root), str(dest_root), progress=False)
    assert_no_complete_store(dest_root)


def test_object_array_is_refused(pong_run, source_root, dest_root):
    path = logs(source_root) / filename("reward", 0)
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
        np.save(gz, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    path.write_bytes(raw.getvalue())
    with pytest.raises(SourceFormatError, match=r"reward_ckpt\.0\.gz holds a Python object array"):
        convert(str(source_root), str(dest_root), progress=False)


@pytest.mark.parametrize(
    ("kind", "array", "message"),
    [
        ("action", np.zeros(64, np.float32), r"action_ckpt\.1\.gz holds an array of dtype float32"),
        (
            "terminal",
            np.zeros((64, 2), np.uint8),
            r"terminal_ckpt\.1\.gz holds an array of dtype uint8 and shape \(64, 2\)",
        ),
        (
            "observation",
            np.zeros((64, 84, 80), np.uint8),
            r"expected uint8 of shape \(64, 84, 84\)",
        ),
        ("observation", np.zeros((64, 84, 84), np.float32), r"holds float32 of shape"),
    ],
)
def test_wrong_dtype_or_shape(pong_run, source_root, dest_root, kind, array, message):
    save_gz(logs(source_root) / filename(kind, 1), array)
    with pytest.raises(SourceFormatError, match=message):
        convert(str(source_root), str(dest_root), progress=False)
    assert_no_complete_store(dest_root)


def test_no_checkpoints(source_root, dest_root):
    logs(source_root).mkdir(parents=True)
    (logs(source_root) / "README").write_text("nothing here")
    with pytest.raises(SourceNotFoundError, match=r"no checkpoints found in .*replay_logs"):
        convert(str(source_root), str(dest_root), progress=False)


def test_source_does_not_exist(tmp_path):
    with pytest.raises(SourceNotFoundError, match=r"nowhere does not exist"):
        convert(str(tmp_path / "nowhere"), str(tmp_path / "out"), progress=False)


def test_unknown_game(pong_run, source_root, dest_root):
    with pytest.raises(
        SourceNotFoundError, match=r"games \['Qbert'\] not found .* found \['Pong'\]"
    ):
        convert(str(source_root), str(dest_root), games=["Qbert"], progress=False)


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "", "/abs"])
def test_names_that_escape_dest(pong_run, source_root, dest_root, name):
    with pytest.raises(InvalidNameError, match="is not a plain name"):
        convert(str(source_root), str(dest_root), games=[name], progress=False)
    with pytest.raises(InvalidNameError, match="is not a plain name"):
        convert(str(source_root), str(dest_root), runs=[name], progress=False)
    assert not dest_root.exists()


def test_directory_names_that_escape_dest_are_refused(source_root):
    (source_root / "..evil" / "1" / "replay_logs").mkdir(parents=True)
    with pytest.raises(InvalidNameError, match=r"'\.\.evil'"):
        find_runs(str(source_root))


def test_existing_complete_store(pong_run, source_root, dest_root):
    [first] = convert(str(source_root), str(dest_root), progress=False)
    with pytest.raises(
        StoreExistsError, match=r"already holds a complete store .* Pass --overwrite"
    ):
        convert(str(source_root), str(dest_root), progress=False)
    AtariZarrDataset(first.url)  # untouched and still complete
    [again] = convert(str(source_root), str(dest_root), overwrite=True, progress=False)
    assert again.transitions == first.transitions


def test_foreign_directory_is_not_overwritten(pong_run, source_root, dest_root):
    target = dest_root / "Pong" / "1.zarr"
    target.mkdir(parents=True)
    (target / "precious.txt").write_text("keep me")
    with pytest.raises(Exception, match="is not an atari_zarr store; refusing to write over it"):
        convert(str(source_root), str(dest_root), progress=False)
    assert (target / "precious.txt").read_text() == "keep me"


def test_padding_that_is_not_zero(pong_run, source_root, dest_root):
    """Data that breaks dopamine's padding rule is reported, not silently kept."""
    path = logs(source_root) / filename("action", 0)
    action = load_gz(path)
    action[0] = 5  # buffer row 0 of checkpoint 0 is source row 0: padding
    save_gz(path, action)
    with pytest.raises(SourceFormatError, match=r"buffer row 0 \(source row 0\) .* zero padding"):
        convert(str(source_root), str(dest_root), progress=False)


def test_run_source_reads_stream_in_blocks(pong_run):
    src = RunSource(pong_run.url, "Pong", "1")
    blocks = list(src.iter_observations(0, 64, block_rows=10))
    assert [b[0] for b in blocks] == [0, 10, 20, 30, 40, 50, 60]
    assert sum(len(b[1]) for b in blocks) == 64
