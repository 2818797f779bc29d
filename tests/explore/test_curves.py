"""Learning curves: episode statistics per source checkpoint, against the fixtures' truth."""

from __future__ import annotations

import json

import numpy as np
import pytest
from atari_zarr_testkit.rl_unplugged import write_fixture_rlu

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.cli import main
from atari_zarr.episodes import checkpoint_summary
from atari_zarr.explore.curves import learning_curve, plot_learning_curves


def _truth_rows(groups: dict[int, list[tuple[float, int, bool, bool]]], what: str) -> list[dict]:
    """Per group of (return, length, terminated, fragment): statistics of whole episodes
    played to their end; cut episodes and fragments counted apart."""
    rows = []
    for label in sorted(groups):
        whole = [(r, n) for r, n, t, f in groups[label] if t and not f]
        returns = np.array([r for r, _ in whole])
        lengths = np.array([n for _, n in whole])
        def stat(fn, values=returns):
            return float(fn(values)) if len(values) else None

        rows.append(
            {
                "checkpoint": label,
                "episodes": len(groups[label]),
                "complete": len(whole),
                "cut": sum(1 for _, _, t, f in groups[label] if not t and not f),
                "fragments": sum(1 for *_, f in groups[label] if f),
                "return_mean": stat(np.mean),
                "return_median": stat(np.median),
                "return_q25": stat(lambda v: np.quantile(v, 0.25)),
                "return_q75": stat(lambda v: np.quantile(v, 0.75)),
                "return_min": stat(np.min),
                "return_max": stat(np.max),
                "length_mean": stat(np.mean, lengths),
                "returns": what,
            }
        )
    return rows


def _close(got: list[dict], want: list[dict]) -> None:
    assert [r["checkpoint"] for r in got] == [r["checkpoint"] for r in want]
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for key, value in w.items():
            if value is None or key == "returns":
                assert g[key] == value, key
            else:
                assert g[key] == pytest.approx(value, rel=1e-5), key


def test_dqn_replay_per_checkpoint_against_the_truth(pong_store, pong_truth):
    """Episodes from the truth's rows, each counted at the checkpoint of its first row
    (the checkpoints' row ranges, as the converter recorded them)."""
    meta = AtariZarrDataset(pong_store.url).metadata
    parts = meta["conversion"]["checkpoints"]
    starts = np.array([p["first_transition"] for p in parts])
    groups: dict[int, list[tuple[float, int, bool, bool]]] = {}
    for e in np.unique(pong_truth.episode):
        rows = np.flatnonzero(pong_truth.episode == e)
        suffix = parts[int(np.searchsorted(starts, rows[0], side="right")) - 1]["suffix"]
        ended = bool(pong_truth.terminated[rows[-1]])
        groups.setdefault(suffix, []).append(
            (float(pong_truth.reward[rows].sum()), len(rows), ended, False)
        )
    assert len(groups) >= 2  # a learning curve has more than one point
    assert any(not t for g in groups.values() for _, _, t, _ in g)  # cut ones, left out
    _close(checkpoint_summary(meta), _truth_rows(groups, "rewards"))


def test_rl_unplugged_per_shard_against_the_truth(tmp_path):
    fixture = write_fixture_rlu(str(tmp_path / "src"), num_shards=4, present=(0, 1, 3))
    [store] = convert(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    truth = fixture.truth()
    groups: dict[int, list[tuple[float, int, bool, bool]]] = {}
    last_ended: dict[int, bool] = {}
    for shard, ret, n, ended in zip(
        truth.checkpoint_idx, truth.episode_return, truth.length, truth.episode_terminated,
        strict=True,
    ):
        shard = int(shard)
        # the episode opening a shard is whole only after a shard converted whose last
        # episode ended (docs/format.md, "Fragments")
        fragment = shard not in groups and shard > 0 and not last_ended.get(shard - 1, False)
        groups.setdefault(shard, []).append((float(ret), int(n), bool(ended), fragment))
        last_ended[shard] = bool(ended)
    label, rows = learning_curve(store.url)
    assert label == "Asterix/1"
    _close(rows, _truth_rows(groups, "source"))  # the game's scores, not clipped sums


def test_info_checkpoints_and_json(pong_store, capsys):
    assert main(["info", pong_store.url, "--checkpoints"]) == 0
    text = capsys.readouterr().out
    rows = checkpoint_summary(AtariZarrDataset(pong_store.url).metadata)
    assert "checkpoint  episodes    mean  median     min     max  mean length" in text
    for row in rows:
        assert f"\n{row['checkpoint']:>10}  {row['episodes']:>8,}  {row['return_mean']:>6.1f}" in text
    assert main(["info", pong_store.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_stats"] == json.loads(json.dumps(rows))


def test_the_plot_draws_one_line_per_run(pong_store, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    ax = plot_learning_curves([pong_store.url, AtariZarrDataset(pong_store.url)])
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["Pong/1", "Pong/1"]
    rows = checkpoint_summary(AtariZarrDataset(pong_store.url).metadata)
    np.testing.assert_allclose(lines[0].get_ydata(), [r["return_mean"] for r in rows])
    ax.figure.savefig(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 1000
