"""Finding RL Unplugged runs and shards."""

from __future__ import annotations

import shutil

import pytest
from atari_zarr_testkit.rl_unplugged import rename_shard, write_fixture_rlu

from atari_zarr.errors import SourceFormatError, SourceNotFoundError
from atari_zarr.sources.rl_unplugged.files import RluRun, find_runs, presets, shard_name


@pytest.fixture(scope="module")
def rlu(tmp_path_factory):
    return write_fixture_rlu(str(tmp_path_factory.mktemp("rlu")), num_shards=3, present=(0, 2))


def test_runs_from_the_root_or_a_game_directory(rlu, tmp_path):
    [run] = find_runs(rlu.root)
    assert (run.game, run.run, run.suffixes, run.missing, run.num_shards) == (
        rlu.game,
        "1",
        [0, 2],
        [1],
        3,
    )
    assert run.where(1).endswith(f"{rlu.game}/run_1-00001-of-00003")
    [same] = find_runs(rlu.game_dir, runs=["1"])
    assert same.url == run.url and same.names() == run.names()
    # a second run beside it, and filters
    game = tmp_path / rlu.game
    shutil.copytree(rlu.game_dir, game)
    for path in sorted(game.iterdir()):
        shutil.copy(path, game / path.name.replace("run_1-", "run_2-"))
    assert [r.run for r in find_runs(str(tmp_path))] == ["1", "2"]
    assert [r.run for r in find_runs(str(tmp_path), runs=["2"])] == ["2"]
    with pytest.raises(SourceNotFoundError, match=r"runs \['3'\] of Asterix not found"):
        find_runs(str(tmp_path), runs=["3"])
    with pytest.raises(SourceNotFoundError, match=r"games \['Pong'\] not found"):
        find_runs(str(tmp_path), games=["Pong"])
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        find_runs(str(tmp_path / "nope"))
    with pytest.raises(SourceNotFoundError, match="holds no shard of run 7"):
        RluRun(str(game), rlu.game, "7")


def test_shards_with_different_counts_name_both(rlu, tmp_path):
    game = tmp_path / rlu.game
    shutil.copytree(rlu.game_dir, game)
    rename_shard(game / shard_name(1, 2, 3), num_shards=4)
    with pytest.raises(
        SourceFormatError, match=r"run_1-00000-of-00003 and run_1-00002-of-00004 .* disagree"
    ):
        find_runs(str(tmp_path))
    rename_shard(game / shard_name(1, 2, 4), index=5, num_shards=3)
    with pytest.raises(SourceFormatError, match="shard index 5 is not below"):
        find_runs(str(tmp_path))


def test_presets():
    assert presets(49) == {"mixed": [1], "medium": [10], "expert": [48]}


def test_two_spellings_of_one_run_are_refused_naming_both(rlu, tmp_path):
    """A source holding both ``run_04-…`` and ``run_4-…`` read whichever was listed last:
    two files for one shard are one line naming both."""
    game = tmp_path / rlu.game
    shutil.copytree(rlu.game_dir, game)
    for path in sorted(game.iterdir()):
        shutil.copy(path, game / path.name.replace("run_1-", "run_4-"))
    shutil.copy(game / shard_name(4, 2, 3), game / shard_name(4, 2, 3).replace("run_4-", "run_04-"))
    with pytest.raises(SourceFormatError) as info:
        RluRun(str(game), rlu.game, "4")
    text = str(info.value)
    assert "\n" not in text and "run_04-00002-of-00003" in text and "run_4-00002-of-00003" in text
    assert "one file per shard" in text


def test_a_last_modified_second_is_no_version_and_such_scans_are_never_resumed(tmp_path):
    """``python -m http.server`` tells a shard's Last-Modified, in whole seconds, and no
    ETag: a shard replaced by one of the same size within that second looked unchanged,
    and a resumed pull mixed two publications. Such a shard has no version, so its
    scans are done again on every run, never resumed."""
    from atari_zarr_testkit.web import DirectoryServer

    from atari_zarr.conversion.converter import _scan_digest
    from atari_zarr.sources.registry import Selection

    fixture = write_fixture_rlu(
        str(tmp_path / "src"), "Asterix", 1, num_shards=50, present=(0, 1), seed=0
    )
    served = tmp_path / "served" / "Asterix"
    served.mkdir(parents=True)
    for path in fixture.paths.values():
        shutil.copy(path, served)
    with DirectoryServer(served.parent) as server:
        run = RluRun(f"{server.endpoint_url}/Asterix", "Asterix", "1")
        names = run.names()
        assert [size for _, size, _ in names] == [
            (served / name).stat().st_size for name, _, _ in names
        ]
        assert [version for _, _, version in names] == [None, None], names
        selection = Selection(None, None, None, None)
        assert _scan_digest(run, selection) != _scan_digest(run, selection)
