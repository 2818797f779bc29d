"""Optional arrays computed from a store's per-step arrays: full-space actions, return-to-go.

They are written into a finished (or just written, not yet marked complete) store,
streaming one write unit at a time, so memory stays small at 50M transitions:
:data:`~atari_zarr.layout.ACTION_FULL` (each action as one of ALE's 18, for one action
space across games) and :data:`~atari_zarr.layout.RETURN_TO_GO` (Decision Transformer's
undiscounted return-to-go, to the last stored row of a truncated episode), as
``docs/format.md``'s optional arrays define them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import zarr

from atari_zarr.episodes import return_to_go
from atari_zarr.errors import SourceFormatError
from atari_zarr.layout import (
    ACTION,
    ACTION_FULL,
    OPTIONAL_ARRAYS,
    RETURN_TO_GO,
    REWARD,
    TERMINATED,
    TRUNCATED,
    create_array,
    get_array,
)

__all__ = ["write_action_full", "write_derived", "write_return_to_go"]

log = logging.getLogger("atari_zarr")


def _write_new(group: zarr.Group, name: str, n: int) -> zarr.Array:
    if name in group:
        del group[name]  # written again from the per-step arrays: the result is the same
    return create_array(group, name, n)


def write_return_to_go(group: zarr.Group, where: str) -> None:
    """Write :data:`~atari_zarr.layout.RETURN_TO_GO`, from the last unit backwards.

    ``where`` is the store's path or URL, for messages.
    """
    reward = get_array(group, REWARD, where)
    terminated = get_array(group, TERMINATED, where)
    truncated = get_array(group, TRUNCATED, where)
    n = int(reward.shape[0])
    out = _write_new(group, RETURN_TO_GO, n)
    unit = OPTIONAL_ARRAYS[RETURN_TO_GO].unit_rows(n)
    carry = 0.0
    for lo in range(((n - 1) // unit) * unit if n else 0, -1, -unit):
        hi = min(lo + unit, n)
        if hi <= lo:
            continue
        done = np.asarray(terminated[lo:hi]) | np.asarray(truncated[lo:hi])
        rtg = return_to_go(np.asarray(reward[lo:hi]), done, carry)
        out[lo:hi] = rtg.astype(np.float32)
        carry = float(rtg[0])


def write_action_full(group: zarr.Group, action_set: list[int], where: str) -> None:
    """Write :data:`~atari_zarr.layout.ACTION_FULL` by mapping through ``action_set``.

    Raises
    ------
    SourceFormatError
        A stored action is not an index into ``action_set``.
    """
    stored = get_array(group, ACTION, where)
    n = int(stored.shape[0])
    out = _write_new(group, ACTION_FULL, n)
    table = np.asarray(action_set, dtype=np.int32)
    unit = OPTIONAL_ARRAYS[ACTION_FULL].unit_rows(n)
    for lo in range(0, n, unit):
        hi = min(lo + unit, n)
        action = np.asarray(stored[lo:hi])
        bad = np.flatnonzero((action < 0) | (action >= len(table)))
        if bad.size:
            raise SourceFormatError(
                f"{where}: transition {lo + int(bad[0])} has action {int(action[bad[0]])}, but "
                f"the game's minimal action set has {len(table)} actions ({action_set}). The data "
                f"was not recorded with this game's minimal action set; convert without "
                f"--full-action-space."
            )
        out[lo:hi] = table[action]


def write_derived(
    group: zarr.Group,
    *,
    game: str | None,
    where: str,
    action_full: bool = False,
    return_to_go: bool = False,
) -> dict[str, Any]:
    """Write the requested optional arrays; return what to record in the attributes.

    Parameters
    ----------
    group : zarr.Group
        A store whose per-step arrays are written.
    game : str
        ALE game name (``"Pong"``), for the minimal action set.
    where : str
        The store's path or URL, for messages.
    action_full, return_to_go : bool
        Which arrays to write.

    Returns
    -------
    dict
        ``{"action_full": {"minimal_action_set": [...]}, "return_to_go": {...}}``
        for the arrays written; empty when none.

    Examples
    --------
    >>> import shutil, tempfile
    >>> # store_url: the fixture run Pong/1 converted; written here into a copy of it
    >>> copy = shutil.copytree(store_url, tempfile.mkdtemp() + "/1.zarr")
    >>> g = zarr.open_group(copy, mode="r+")
    >>> written = write_derived(g, game="Pong", where=copy, action_full=True, return_to_go=True)
    >>> sorted(written), written["return_to_go"]["discount"]
    (['action_full', 'return_to_go'], 1.0)
    """
    out: dict[str, Any] = {}
    if action_full:
        from atari_zarr.ale import minimal_action_set

        if not game:
            raise SourceFormatError(
                f"{where}: the store names no game, so its minimal action set is unknown; "
                f"expected a 'game' attribute (e.g. 'Pong')."
            )
        action_set = minimal_action_set(game)
        write_action_full(group, action_set, where)
        out["action_full"] = {"minimal_action_set": action_set}
    if return_to_go:
        write_return_to_go(group, where)
        out["return_to_go"] = {
            "discount": 1.0,
            "truncated_episodes": "sum up to the last stored row",
        }
    if out:
        log.info("%s: wrote derived arrays %s", where, sorted(out))
    return out
