"""The registry of source kinds: detection by layout, kinds by name, selections."""

from __future__ import annotations

import shutil

import pytest

from atari_zarr.errors import InvalidArgumentError, SourceFormatError, SourceNotFoundError
from atari_zarr.sources.registry import KINDS, Selection, detect_kind, get_kind
from atari_zarr.sources.rl_unplugged.files import RluRun
from atari_zarr.testing.rl_unplugged import write_fixture_rlu


@pytest.fixture(scope="module")
def rlu(tmp_path_factory):
    return write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=50, present=(0, 1))


def test_kinds():
    assert sorted(KINDS) == ["dqn-replay", "rl-unplugged"]
    assert get_kind("rl-unplugged").scans and not get_kind("dqn-replay").scans
    with pytest.raises(SourceFormatError, match="source kind 'x' is not known"):
        get_kind("x")


def test_detects_either_layout(rlu, pong_run, source_root):
    assert detect_kind(str(source_root)).name == "dqn-replay"
    assert detect_kind(pong_run.url).name == "dqn-replay"  # one run directory
    assert detect_kind(rlu.root).name == "rl-unplugged"
    assert detect_kind(rlu.game_dir).name == "rl-unplugged"  # one game directory


def test_neither_nor_both_is_one_line(rlu, source_root, tmp_path):
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        detect_kind(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceNotFoundError, match=r"holds neither source layout .*--source-kind"):
        detect_kind(str(tmp_path / "empty"))
    shutil.copytree(rlu.game_dir, source_root / rlu.game)
    with pytest.raises(SourceFormatError, match="holds both source layouts") as err:
        (source_root / "Pong" / "1" / "replay_logs").mkdir(parents=True)
        detect_kind(str(source_root))
    assert "\n" not in str(err.value)


def test_selection_of_shards_and_presets(rlu):
    kind = get_kind("rl-unplugged")
    run = RluRun(rlu.game_dir, rlu.game, "1")
    assert kind.select(run, Selection()) == [0, 1]
    assert kind.select(run, Selection("mixed")) == [1]
    assert kind.select(run, Selection([0])) == [0]
    with pytest.raises(SourceNotFoundError, match=r"checkpoints \[49\] were asked for"):
        kind.select(run, Selection("expert"))  # the last shard, 49, is missing here
    with pytest.raises(InvalidArgumentError, match="not a suffix or a range"):
        kind.select(run, Selection("x"))
