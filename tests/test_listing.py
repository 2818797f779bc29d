"""What ``atari-zarr pull`` and ``ls --available`` print (:mod:`atari_zarr.listing`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from atari_zarr import AtariZarrDataset
from atari_zarr.episodes import source_parts
from atari_zarr.listing import loading_line
from atari_zarr.pull import Request, Resolved


def _opened(line: str):
    """What a printed Python line opens (its imports, then its last expression)."""
    *imports, expression = line.split("; ")
    scope: dict = {}
    exec("; ".join(imports), scope)
    return eval(expression, scope)


def test_the_rows_of_a_part_taken_from_a_whole_run_are_spans_never_a_list_of_ints(pong_store):
    """The line for checkpoints a whole run serves listed their rows as ``[*range(..),
    *range(..)]``: a Python list of every row (36 bytes a row, 1.8 GB for 49 of a 50M
    run's checkpoints). Checkpoints that follow one another are one ``range``; others a
    NumPy array of 8 bytes a row; the rows are those of the checkpoints."""
    found = Resolved(pong_store.url, str(Path(pong_store.url).parent.parent), {}, "cache", False)
    parts = source_parts(AtariZarrDataset(pong_store.url).metadata)
    assert len(parts) >= 4
    for spec, kind in (("0-2", range), ("1,3", np.ndarray), ("0,1,3", np.ndarray)):
        request = Request.parse("Pong/1", checkpoints=spec)
        line = loading_line(request, found)
        got = _opened(line)
        assert isinstance(got, torch.utils.data.Subset) and isinstance(got.indices, kind), line
        want = np.concatenate(
            [
                np.arange(p.first_row, p.first_row + p.rows)
                for p in parts
                if p.checkpoint in request.checkpoints
            ]
        )
        np.testing.assert_array_equal(np.asarray(got.indices), want)
        ends = [0, len(got) // 2, len(got) - 1]  # one by one, and as a DataLoader batches
        batch = got.__getitems__(ends)
        for k, i in enumerate(ends):
            assert int(got[i]["action"]) == int(got.dataset[int(want[i])]["action"])
            assert int(batch[k]["action"]) == int(got[i]["action"])
