"""Episodes that began outside the store are fragments, and say where they really start."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from atari_zarr_testkit import write_fixture_run

from atari_zarr import AtariZarrDataset, convert
from atari_zarr.episodes import checkpoint_summary
from atari_zarr.layout import ATTRS_KEY, SOURCE_ROW
from atari_zarr.verify import verify_store


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One run (capacity 64, episodes up to 60 steps): whole, checkpoints 0,2,3, and a gap."""
    root = tmp_path_factory.mktemp("frag")
    src = root / "src"
    write_fixture_run(str(src), "Pong", "1", capacity=64, steps=420, seed=5, max_episode_length=60)
    [full] = convert(str(src), str(root / "full"), progress=False)
    [part] = convert(str(src), str(root / "part"), checkpoints="0,2,3", progress=False)
    gap_src = root / "gap"
    shutil.copytree(src, gap_src)
    for f in (gap_src / "Pong" / "1" / "replay_logs").glob("*_ckpt.1.gz"):
        f.unlink()  # checkpoint 1 lost: its rows are a gap, what follows starts unknown
    [gap] = convert(str(gap_src), str(root / "gapped"), progress=False)
    return {"full": full.url, "part": part.url, "gap": gap.url}


def truth(full_url: str) -> dict[int, int]:
    """True step of every source row, from the whole run."""
    ds = AtariZarrDataset(full_url)
    src = zarr.open_group(full_url, mode="r")[SOURCE_ROW][:]
    table = ds.episode_table
    assert (table["first_step"] == 0).all()  # every episode of the whole run is whole
    steps = np.arange(len(src)) - np.repeat(table["first_row"].to_numpy(), table["length"])
    return dict(zip(src.tolist(), steps.tolist(), strict=True))


def test_a_checkpoint_left_out_gives_fragments_with_their_true_first_step(stores) -> None:
    step_of = truth(stores["full"])
    ds = AtariZarrDataset(stores["part"])
    table = ds.episode_table
    src = zarr.open_group(stores["part"], mode="r")[SOURCE_ROW][:]
    firsts = src[table["first_row"].to_numpy()]
    want = np.array([step_of[int(r)] for r in firsts])
    assert table["first_step"].tolist() == want.tolist()
    assert (want > 0).any()  # the episode that resumes after checkpoint 1 is a fragment
    assert table["fragment"].tolist() == (want != 0).tolist()
    assert verify_store(stores["part"]).ok


def test_windows_count_true_steps_and_flag_fragments(stores) -> None:
    step_of = truth(stores["full"])
    ds = AtariZarrDataset(stores["part"])
    src = zarr.open_group(stores["part"], mode="r")[SOURCE_ROW][:]
    w = ds.windows(3)
    batch = w[np.arange(len(w))]
    rows = batch["index"].numpy()
    want = np.vectorize(lambda r: step_of[int(src[r])])(rows)
    assert batch["timestep"].numpy().tolist() == want.tolist()
    frag_eps = set(np.flatnonzero(ds.episode_table["fragment"].to_numpy()).tolist())
    want_flag = np.isin(batch["episode"].numpy(), list(frag_eps))
    assert batch["fragment"].numpy().tolist() == want_flag.tolist() and want_flag.any()
    streamed = list(w.stream(16, seed=0))
    for b in streamed:  # the stream gives the same fields
        r = b["index"].numpy()
        got = b["timestep"].numpy()
        assert got.tolist() == np.vectorize(lambda x: step_of[int(src[x])])(r).tolist()
    e = int(min(frag_eps))
    ep = ds.episode(e)
    assert bool(ep["fragment"].all()) and int(ep["timestep"][0]) == ds.episode_table["first_step"][e]
    assert ep["timestep"].tolist() == [step_of[int(src[r])] for r in ep["index"].tolist()]
    assert not bool(ds.episode(0)["fragment"].any()) and int(ds.episode(0)["timestep"][0]) == 0


