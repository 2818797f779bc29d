"""Requests as the loaders and ``atari-zarr pull`` spell them: checked before any request."""

from __future__ import annotations

import pytest

from atari_zarr.cli import main
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.pull import Request


def _refused_in_one_line(capsys, argv: list[str]) -> str:
    """``atari-zarr ARGV``: exit code 1 and one line on stderr, which is returned."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_run_id_past_pythons_digit_limit_is_one_line_before_any_request(public_copy, capsys):
    """A run id of 5,000 digits ended in ``ValueError: Exceeds the limit (4300 digits)``."""
    for bad in ("Pong/" + "9" * 5000, "Pong/" + "0" * 30 + "1" * 19):
        with pytest.raises(InvalidArgumentError) as info:
            Request.parse(bad)
        text = str(info.value)
        assert "\n" not in text and len(text) < 300 and "positive integer" in text, text
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        Request.parse("pong", run=10**4400)
    assert Request.parse("Pong/" + "0" * 30 + "5").run == "5"  # leading zeros are no digits
    err = _refused_in_one_line(capsys, ["pull", "Pong/" + "9" * 5000, "--no-progress"])
    assert "positive integer" in err and len(err) < 400, err
    assert public_copy.proxy.requests == 0


def test_more_dt_buffers_than_checkpoints_are_refused_before_any_request(
    public_copy, tmp_path, capsys
):
    """``--dt-buffers 1000`` was refused only once all 50 shards were fetched, leaving a work
    area behind: the games table knows each run's shard count."""
    home = tmp_path / "home"
    err = _refused_in_one_line(capsys, ["pull", "Asterix/1", "--dt-buffers", "1000"])
    assert "num_buffers 1000" in err and "50 checkpoints of Asterix" in err, err
    err = _refused_in_one_line(capsys, ["pull", "Carnival/1", "--dt-buffers", "50"])
    assert "49 checkpoints of Carnival" in err, err
    err = _refused_in_one_line(
        capsys, ["pull", "Asterix/1", "--checkpoints", "0-2", "--dt-buffers", "4"]
    )
    assert "3 checkpoints asked" in err, err
    assert public_copy.proxy.requests == 0
    assert not home.exists()  # no work area left behind
    assert Request.parse("Carnival/1", subset=_dt(49)).subset == _dt(49)  # every one is fine


def _dt(buffers: int):
    from atari_zarr.subsets import Subset

    return Subset.decision_transformer(buffers, 100, 2)


def test_a_negative_seed_is_one_line_before_any_request(public_copy, capsys):
    """``--subset-seed -1`` was a numpy traceback once the whole run was downloaded."""
    for rule in (["--fraction", "0.0004", "--fraction-order", "random"], ["--dt-buffers", "2"]):
        err = _refused_in_one_line(capsys, ["pull", "Asterix/1", *rule, "--subset-seed", "-1"])
        assert "seed (--subset-seed) must be a non-negative integer; got -1" in err, err
    assert public_copy.proxy.requests == 0


def test_the_played_order_keeps_one_cache_entry_whatever_the_seed():
    """The order of play draws nothing: a seed makes no second store of the same rows."""
    plain = Request.parse("Pong/1", fraction=0.01)
    seeded = Request.parse("Pong/1", fraction=0.01, seed=7)
    assert seeded == plain and seeded.root("/h") == plain.root("/h") == (
        "/h/subsets/fraction-0.01-played"
    )
    assert seeded.command() == "atari-zarr pull Pong/1 --fraction 0.01"
    shuffled = Request.parse("Pong/1", fraction=0.01, order="random", seed=7)
    assert shuffled.label == "fraction-0.01-seed7"  # the random order does draw from it


def test_a_seed_past_64_bits_is_one_line_before_any_request(public_copy, capsys):
    """A seed of 300 digits was taken, and its cache folder's name was too long for the
    file system once the source had been listed; 10**5000 could not even be printed."""
    for seed in (2**64, 10**300, 10**5000):
        with pytest.raises(InvalidArgumentError) as info:
            Request.parse("Pong/1", fraction=0.01, order="random", seed=seed)
        text = str(info.value)
        assert "\n" not in text and len(text) < 300 and "at most 2**64 - 1" in text, text
    assert Request.parse("Pong/1", fraction=0.01, order="random", seed=2**64 - 1).subset
    err = _refused_in_one_line(
        capsys, ["pull", "Asterix/1", "--dt-buffers", "2", "--subset-seed", "7" * 300]
    )
    assert "at most 2**64 - 1" in err, err
    assert public_copy.proxy.requests == 0
