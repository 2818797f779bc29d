"""One index normalisation for the dataset, the mixture and the TorchRL storage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atari_zarr import AtariZarrDataset, MultiGameDataset
from atari_zarr.read.indexing import normalize_index


def rows_of(idx, n=10):
    rows, scalar = normalize_index(idx, n, "store.zarr")
    assert rows.dtype == np.int64 and rows.ndim == 1
    return rows.tolist(), scalar


def test_single_items():
    for idx in (3, np.int64(3), np.uint8(3), np.array(3), torch.tensor(3), -7, (3,)):
        assert rows_of(idx) == ([3], True), idx


def test_batches():
    assert rows_of([4, 4, -1]) == ([4, 4, 9], False)
    assert rows_of(slice(None, None, -4)) == ([9, 5, 1], False)
    assert rows_of(range(2, 5)) == ([2, 3, 4], False)
    assert rows_of(np.array([1, 2], dtype=np.uint64)) == ([1, 2], False)
    assert rows_of(torch.tensor([[5], [6]])) == ([5, 6], False)  # a TorchRL (B, 1) column
    assert rows_of(([7, 8],)) == ([7, 8], False)
    assert rows_of([]) == ([], False)
    mask = np.arange(10) % 3 == 0
    for m in (mask, mask.tolist(), torch.from_numpy(mask)):
        assert rows_of(m) == ([0, 3, 6, 9], False)


def test_rows_are_a_copy():
    idx = np.array([1, 2])
    rows, _ = normalize_index(idx, 10, "x")
    rows[0] = 5
    assert idx.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("idx", "error", "match"),
    [
        (10, IndexError, "index 10 is out of range for store.zarr with 10 transitions"),
        ([0, -11], IndexError, "index -11 is out of range"),
        # compared before any cast: 2**64 - 1 must not wrap to -1 (the last row)
        (np.array([2**64 - 1], dtype=np.uint64), IndexError, "out of range"),
        (np.ones(9, dtype=bool), IndexError, r"boolean index of shape \(9,\)"),
        (np.zeros((2, 2), dtype=np.int64), IndexError, "one-dimensional"),
        ((1, 2), IndexError, "one-dimensional; got a 2-d index"),
        (np.array([0.5]), TypeError, "must be integers"),
        ("3", TypeError, "must be integers"),
    ],
)
def test_bad_indices(idx, error, match):
    with pytest.raises(error, match=match):
        normalize_index(idx, 10, "store.zarr")


def test_every_reader_selects_the_same_rows(pong_store):
    """Dataset, mixture and TorchRL storage agree on every kind of index."""
    from atari_zarr.torchrl import AtariZarrStorage

    store = pong_store  # shared, read-only
    ds = AtariZarrDataset(store.url)
    mix = MultiGameDataset([ds])
    storage = AtariZarrStorage(ds)
    n = len(ds)
    mask = np.zeros(n, dtype=bool)
    mask[[1, 5, n - 1]] = True
    kinds = [
        mask,
        torch.from_numpy(mask),
        slice(3, 12, 4),
        [2, -1, 2],
        np.array([0, n - 2], dtype=np.uint32),
        torch.tensor([[4], [9]]),
    ]
    for idx in kinds:
        want, _ = normalize_index(idx, n, "x")
        assert ds[idx]["index"].tolist() == want.tolist(), idx
        assert mix[idx]["index"].tolist() == want.tolist(), idx
        assert mix.locate(idx)[1].tolist() == want.tolist(), idx
        got = storage.get(idx)
        assert torch.equal(got["observation"], ds[want]["observation"]), idx
    for reader in (ds, mix):
        assert reader[-1].batch_size == torch.Size([])
        with pytest.raises(IndexError, match="out of range"):
            reader[n]
    assert storage.get(torch.tensor(-1))["observation"].shape == (84, 84)
