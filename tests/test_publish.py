"""``atari-zarr publish``: a root uploaded to a Hub dataset repo through huggingface_hub's
own commits, against the test kit's emulator of the Hub (its LFS upload endpoints: Xet's
protocol is not emulated, so these tests turn Xet off as ``HF_HUB_DISABLE_XET=1`` does)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from atari_zarr_testkit.hub import HubEmulator

from atari_zarr import AtariZarrDataset, MultiGameDataset
from atari_zarr.errors import (
    InvalidArgumentError,
    RemoteAccessError,
    StoreChangedError,
    StoreCorruptError,
    StoreExistsError,
)
from atari_zarr.explore.card import MARK

hub_lib = pytest.importorskip("huggingface_hub")

from atari_zarr.publish import check_hub_limits, publish, upload_plan  # noqa: E402

TOKEN = "hf_writeTokenValue42"


@pytest.fixture(autouse=True)
def no_xet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("ATARI_ZARR_HOME", str(tmp_path / "home"))


@pytest.fixture
def root(pong_store, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(pong_store.url, root / "Pong" / "1.zarr")
    return root


@pytest.fixture
def hub(tmp_path: Path):
    with HubEmulator({}, new_repos=tmp_path / "hub", write_token=TOKEN) as hub:
        yield hub


def _options(hub: HubEmulator) -> dict:
    return {"endpoint": hub.endpoint, "token": TOKEN}


def test_a_root_is_published_store_first_catalog_last_and_reads_back_exactly(
    pong_store, root: Path, hub: HubEmulator
) -> None:
    done = publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    assert done.stores == ("Pong/1.zarr",) and done.commits == 2
    repo = hub.repos["org/atari"]
    for name, local in upload_plan(str(root)).items():
        assert (repo / name).read_bytes() == local.read_bytes(), name
    (_, stores), (_, last) = hub.commits
    assert "catalog.json" not in stores and all(p.startswith("Pong/1.zarr/") for p in stores)
    assert set(last) >= {"catalog.json", "README.md"}
    # the card's front matter passed the Hub's validation (the emulator refuses a bad one)
    assert ("POST", "/api/validate-yaml", 200) in hub.log
    card = (repo / "README.md").read_text()
    assert card.startswith("---\nlicense: cc-by-4.0\n")
    assert "hf://datasets/org/atari/Pong/1.zarr" in card
    # read back through hf://, the store and the catalogued root
    remote = AtariZarrDataset("hf://datasets/org/atari/Pong/1.zarr", storage_options=_options(hub))
    local = AtariZarrDataset(pong_store.url)
    rows = np.random.default_rng(0).integers(0, len(local), 50)
    np.testing.assert_array_equal(remote[rows]["observation"], local[rows]["observation"])
    mixed = MultiGameDataset.from_root("hf://datasets/org/atari", storage_options=_options(hub))
    assert len(mixed) == len(local)


def test_publishing_again_sends_nothing_and_commits_nothing(root: Path, hub: HubEmulator) -> None:
    publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    uploads = sum(1 for _, path, _ in hub.log if path.startswith("/lfs-upload/"))
    again = publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    assert again.commits == 0 and len(hub.commits) == 2
    assert sum(1 for _, path, _ in hub.log if path.startswith("/lfs-upload/")) == uploads


def test_an_unfinished_store_is_never_published(root: Path, hub: HubEmulator) -> None:
    shutil.copytree(root / "Pong" / "1.zarr", root / "Pong" / "2.zarr.converting")
    done = publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    assert done.stores == ("Pong/1.zarr",)
    assert not list(hub.repos["org/atari"].glob("Pong/2*"))


def test_a_private_repo_is_read_only_with_the_token(root: Path, hub: HubEmulator) -> None:
    publish(str(root), "hf://datasets/org/secret", storage_options=_options(hub), private=True)
    url = "hf://datasets/org/secret/Pong/1.zarr"
    with pytest.raises(RemoteAccessError, match="401") as err:
        AtariZarrDataset(url, storage_options={"endpoint": hub.endpoint, "token": False})
    assert TOKEN not in str(err.value)
    assert len(AtariZarrDataset(url, storage_options=_options(hub))) > 0


def test_a_refused_token_is_one_line_without_the_token(root: Path, hub: HubEmulator) -> None:
    with pytest.raises(RemoteAccessError) as err:
        publish(
            str(root),
            "hf://datasets/org/atari",
            storage_options={"endpoint": hub.endpoint, "token": "hf_notTheRightOne7"},
        )
    message = str(err.value)
    assert "hf_notTheRightOne7" not in message and "\n" not in message
    assert "401" in message and "HF_TOKEN" in message
    with pytest.raises(InvalidArgumentError, match="datasets/"):
        publish(str(root), "hf://models/org/atari", storage_options=_options(hub))
    with pytest.raises(InvalidArgumentError, match="no complete store Pong/7"):
        publish(
            str(root), "hf://datasets/org/atari", names=["Pong/7"], storage_options=_options(hub)
        )


def test_a_50m_run_fits_the_hubs_folder_and_file_limits() -> None:
    """A 50M-row store's metadata (nothing written): every folder under 10,000 entries, so
    a game's five runs fit one repo; the 4096-frame shards of smaller runs would not."""
    import zarr
    from zarr.storage import MemoryStore

    from atari_zarr.layout import ARRAYS, OBSERVATION, create_store
    from atari_zarr.shard_format import object_key

    group = create_store(MemoryStore(), 50_000_000, {"game": "Pong", "run": "1"})
    paths = ["Pong/1.zarr/zarr.json"]
    for name in ARRAYS:
        array = group[name]
        assert isinstance(array, zarr.Array)
        unit = (array.shards or array.chunks)[0]
        paths.append(f"Pong/1.zarr/{name}/zarr.json")
        for u in range(math.ceil(array.shape[0] / unit)):
            paths.append(f"Pong/1.zarr/{object_key(name, u, array.ndim - 1)}")
    assert group[OBSERVATION].shards[0] == 8192  # type: ignore[union-attr]
    limits = check_hub_limits(paths)
    assert limits.fullest == "Pong/1.zarr/observation/c" and limits.entries == 6104
    runs = [p.replace("Pong/1.zarr", f"Pong/{r}.zarr") for r in range(1, 6) for p in paths]
    assert check_hub_limits(runs).files == 5 * len(paths) < 100_000
    old = [f"Pong/1.zarr/observation/c/{u}/0/0" for u in range(math.ceil(50_000_000 / 4096))]
    with pytest.raises(InvalidArgumentError, match="12,208 entries"):
        check_hub_limits(old)
    with pytest.raises(InvalidArgumentError, match="100,000 per repo"):
        check_hub_limits(p.replace("Pong/", f"Pong{g}/") for g in range(10) for p in runs)