def test_after_a_missed_log_the_start_is_unknown(stores) -> None:
    ds = AtariZarrDataset(stores["gap"])
    table = ds.episode_table
    gaps = ds.metadata["conversion"]["gaps"]
    assert gaps  # checkpoint 1 is missing: a gap
    src = zarr.open_group(stores["gap"], mode="r")[SOURCE_ROW][:]
    after = int(np.flatnonzero(src[table["first_row"].to_numpy()] >= gaps[0]["to_row"])[0])
    assert int(table["first_step"][after]) in (-1, 0)
    if table["first_step"][after] == -1:
        assert bool(table["fragment"][after])
        w = ds.windows(1)
        item = w[int(np.flatnonzero(w.starts(np.arange(len(w))) == table["first_row"][after])[0])]
        assert int(item["timestep"][0]) == 0 and bool(item["fragment"][0])
    assert verify_store(stores["gap"]).ok


def test_learning_curves_leave_fragments_and_cut_episodes_out(stores) -> None:
    meta = AtariZarrDataset(stores["part"]).metadata
    rows = checkpoint_summary(meta)
    table = AtariZarrDataset(stores["part"]).episode_table
    assert sum(r["fragments"] for r in rows) == int(table["fragment"].sum()) > 0
    for r in rows:
        assert r["complete"] + r["cut"] + r["fragments"] == r["episodes"]
    whole = table[table["terminated"] & ~table["fragment"]]
    for r in rows:
        mine = whole[whole["checkpoint"] == r["checkpoint"]]
        if len(mine):
            assert r["return_mean"] == pytest.approx(mine["return"].mean())


def test_verify_catches_a_wrong_first_step(stores, tmp_path) -> None:
    copy = Path(shutil.copytree(stores["full"], tmp_path / "1.zarr"))
    group = zarr.open_group(str(copy), mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])
    episodes = dict(meta["episodes"])
    terminated = episodes["terminated"]
    k = next(i for i in range(1, len(terminated)) if terminated[i - 1])
    episodes["first_step"] = list(episodes["first_step"])
    episodes["first_step"][k] = 7  # a whole episode called a fragment
    meta["episodes"] = episodes
    group.attrs[ATTRS_KEY] = meta
    zarr.consolidate_metadata(str(copy))
    report = verify_store(str(copy))
    assert not report.ok and f"episode {k} begins right after a terminal row" in report.format()


def test_the_decision_transformer_takes_a_fragment_as_the_original_does(stores) -> None:
    from atari_zarr.compat.decision_transformer import create_dataset

    data = create_dataset(2, 200, store=stores["part"], trajectories_per_buffer=3, download=False)
    ds = AtariZarrDataset(stores["part"])
    flags = ds.episode_table["fragment"].to_numpy()
    episodes = ds[np.asarray(data.pieces.start)]["episode"].numpy()
    assert data.fragments.tolist() == flags[episodes].tolist()
    assert data.fragments.any()  # checkpoint 2 opens with the fragment, drawn first
    # its timesteps count from 0, as the original's do for the tail of an episode
    first = int(np.flatnonzero(data.fragments)[0])
    start = 0 if first == 0 else int(data.done_idxs[first - 1])
    assert int(data.timesteps[start]) == 0


def test_a_fragments_video_captions_count_its_true_steps(stores) -> None:
    """The caption says the step the episode table says, not 0."""
    pytest.importorskip("PIL")
    from atari_zarr.explore.video import EpisodeFrames

    ds = AtariZarrDataset(stores["part"])
    table = ds.episode_table
    e = int(np.flatnonzero((table["first_step"] > 0).to_numpy())[0])
    lines = EpisodeFrames(ds, e).captions()
    first = int(table["first_step"][e])
    assert lines[0].startswith(f"step {first} ") and lines[-1].startswith(
        f"step {first + len(lines) - 1} "
    )
