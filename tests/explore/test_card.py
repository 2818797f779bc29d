"""The dataset card: Hugging Face front matter, the stores, their source, and loading
lines that run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
from atari_zarr_testkit.gcs import CountingProxy, FakeGCSServer

from atari_zarr.catalog import write_catalog
from atari_zarr.cli import main
from atari_zarr.explore.card import size_category, write_card


def _run_python_blocks(text: str, tmp_path: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3  # atari_zarr, the TorchRL drop-in, plain zarr
    script = tmp_path / "load.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_card_for_a_local_root(pong_store_copy, tmp_path, capsys):
    pong_store = pong_store_copy
    root = Path(pong_store.url).parents[1]
    assert main(["card", str(root)]) == 0
    assert f"dataset card -> {root}/README.md" in capsys.readouterr().out
    text = (root / "README.md").read_text()
    front = text.split("---\n")[1]
    assert "license: cc-by-4.0" in front and "- reinforcement-learning" in front
    assert f"- {size_category(pong_store.transitions)}" in front and "- dqn-replay" in front
    assert f"| Pong/1 | dqn-replay | {pong_store.transitions:,} |" in text
    assert "dqn-replay from `" in text and "checkpoints converted" in text
    picture = root / "learning_curves.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 5000
    out = _run_python_blocks(text, tmp_path)
    assert "torch.Size([32, 84, 84]) torch.Size([32, 1])" in out and "['Pong/1']" in out
    assert f"zarr ({pong_store.transitions}, 84, 84) uint8 [" in out  # the plain zarr lines


def test_a_card_for_a_public_bucket_read_over_https(pong_store, tmp_path):
    """Converted into a bucket, indexed, the card written there; its lines read the
    stores over plain https (the catalog lists the root), as a visitor would."""
    with FakeGCSServer() as server, CountingProxy(server.endpoint_url) as proxy:
        server.create_bucket("public-card")
        fs = fsspec.filesystem("gs", skip_instance_cache=True, **server.storage_options())
        fs.put(pong_store.url, "public-card/atari/Pong/1.zarr", recursive=True)
        root, opts = "gs://public-card/atari", server.storage_options()
        write_catalog(root, opts)
        public = f"{proxy.endpoint_url}/public-card/atari"
        where = write_card(root, opts, public_url=public)
        assert where == f"{root}/README.md"
        text = fs.cat_file("public-card/atari/README.md").decode()
        assert f'AtariZarrDataset("{public}/Pong/1.zarr")' in text
        out = _run_python_blocks(text, tmp_path)
        assert "['Pong/1']" in out and f"zarr ({pong_store.transitions}, 84, 84) uint8" in out


def test_reader_options_are_in_the_loading_lines(pong_store, tmp_path):
    from atari_zarr.explore.card import card_text

    root = str(Path(pong_store.url).parents[1])
    text = card_text(root, public_url="gs://b/atari", reader_options={"token": "anon"})
    assert "AtariZarrDataset(\"gs://b/atari/Pong/1.zarr\", storage_options={'token': 'anon'})" in text
    from atari_zarr.errors import StoreNotFoundError

    with pytest.raises(StoreNotFoundError, match="nothing does not exist: expected"):
        card_text(str(tmp_path / "nothing"))


def test_card_and_index_refuse_a_store_or_a_game_directory(pong_store_copy, capsys):
    """A card or a catalog written inside a store, or in a game directory whose loading
    lines would name stores that are not there, is refused in one line."""
    store = Path(pong_store_copy.url)
    for root, expected in ((store, "is a store"), (store.parent, "a game directory")):
        for verb in ("card", "index"):
            assert main([verb, str(root)]) == 1
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and expected in err, err
    assert not (store / "README.md").exists() and not (store / "catalog.json").exists()
    assert not (store.parent / "README.md").exists()
    assert main(["index", str(store.parents[1]), "-q"]) == 0  # the root itself is fine


def test_a_hand_written_readme_is_never_overwritten(pong_store_copy, capsys):
    root = Path(pong_store_copy.url).parents[1]
    readme = root / "README.md"
    readme.write_text("# my notes\n")
    assert main(["card", str(root)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a card" in err and "--overwrite" in err
    assert readme.read_text() == "# my notes\n"
    assert main(["card", str(root), "-q", "--overwrite"]) == 0
    assert "<!-- written by `atari-zarr card`" in readme.read_text()
    assert main(["card", str(root), "-q"]) == 0  # its own card: refreshed without asking


def test_what_is_published_holds_no_planted_secret(pong_store_copy, capsys):
    """Secrets in the public URL and the reader's options never reach the card, the
    catalog, or what the commands print."""
    root = Path(pong_store_copy.url).parents[1]
    secrets = ["PW-hunter2-77", "SECRET-TOKEN-42"]
    assert main(["index", str(root)]) == 0
    assert main([
        "card", str(root), "--public-url", f"https://bob:{secrets[0]}@host.example/b",
        "--reader-option", f"token={secrets[1]}",
    ]) == 0
    printed = capsys.readouterr()
    written = [p.read_bytes() for p in root.rglob("*") if p.is_file()]
    for secret in secrets:
        for blob in (*written, printed.out.encode(), printed.err.encode()):
            assert secret.encode() not in blob
    card = (root / "README.md").read_text()
    assert "https://***@host.example/b/Pong/1.zarr" in card and "'token': '***'" in card


def test_card_q_of_a_root_without_a_finished_episode_prints_nothing(tmp_path, capsys):
    """`card -q` printed matplotlib's "No artists with labels found to put in legend"
    for a root whose stores hold no finished episode: it prints nothing."""
    from atari_zarr_testkit import write_fixture_run

    from atari_zarr import convert

    write_fixture_run(
        str(tmp_path / "src"), "Pong", "1", capacity=1000, steps=50, seed=1, max_episode_length=900
    )
    convert(str(tmp_path / "src"), str(tmp_path / "out"), progress=False)
    assert main(["card", str(tmp_path / "out"), "-q"]) == 0
    assert capsys.readouterr() == ("", "")
    assert (tmp_path / "out" / "learning_curves.png").stat().st_size > 0
