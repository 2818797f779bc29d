"""Summaries of stores: errors, the ``ls`` table, RL Unplugged stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from atari_zarr_testkit.rl_unplugged import replace_record, write_fixture_rlu

from atari_zarr import convert
from atari_zarr.cli import main
from atari_zarr.errors import AtariZarrError, StoreNotFoundError
from atari_zarr.info import format_info, format_store_list, store_info
from atari_zarr.layout import FINAL_OBSERVATION
from atari_zarr.sources.rl_unplugged.example import encode_episode


def test_info_of_what_is_not_a_store_is_one_line(tmp_path: Path) -> None:
    """``store_info`` opens a store as every reader does (``opening.open_store``)."""
    (tmp_path / "notes.zarr").mkdir()
    for where in (tmp_path / "Pong" / "1.zarr", tmp_path / "notes.zarr"):
        with pytest.raises(StoreNotFoundError, match=r"(does not exist|found none).*atari-zarr ls") as info:
            store_info(str(where))
        # one `except AtariZarrError` in the CLI handles it; callers catching the built-in too
        assert isinstance(info.value, AtariZarrError) and isinstance(info.value, FileNotFoundError)
        assert "\n" not in str(info.value) and str(where) in str(info.value)


def test_empty_listing() -> None:
    assert format_store_list([]) == "no stores found"


# -- RL Unplugged stores -----------------------------------------------------------------
@pytest.fixture(scope="module")
def rlu_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Shards 0 and 2 of 3 (1 is missing); record 0 of shard 2 claims a wrong return."""
    root = tmp_path_factory.mktemp("rlu")
    fixture = write_fixture_rlu(str(root / "src"), num_shards=3, present=(0, 2))
    example = fixture.episodes_of(2)[0].example()
    example.episode_return = 12345.0
    replace_record(fixture.paths[2], 0, encode_episode(example))
    [done] = convert(fixture.root, str(root / "out"), source_kind="rl-unplugged", progress=False)
    return done.url


def test_info_of_an_rl_unplugged_store(rlu_store: str) -> None:
    info = store_info(rlu_store)
    assert info["kind"] == "rl-unplugged" and info["game"] == "Asterix"
    assert info["checkpoints"] == [0, 2]  # the shards converted
    assert info["source_shards"] == {
        "num_shards": 3,
        "present": [0, 2],
        "missing": [1],
        "selected": [0, 2],
    }
    assert info["gaps"] == [{"from_shard": 1, "to_shard": 2, "shards": 1, "absent": [1]}]
    assert FINAL_OBSERVATION in info["optional_arrays"]
    [line] = info["return_disagreements"]
    assert line.startswith("1 of 4 episode_return values differ from the sum of the step rewards")
    assert "(shard 2, record 0): source 12345.0" in line
    text = format_info(info)
    assert "game/run     Asterix/1 (rl-unplugged, format v1)" in text
    assert "source       3 shards, 2 present, missing 1" in text
    assert "shards       2 converted (0,2)" in text
    assert "gaps         1: shards 1 (absent) not converted" in text
    assert f"WARNING      source returns: {line}" in text


def test_info_json_of_an_rl_unplugged_store_from_the_cli(
    rlu_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", rlu_store, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "rl-unplugged" and info["checkpoints"] == [0, 2]
    assert info["source_shards"]["missing"] == [1]
    assert "shard 2, record 0" in info["return_disagreements"][0]
    assert main(["info", rlu_store]) == 0
    assert "WARNING      source returns: 1 of 4 episode_return" in capsys.readouterr().out


def test_info_of_a_dqn_replay_store_has_no_shards(pong_store) -> None:
    info = store_info(pong_store.url)
    assert info["kind"] == "dqn-replay" and info["source_shards"] is None
    assert info["return_disagreements"] == []
    assert "checkpoints  " in format_info(info) and "shards" not in format_info(info)
