"""Every whole-number argument is checked one way, in one line."""

import numpy as np
import pytest
import torch

from atari_zarr.arguments import parse_indices, spans, whole_number
from atari_zarr.errors import InvalidArgumentError
from atari_zarr.sources.selection import parse_checkpoints


@pytest.mark.parametrize("value", [np.int64(5), torch.tensor(5), np.array(5), 5])
def test_numpy_and_torch_integers_are_ints(value):
    got = whole_number(value, "batch_size", "ds", low=0)
    assert got == 5 and type(got) is int


@pytest.mark.parametrize(
    ("value", "low", "kind"),
    [
        (2.5, 0, "a non-negative integer"),
        (True, 0, "a non-negative integer"),
        (0, 1, "a positive integer"),
        (-2, -1, "an integer of at least -1"),
        ("4", 1, "a positive integer"),
        (torch.tensor(1.0), 0, "a non-negative integer"),
    ],
)
def test_a_bad_value_is_one_line_naming_it_what_was_expected_and_what_to_do(value, low, kind):
    with pytest.raises(InvalidArgumentError) as err:
        whole_number(value, "unit_rows", "s3://b/Pong/1.zarr", low=low, unit="rows")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"unit_rows must be {kind} (rows); got ")
    assert "for s3://b/Pong/1.zarr. Pass an int" in message


def test_every_reader_argument_goes_through_it(pong_store):
    from atari_zarr import AtariZarrDataset, ReadOptions
    from atari_zarr.read.mixture import MixtureSampler

    ds = AtariZarrDataset(pong_store.url)
    calls = [
        lambda: AtariZarrDataset(pong_store.url, frame_stack=0),
        lambda: ds.sample(1.5),
        lambda: list(ds.sample_iter(4, batches=1, prefetch=-1)),
        lambda: ds.windows(0),
        lambda: ds.stream(0),
        lambda: ds.stream(8, unit_rows=0),
        lambda: ReadOptions(kept_bytes=-1),
        lambda: MixtureSampler([3], None, -1),
    ]
    for call in calls:
        with pytest.raises(
            InvalidArgumentError, match=r"must be a[n]? [a-z -]*integer.*Pass an int"
        ):
            call()


def test_checkpoint_lists_read_and_written_back():
    assert parse_indices("9, 0-2,2", "--checkpoints") == [0, 1, 2, 9]
    assert parse_indices(np.arange(3), "--checkpoints", limit=3) == [0, 1, 2]
    assert spans([0, 1, 2, 9, 5, 6]) == "0-2,5-6,9"
    assert parse_indices(spans([0, 1, 2, 9, 5, 6]), "x") == [0, 1, 2, 5, 6, 9]


@pytest.mark.parametrize("spec", ["5-2", "x", "1-x", "", "-1", [-1], [1.5], ["a"], "3,,4"])
def test_a_checkpoint_list_that_is_not_one_is_one_line(spec):
    with pytest.raises(InvalidArgumentError) as info:
        parse_indices(spec, "--checkpoints")
    text = str(info.value)
    assert "\n" not in text and "--checkpoints" in text and "not a suffix or a range" in text


def test_a_huge_range_is_refused_before_it_is_spelled_out():
    """Sources and pulls share the grammar: "0-100000000000" is refused at once."""
    with pytest.raises(InvalidArgumentError, match=r"goes up to 100000000000.*at most 100000"):
        parse_indices("0-100000000000", "--checkpoints")
    with pytest.raises(InvalidArgumentError, match="50 checkpoints"):
        parse_indices("3-50", "--checkpoints", limit=50)
    with pytest.raises(InvalidArgumentError, match="goes up to"):
        parse_checkpoints("0-100000000000", range(51))
    with pytest.raises(InvalidArgumentError, match="not a suffix"):
        parse_checkpoints("5-2", range(51))  # nothing chosen is no selection


def test_only_ascii_digits_make_a_checkpoint_list_or_a_run():
    from atari_zarr.pull import Request

    for bad in ("\u0663", "1-\u0663", "+3", "1_0", "\u00b2"):
        with pytest.raises(InvalidArgumentError, match="is not a suffix or a range"):
            parse_indices(bad, "--checkpoints")
    for bad in ("Pong/\u0663", "Pong/\u00b2", "Pong/+3"):
        with pytest.raises(InvalidArgumentError, match="is not a positive integer"):
            Request.parse(bad)
    assert parse_indices(" 3 , 0-1", "--checkpoints") == [0, 1, 3]
    assert Request.parse("Pong/3").run == "3"
