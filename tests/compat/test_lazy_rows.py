"""LazyRows: a TensorDict whose entries are read on first access, and otherwise a TensorDict."""

from __future__ import annotations

import pickle

import pytest
import torch

pytest.importorskip("tensordict")

from tensordict import TensorDict

from atari_zarr.compat.lazy_rows import LazyRows


def _rows(reads: list[str]) -> LazyRows:
    def reader(name: str, value: torch.Tensor):
        def read() -> torch.Tensor:
            reads.append(name)
            return value

        return read

    return LazyRows.of(
        4,
        {
            "a": reader("a", torch.arange(4)),
            ("next", "b"): reader("b", torch.ones(4, 1)),
            ("next", "c"): reader("c", torch.zeros(4, 2)),
        },
        {"held": torch.full((4,), 7)},
    )


def test_a_lookup_reads_that_entry_only():
    reads: list[str] = []
    rows = _rows(reads)
    assert sorted(rows.keys()) == ["a", "held", "next"] and reads == []
    assert rows["next", "b"].shape == (4, 1) and reads == ["b"]
    assert rows.get(("next", "b")) is rows["next", "b"] and reads == ["b"]  # read once
    assert rows.get("missing", None) is None and rows["held"].tolist() == [7] * 4
    assert rows.get(("next", "missing"), "x") == "x"
    assert reads == ["b"] and not rows.is_read()
    assert "LazyRows" in repr(rows) and "read when asked" in repr(rows) and reads == ["b"]


@pytest.mark.parametrize(
    "use",
    [
        lambda r: r[1:3],
        lambda r: r.to_tensordict(),
        lambda r: r.clone(),
        lambda r: list(r.keys(include_nested=True, leaves_only=True)),
        lambda r: pickle.loads(pickle.dumps(r)),
    ],
)
def test_anything_else_reads_every_entry_first(use):
    reads: list[str] = []
    rows = _rows(reads)
    out = use(rows)
    assert sorted(reads) == ["a", "b", "c"]
    assert rows.is_read() and "read when asked" not in repr(rows)
    if isinstance(out, TensorDict):
        assert type(out) is TensorDict  # what TensorDict's operations build is a TensorDict
        assert set(out.keys(include_nested=True, leaves_only=True)) >= {"a", ("next", "c")}


def test_it_is_the_tensordict_it_stands_for():
    reads: list[str] = []
    rows = _rows(reads)
    eager = TensorDict(
        {
            "a": torch.arange(4),
            "held": torch.full((4,), 7),
            "next": {"b": torch.ones(4, 1), "c": torch.zeros(4, 2)},
        },
        batch_size=[4],
    )
    assert (rows == eager).all()
    later: list[str] = []
    shallow = _rows(later).exclude("held")  # shallow, as TensorDict's: "next" stays lazy
    assert shallow["next", "c"].shape == (4, 2) and later == ["a", "c"]
    rows["d"] = torch.ones(4)  # a write reads what is pending, then writes
    assert rows["d"].tolist() == [1.0] * 4 and rows.batch_size == (4,)