def test_the_command_line_publishes_quietly(root: Path, hub: HubEmulator) -> None:
    env = {**os.environ, "HF_HUB_DISABLE_XET": "1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "atari_zarr",
            "publish",
            str(root),
            "hf://datasets/org/cli",
            "--no-progress",
            "--storage-option",
            f"endpoint={hub.endpoint}",
            "--storage-option",
            f"token={TOKEN}",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("published 1 store (") and "hf://datasets/org/cli" in run.stdout
    assert run.stderr == ""
    assert (hub.repos["org/cli"] / "catalog.json").is_file()


def test_some_stores_are_published_with_their_own_catalog_and_card(
    root: Path, hub: HubEmulator
) -> None:
    shutil.copytree(root / "Pong" / "1.zarr", root / "Pong" / "2.zarr")
    done = publish(
        str(root), "hf://datasets/org/atari/some", names=["Pong/2"], storage_options=_options(hub)
    )
    assert done.stores == ("Pong/2.zarr",)
    repo = hub.repos["org/atari"] / "some"
    assert not (repo / "Pong" / "1.zarr").exists() and (repo / "Pong" / "2.zarr").is_dir()
    catalog = json.loads((repo / "catalog.json").read_text())
    assert [e["path"] for e in catalog["stores"]] == ["Pong/2.zarr"]
    card = (repo / "README.md").read_text()
    # one row in the card's table (the copy says run 1 in its attributes: its row does too)
    assert sum(line.startswith("| Pong/") for line in card.splitlines()) == 1
    assert "hf://datasets/org/atari/some/Pong/2.zarr" in card


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` with its size and modification time."""
    return {
        p.relative_to(root).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def test_a_readme_the_repo_holds_is_replaced_only_with_overwrite(
    root: Path, tmp_path: Path
) -> None:
    """As ``card`` refuses a README it did not write, so does ``publish`` (before anything
    is sent); ``overwrite=True`` replaces it, and a card of ours is refreshed freely."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "README.md").write_text("# Our dataset\n\nWritten by hand.\n")
    with HubEmulator({"org/atari": theirs}, write_token=TOKEN) as hub:
        with pytest.raises(StoreExistsError) as err:
            publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
        assert "README.md" in str(err.value) and "--overwrite" in str(err.value)
        assert "\n" not in str(err.value) and not hub.commits
        assert (theirs / "README.md").read_text().startswith("# Our dataset")
        publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub), overwrite=True)
        assert MARK in (theirs / "README.md").read_text()
        again = publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    assert again.stores == ("Pong/1.zarr",)


def test_only_the_files_a_stores_metadata_names_are_uploaded(root: Path, hub: HubEmulator) -> None:
    store = root / "Pong" / "1.zarr"
    (store / "notes.txt").write_text("private notes")
    (store / "action" / "c" / "old-copy").write_bytes(b"stray")
    plan = upload_plan(str(root))
    assert not [p for p in plan if "notes" in p or "old-copy" in p]
    publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    repo = hub.repos["org/atari"]
    assert not (repo / "Pong/1.zarr/notes.txt").exists()
    assert not (repo / "Pong/1.zarr/action/c/old-copy").exists()
    sent = {p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()}
    assert sent == set(plan) | {"catalog.json", "README.md", "learning_curves.png"}


@pytest.mark.parametrize("damage", ["link", "missing shard", "crc32c"])
def test_a_store_that_fails_verify_is_never_published(
    root: Path, hub: HubEmulator, tmp_path: Path, damage: str
) -> None:
    """A link inside a store (to a file of the machine), a frame shard missing, a chunk
    failing its crc32c: refused in one line before the Hub hears of it."""
    store = root / "Pong" / "1.zarr"
    shard = store / "observation" / "c" / "0" / "0" / "0"
    if damage == "link":
        private = tmp_path / "passwd"
        private.write_text("root:x:0:0:root:/root:/bin/bash\n")
        (store / "action" / "c" / "0").unlink()
        (store / "action" / "c" / "0").symlink_to(private)
    elif damage == "missing shard":
        shard.unlink()
    else:
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    before = _files(root)
    with pytest.raises(StoreCorruptError) as err:
        publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    message = str(err.value)
    assert str(store) in message and "verify" in message and "\n" not in message
    assert hub.log == [] and "org/atari" not in hub.repos
    assert _files(root) == before


def test_a_publish_the_hub_refuses_leaves_the_root_as_it_was(root: Path, hub: HubEmulator) -> None:
    before = _files(root)
    with pytest.raises(RemoteAccessError):
        publish(
            str(root),
            "hf://datasets/org/atari",
            storage_options={"endpoint": hub.endpoint, "token": "hf_notTheRightOne7"},
        )
    assert _files(root) == before and not (root / "catalog.json").exists()
    # published, the root is still as it was: the repo has the catalog, the root none
    publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    assert _files(root) == before
    assert (hub.repos["org/atari"] / "catalog.json").is_file()


def _start_over(store: Path) -> None:
    """What a conversion started over (``convert --overwrite``) does first: the store is
    no longer marked complete."""
    meta = json.loads((store / "zarr.json").read_text())
    meta["attributes"]["atari_zarr"]["complete"] = False
    (store / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("change", ["written again", "removed", "a link"])
def test_a_store_changed_while_it_is_published_is_never_listed(
    root: Path, hub: HubEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A store converted again while its files go up (between two of publish's commits):
    refused in one line, not as damage, nothing of another place sent, and the catalog
    and card never sent, so the repo never lists a mixture as a published store."""
    plan = upload_plan(str(root))
    last = root / max(plan)  # sent in the last commit of the store's files
    private = tmp_path / "private"
    private.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    real = hub_lib.HfApi.create_commit

    def commit_then_change(self, *args, **kwargs):  # the other writer, between commits
        done = real(self, *args, **kwargs)
        if last.is_file() and not last.is_symlink():
            last.unlink()
            if change == "written again":
                last.write_bytes(b"written again")
            elif change == "a link":
                last.symlink_to(private)
        return done

    monkeypatch.setattr(hub_lib.HfApi, "create_commit", commit_then_change)
    with pytest.raises(StoreChangedError) as err:
        publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub), batch_files=4)
    message = str(err.value)
    assert max(plan) in message and "not damage" in message and "\n" not in message
    repo = hub.repos["org/atari"]
    assert not (repo / "catalog.json").exists() and not (repo / "README.md").exists()
    assert not [p for p in repo.rglob("*") if p.is_file() and b"root:x" in p.read_bytes()]


def test_a_store_started_over_while_it_is_checked_is_not_called_damaged(
    root: Path, hub: HubEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion started over on a store while publish verifies it: refused as a store
    being written again, never as damage, and nothing is sent."""
    import atari_zarr.verify

    store = root / "Pong" / "1.zarr"
    real = atari_zarr.verify.verify_store

    def start_over_then_verify(url, **kwargs):  # the other writer, as the check begins
        _start_over(store)
        (store / "observation" / "c" / "0" / "0" / "0").unlink()
        return real(url, **kwargs)

    monkeypatch.setattr(atari_zarr.verify, "verify_store", start_over_then_verify)
    with pytest.raises(StoreChangedError) as err:
        publish(str(root), "hf://datasets/org/atari", storage_options=_options(hub))
    message = str(err.value)
    assert str(store) in message and "damage" not in message.replace("not damage", "")
    assert "being written again" in message and "\n" not in message
    assert hub.log == []
