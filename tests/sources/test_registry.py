"""The registry of source kinds: detection by layout, kinds by name, selections."""

from __future__ import annotations

import shutil

import pytest
from atari_zarr_testkit.rl_unplugged import write_fixture_rlu

from atari_zarr.errors import InvalidArgumentError, SourceFormatError, SourceNotFoundError
from atari_zarr.sources.registry import KINDS, Selection, detect_kind, get_kind
from atari_zarr.sources.rl_unplugged.files import RluRun


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
    with pytest.raises(SourceNotFoundError, match=r"checkpoints 49 were asked for"):
        kind.select(run, Selection("expert"))  # the last shard, 49, is missing here
    with pytest.raises(InvalidArgumentError, match="not a suffix or a range"):
        kind.select(run, Selection("x"))


class _DictScans:
    """A ScanStore in memory: what plan_run asks of where scans go."""

    def __init__(self, kind, run):
        self.kind, self.run_, self.kept, self.scanned = kind, run, {}, []

    def done(self):
        return set(self.kept)

    def load(self, unit, names=None):
        arrays = self.kept[unit]
        return {n: arrays[n] for n in (names or arrays)}

    def run(self, units):
        self.scanned.append(list(units))
        for unit in units:
            self.kept[unit] = self.kind.scan(self.run_, unit, Selection(), None)


def test_plan_run_is_the_one_scan_then_plan_loop(rlu):
    """The kind says what to scan; scans kept are used again; a kind that scans needs a
    ScanStore; a kind that does not is planned without one."""
    from atari_zarr.sources.registry import plan_run

    kind = get_kind("rl-unplugged")
    [run] = kind.find_runs(rlu.root)
    scans = _DictScans(kind, run)
    first = plan_run(kind, run, Selection(), scans, batch=1)
    assert sorted(u for batch in scans.scanned for u in batch) == [0, 1]
    assert first.n_rows == sum(e.real_steps for e in rlu.episodes)
    rounds = len(scans.scanned)
    again = plan_run(kind, run, Selection(), scans)
    assert len(scans.scanned) == rounds and again.n_rows == first.n_rows  # none scanned again
    limited = _DictScans(kind, run)
    plan_run(kind, run, Selection(max_transitions=5), limited)
    assert limited.scanned == [[0]]  # the limit is reached inside shard 0
    with pytest.raises(ValueError, match="scans its parts"):
        plan_run(kind, run, Selection())


def test_a_kind_is_reached_through_its_adapter():
    from atari_zarr.sources.dqn_replay.kind import KIND as DQN
    from atari_zarr.sources.rl_unplugged.kind import KIND as RLU

    assert KINDS == {"dqn-replay": DQN, "rl-unplugged": RLU}
    meta = {"conversion": {"shards": [{"shard": 3}, {"shard": 7}]}, "source": {"num_shards": 9}}
    assert RLU.parts_converted(meta) == [3, 7] and RLU.source_summary(meta)["num_shards"] == 9
    assert DQN.parts_converted({"conversion": {"checkpoints": [{"suffix": 5}]}}) == [5]
    assert DQN.source_summary(meta) is None and DQN.warnings(meta) == []
