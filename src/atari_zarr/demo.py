"""The end-to-end demo behind ``atari-zarr demo``: make a run, convert it, read it back."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from .convert import convert
from .info import format_info, store_info
from .reader import AtariZarrDataset
from .testing import write_fixture_run

__all__ = ["run_demo"]

log = logging.getLogger("atari_zarr")


def run_demo(
    dest: str = "atari-zarr-demo",
    *,
    steps: int = 3000,
    capacity: int = 500,
    progress: bool = True,
    echo: bool = True,
) -> dict:
    """Write a DQN Replay-format run, convert it, sample from it.

    Parameters
    ----------
    dest : str
        Output directory: ``source/`` receives the checkpoint files and
        ``stores/`` the converted store.
    steps : int
        Transitions to record.
    capacity : int
        Replay capacity of the emulated buffer (the dataset used 1,000,000).
    progress : bool
        Show progress bars.
    echo : bool
        Print what happens (the CLI does; tests do not).

    Returns
    -------
    dict
        ``store`` (URL), ``info`` (:func:`atari_zarr.info.store_info`) and ``batch``.
    """
    out = Path(dest)
    source = out / "source"
    stores = out / "stores"

    def say(text: str) -> None:
        if echo:
            print(text)

    t0 = time.perf_counter()
    say(f"1/3 writing a DQN Replay run ({steps} steps, capacity {capacity}) to {source}")
    run = write_fixture_run(str(source), "Pong", "1", capacity=capacity, steps=steps, seed=0)
    say(f"    {len(run.suffixes)} checkpoints, as dopamine's logged replay buffer writes them")
    say(f"2/3 converting to {stores}")
    [done] = convert(str(source), str(stores), overwrite=True, progress=progress)
    info = store_info(done.url)
    say(format_info(info))
    say("3/3 reading it back")
    ds = AtariZarrDataset(done.url)
    batch = ds.sample(32, generator=torch.Generator().manual_seed(0))
    say(f"    {ds!r}")
    say(f"    a batch of 32 TED transitions:\n{batch}")
    say(f"done in {time.perf_counter() - t0:.1f} s; open it with AtariZarrDataset({done.url!r})")
    return {"store": done.url, "info": info, "batch": batch}
