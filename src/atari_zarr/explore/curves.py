"""Learning curves: the return of a run's episodes, checkpoint by checkpoint.

A DQN Replay run's data follows the agent that logged it, from random play at
checkpoint 0 to the end of training; :func:`plot_learning_curves` draws the mean
return per checkpoint (RL Unplugged: per shard) with the middle half of the
episodes as a band, one line per run. The numbers are
:func:`atari_zarr.episodes.checkpoint_summary`, which ``atari-zarr info --checkpoints``
prints.

Examples
--------
>>> ax = plot_learning_curves([store_url])  # a converted Pong/1 fixture store
>>> [line.get_label() for line in ax.get_lines()]
['Pong/1']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atari_zarr.episodes import checkpoint_summary
from atari_zarr.errors import import_optional
from atari_zarr.opening import open_store
from atari_zarr.storage.deadline import Timeout

__all__ = ["learning_curve", "plot_learning_curves"]


def learning_curve(
    store: Any, storage_options: dict[str, Any] | None = None, *, timeout: Timeout = "default"
) -> tuple[str, list[dict[str, Any]]]:
    """``("Game/run", rows of checkpoint_summary)`` of a store (a URL or a dataset).

    Reads the store's metadata only (one request for a store in a bucket).
    """
    meta = getattr(store, "metadata", None)
    if meta is None:
        url = str(store)
        meta = open_store(url, storage_options, timeout=timeout).metadata
    return f"{meta.get('game')}/{meta.get('run')}", checkpoint_summary(meta)


def plot_learning_curves(
    stores: Sequence[Any],
    ax: Any = None,
    *,
    storage_options: dict[str, Any] | None = None,
    timeout: Timeout = "default",
) -> Any:
    """Mean return per checkpoint of each store, with the middle half of its episodes.

    Parameters
    ----------
    stores : sequence of str or AtariZarrDataset
        Stores (runs of one game, typically): one line each.
    ax : matplotlib Axes, optional
        Where to draw (default: a new figure).
    storage_options : dict, optional
        fsspec options for URLs.

    Returns
    -------
    matplotlib.axes.Axes
    """
    plt = import_optional("matplotlib.pyplot", extra="plot", purpose="plotting learning curves")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    games = set()
    noun = "checkpoint"
    drawn = 0
    for store in stores:
        label, rows = learning_curve(store, storage_options, timeout=timeout)
        games.add(label.split("/")[0])
        rows = [r for r in rows if r["return_mean"] is not None]
        if not rows:
            continue
        if any(r["checkpoint"] is None for r in rows):  # a recording: one group
            xs = list(range(len(rows)))
        else:
            xs = [int(r["checkpoint"]) for r in rows]
        (line,) = ax.plot(xs, [r["return_mean"] for r in rows], marker="o", ms=3, label=label)
        drawn += 1
        ax.fill_between(
            xs,
            [r["return_q25"] for r in rows],
            [r["return_q75"] for r in rows],
            color=line.get_color(),
            alpha=0.2,
            linewidth=0,
        )
    ax.xaxis.get_major_locator().set_params(integer=True)  # checkpoints are whole numbers
    ax.set_xlabel(f"source {noun} (RL Unplugged: shard)")
    ax.set_ylabel("episode return (mean; band: middle half)")
    ax.set_title(f"Learning curve: {', '.join(sorted(games))}")
    if drawn:
        ax.legend(loc="best", fontsize="small")
    else:  # no finished episode: an empty frame that says so, not a legend of nothing
        ax.text(0.5, 0.5, "no finished episode", ha="center", va="center", transform=ax.transAxes)
    return ax
