"""Resolution as a list of steps, and ``open_request``: the one door of every drop-in."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from atari_zarr.catalog import CATALOG, write_catalog
from atari_zarr.pull import Request, open_request, resolve
from atari_zarr.pull.resolution import STEPS


def _stale_catalog(root: Path) -> None:
    """``root``'s catalog, written, then made to disagree with its store (as when a
    store is replaced after the root was indexed)."""
    write_catalog(str(root))
    path = root / CATALOG
    doc = json.loads(path.read_text())

    def spoil(node: object) -> None:
        if isinstance(node, dict):
            if "content" in node:
                node["content"] = "0" * 16
            for value in node.values():
                spoil(value)
        elif isinstance(node, list):
            for value in node:
                spoil(value)

    spoil(doc)
    path.write_text(json.dumps(doc))


def test_the_steps_are_local_source_cache_mirrors_public_copy():
    assert [s.__name__ for s in STEPS] == [
        "in_local_source",
        "in_cache",
        "in_mirrors",
        "from_public_copy",
    ]


def test_open_request_opens_the_store_found_and_says_where(pong_store_copy, dest_root):
    ds, found = open_request(Request.parse("Pong/1"), home=dest_root, download=False)
    assert (found.origin, found.url) == ("cache", pong_store_copy.url)
    assert len(ds) == pong_store_copy.transitions
    # a store named is opened as it is, nothing resolved
    ds2, given = open_request(Request.parse("store"), store=pong_store_copy.url)
    assert (given.origin, len(ds2)) == ("given", len(ds))


def test_a_stale_catalog_entry_is_told_once_by_open_request(pong_store_copy, dest_root):
    _stale_catalog(dest_root)
    with pytest.warns(UserWarning, match="changed since its root's catalog.json") as told:
        open_request(Request.parse("Pong/1"), home=dest_root, download=False)
    assert len([w for w in told if "catalog.json" in str(w.message)]) == 1


@pytest.mark.parametrize("loader", ["torchrl", "decision_transformer"])
def test_every_drop_in_checks_the_catalog_entry_of_what_it_opens(
    loader, pong_store_copy, dest_root
):
    """The Decision Transformer's loader did not check it before it went through
    ``open_request``; TorchRL's did, on its own."""
    _stale_catalog(dest_root)
    with pytest.warns(UserWarning, match="changed since its root's catalog.json") as told:
        if loader == "torchrl":
            pytest.importorskip("torchrl")
            from atari_zarr.torchrl import AtariZarrExperienceReplay

            AtariZarrExperienceReplay("Pong/1", batch_size=4, root=dest_root, download=False)
        else:
            from atari_zarr.compat.decision_transformer import create_dataset

            create_dataset(2, 40, "Pong", None, 1, home=dest_root, download=False)
    assert len([w for w in told if "catalog.json" in str(w.message)]) == 1


def test_a_local_source_comes_before_the_cache(pong_store_copy, dest_root, tmp_path):
    """The loader's own root (the Decision Transformer's ``data_dir_prefix``) is read
    before the cache: it is what the original loader reads."""
    local = tmp_path / "local"
    (local / "Pong").mkdir(parents=True)
    shutil.copytree(pong_store_copy.url, local / "Pong" / "1.zarr")
    found = resolve(Request.parse("Pong/1"), home=dest_root, local_source=local, download=False)
    assert (found.origin, Path(found.url)) == ("local", local / "Pong" / "1.zarr")


def test_a_local_source_of_dqn_replay_files_is_converted_beside_them(pong_run, source_root):
    """``{root}/{Game}/{run}/replay_logs``, as the loader spelled the game, becomes
    ``{root}/{Game}/{run}.zarr`` once; the second resolution reads that store."""
    first = resolve(Request.parse("Pong/1"), home=source_root / "home", local_source=source_root)
    assert first.origin == "local" and Path(first.url) == source_root / "Pong" / "1.zarr"
    again = resolve(Request.parse("Pong/1"), home=source_root / "home", local_source=source_root)
    assert again.url == first.url
    ds, _ = open_request(Request.parse("Pong/1"), store=again.url)
    truth = pong_run.truth()
    assert np.array_equal(ds.read_steps(np.arange(len(ds)))["action"], truth.action)


def test_a_hub_mirror_serves_a_run_before_anything_is_pulled(
    public_copy, pong_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ATARI_ZARR_MIRRORS=hf://datasets/ORG/NAME`` (and a drop-in's ``mirrors=``): the
    run is read from the Hub repo in place, RL Unplugged's copy is never asked."""
    pytest.importorskip("huggingface_hub")
    from atari_zarr_testkit.hub import HubEmulator

    from atari_zarr import AtariZarrDataset
    from atari_zarr.torchrl import AtariZarrExperienceReplay

    repo = tmp_path / "repo"
    shutil.copytree(pong_store.url, repo / "Pong" / "1.zarr")
    write_catalog(str(repo))
    with HubEmulator({"org/atari": repo}) as hub:
        options = hub.storage_options()
        monkeypatch.setenv("ATARI_ZARR_MIRRORS", "hf://datasets/org/atari")
        found = resolve(Request.parse("Pong/1"), mirror_options=options)
        assert (found.origin, found.url) == ("mirror", "hf://datasets/org/atari/Pong/1.zarr")
        monkeypatch.delenv("ATARI_ZARR_MIRRORS")
        replay = AtariZarrExperienceReplay(
            "Pong/1", batch_size=16, mirrors="hf://datasets/org/atari", storage_options=options
        )
        assert replay.origin == "mirror"
        local = AtariZarrDataset(pong_store.url)
        got = replay._storage[np.arange(20)]  # the TorchRL storage over the Hub's store
        np.testing.assert_array_equal(
            got["observation"].numpy(), local[np.arange(20)]["observation"].numpy()
        )
    assert public_copy.proxy.requests == 0


@pytest.mark.parametrize("bad", ["foo://x", "http://[::1/stores"])
def test_a_mirror_that_is_no_url_is_one_line_naming_where_it_was_given(
    bad, pong_store, tmp_path, monkeypatch, capsys
):
    """A mirror in ``$ATARI_ZARR_MIRRORS`` that is no URL: ``http://[::1`` was a raw
    ``ValueError`` traceback, and an unknown protocol a line that named no mirror."""
    from atari_zarr.cli import main

    monkeypatch.setenv("ATARI_ZARR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ATARI_ZARR_MIRRORS", f"{bad},{Path(pong_store.url).parent.parent}")
    assert main(["pull", "Pong/1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"the mirror {bad} (mirrors= or $ATARI_ZARR_MIRRORS)" in err, err
    assert not (tmp_path / "home").exists()
