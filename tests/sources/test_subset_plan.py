"""Converting a subset of a run's episodes: rows chosen, renumbered, verified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import write_fixture_rlu

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.cli import main
from atari_zarr.episodes import source_parts
from atari_zarr.layout import ATTRS_KEY, FINAL_OBSERVATION
from atari_zarr.read.store import StoreReader
from atari_zarr.subsets import Subset, select_pieces
from atari_zarr.verify import verify_store


def expected_rows(full_url: str, subset: Subset, checkpoint_rows: int) -> tuple[np.ndarray, ...]:
    """Rows of the full store the subset keeps, and how each kept piece ends."""
    full = StoreReader(full_url)
    pieces = select_pieces(
        subset, source_parts(full.metadata), full.episodes, checkpoint_rows=checkpoint_rows
    )
    rows = np.concatenate(
        [np.arange(a, b) for a, b in zip(pieces.start, pieces.stop, strict=False)]
    )
    labels = np.array([p.checkpoint for p in source_parts(full.metadata)])
    return rows, pieces.length, pieces.terminated, labels[pieces.part]


def check_subset_store(sub_url: str, full_url: str, subset: Subset, checkpoint_rows: int) -> None:
    rows, lengths, terminated, checkpoints = expected_rows(full_url, subset, checkpoint_rows)
    full, sub = AtariZarrDataset(full_url), AtariZarrDataset(sub_url)
    assert len(sub) == len(rows) > 0
    a, b = full[rows], sub[np.arange(len(sub))]
    for key in ("observation", "action", ("next", "reward")):
        np.testing.assert_array_equal(b[key].numpy(), a[key].numpy(), err_msg=str(key))
    # episodes renumbered 0, 1, ...; each piece ends terminated or cut as chosen
    np.testing.assert_array_equal(b["episode"].numpy(), np.repeat(np.arange(len(lengths)), lengths))
    ends = np.cumsum(lengths) - 1
    done = b["next", "done"][:, 0].numpy()
    assert np.flatnonzero(done).tolist() == ends.tolist()
    np.testing.assert_array_equal(b["next", "terminated"][ends, 0].numpy(), terminated)
    np.testing.assert_array_equal(b["next", "truncated"][ends, 0].numpy(), ~terminated)
    table = sub.episode_table
    np.testing.assert_array_equal(table["length"].to_numpy(), lengths)
    np.testing.assert_allclose(
        table["return"].to_numpy(),
        np.add.reduceat(a["next", "reward"][:, 0].numpy(), ends - lengths + 1),
    )
    # each piece belongs to the checkpoint (shard) it was cut from
    np.testing.assert_array_equal(table["checkpoint"].to_numpy(), checkpoints)


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_fraction_of_a_dqn_run(pong_source, pong_store, tmp_path, fraction):
    root = str(Path(pong_source.url).parents[1])
    [store] = convert(root, str(tmp_path), fraction=fraction, progress=False)
    subset = Subset.fraction_of(fraction)
    check_subset_store(store.url, pong_store.url, subset, checkpoint_rows=pong_source.capacity)
    meta = zarr.open_group(store.url, mode="r").attrs[ATTRS_KEY]
    assert meta["selection"]["subset"] == subset.attributes()
    assert meta["conversion"]["subset"]["checkpoint_rows_used"] == pong_source.capacity
    assert f"--fraction {fraction}" in meta["command"]
    report = verify_store(store.url, source=root, progress=False)
    assert report.ok, report.format()
    # the parts of a subset store name their own rows: checkpoints stay usable
    parts = source_parts(meta)
    assert sum(p.rows for p in parts) == store.transitions


def test_decision_transformer_sampling_of_a_dqn_run(pong_source, pong_store, tmp_path):
    root = str(Path(pong_source.url).parents[1])
    subset = Subset.decision_transformer(3, 60, 2, seed=4)
    [store] = convert(root, str(tmp_path), subset=subset, progress=False)
    check_subset_store(store.url, pong_store.url, subset, checkpoint_rows=pong_source.capacity)
    assert AtariZarrDataset(store.url).episode_table["terminated"].all()  # whole trajectories
    assert verify_store(store.url, source=root, progress=False).ok


def test_verify_notices_another_subset(pong_source, tmp_path):
    root = str(Path(pong_source.url).parents[1])
    [store] = convert(root, str(tmp_path), fraction=0.5, progress=False)
    group = zarr.open_group(store.url, mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])
    meta["selection"] = {
        **meta["selection"],
        "subset": Subset.fraction_of(0.5, seed=9).attributes(),
    }
    group.attrs[ATTRS_KEY] = meta
    report = verify_store(store.url, source=root, progress=False)
    assert not report.ok and "differ" in report.format()


@pytest.fixture(scope="module")
def rlu(tmp_path_factory):
    fixture = write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=2, present=(0, 1))
    [full] = convert(fixture.root, str(tmp_path_factory.mktemp("full")), progress=False)
    return fixture, full.url


def test_fraction_of_rl_unplugged_shards(rlu, tmp_path):
    fixture, full_url = rlu
    # 220 steps of each shard: shard 0 keeps its cut episode and trims its terminal one
    # (seed 3), shard 1 keeps its terminal episode and trims its cut one
    subset = Subset.fraction_of(0.00022, seed=3)
    [store] = convert(fixture.root, str(tmp_path), subset=subset, progress=False)
    check_subset_store(store.url, full_url, subset, checkpoint_rows=1_000_000)
    assert verify_store(store.url, source=fixture.root, progress=False).ok
    # the frame after a terminated piece is the terminal frame; after a cut one, zeros
    sub = zarr.open_group(store.url, mode="r")
    finals = np.asarray(sub[FINAL_OBSERVATION][:])
    table = AtariZarrDataset(store.url).episode_table
    truth = fixture.truth()
    rows, lengths, _terminated, _ = expected_rows(full_url, subset, 1_000_000)
    ends = rows[np.cumsum(lengths) - 1]  # the last row of each piece, in the full store
    full_eps = AtariZarrDataset(full_url)[ends]["episode"].numpy()
    for e, row in table.iterrows():
        if row["terminated"]:
            np.testing.assert_array_equal(finals[e], truth.final_observation[full_eps[e]])
            assert finals[e].any()
        else:
            assert not finals[e].any()
    assert table["terminated"].any() and not table["terminated"].all()
    assert len(truth) > len(AtariZarrDataset(store.url))
    assert {"checkpoint_idx", "episode_idx"} <= set(sub.attrs[ATTRS_KEY]["episodes"])


def test_cli_subsets_and_bad_values(pong_source, tmp_path, capsys):
    root = str(Path(pong_source.url).parents[1])
    assert main(["convert", root, str(tmp_path / "a"), "--fraction", "0.5", "-q"]) == 0
    assert (
        main(["convert", root, str(tmp_path / "b"), "--dt-buffers", "2", "--dt-steps", "40", "-q"])
        == 0
    )
    meta = zarr.open_group(str(tmp_path / "b" / "Pong" / "1.zarr"), mode="r").attrs[ATTRS_KEY]
    assert meta["selection"]["subset"]["num_buffers"] == 2
    assert meta["selection"]["subset"]["trajectories_per_buffer"] == 10
    capsys.readouterr()
    assert main(["convert", root, str(tmp_path / "c"), "--fraction", "1.5"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "fraction must be in (0, 1]; got 1.5" in err
    assert main(["convert", root, str(tmp_path / "d"), "--dt-buffers", "99"]) == 1
    err = capsys.readouterr().err
    assert "num_buffers 99 is larger than the" in err and str(root) in err
    assert main(["convert", root, str(tmp_path / "e"), "--fraction", "0.5", "--dt-steps", "9"]) == 1
    assert "two different subsets" in capsys.readouterr().err
    json.dumps(meta)  # the recorded subset is plain JSON
