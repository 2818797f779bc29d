"""Dataset ids to stores: the local cache, mirrors, and RL Unplugged's public copy.

The loaders this project replaces took a dataset id and downloaded what was missing:
TorchRL's ``AtariDQNExperienceReplay("Pong/5")``, d3rlpy's
``get_atari_transitions("pong", fraction=0.01, index=0)``, the Decision Transformer's
``create_dataset(..., game, ...)``. Their bucket is gone, but the same runs are
public as RL Unplugged's ordered episodes (:data:`RLU_URL`). The package has three parts:

- :mod:`~atari_zarr.pull.request`: such an id as a :class:`Request`, and :data:`GAMES`,
  the one table of what can be pulled;
- :mod:`~atari_zarr.pull.resolution`: :func:`resolve`, the request's store found by a
  list of steps (a local source, the cache, mirrors, the public copy), and
  :func:`open_request`, what every drop-in calls;
- :mod:`~atari_zarr.pull.fetch`: :func:`pull`, a conversion from the public copy into
  the cache, with its locking and its wait.

Examples
--------
>>> request = Request.parse("pong", run=5, fraction=0.01)
>>> request.dataset_id, request.label
('Pong/5', 'fraction-0.01-played')
>>> request.command()
'atari-zarr pull Pong/5 --fraction 0.01'
"""

from atari_zarr.pull.fetch import RLU_STORAGE_OPTIONS, RLU_URL, available, pull, source_sizes
from atari_zarr.pull.request import (
    GAMES,
    HOME_ENV,
    MIRRORS_ENV,
    Download,
    Game,
    Request,
    Resolved,
    cache_home,
    game_name,
)
from atari_zarr.pull.resolution import mirror_roots, open_request, resolve

__all__ = [
    "GAMES",
    "HOME_ENV",
    "MIRRORS_ENV",
    "RLU_STORAGE_OPTIONS",
    "RLU_URL",
    "Download",
    "Game",
    "Request",
    "Resolved",
    "available",
    "cache_home",
    "game_name",
    "mirror_roots",
    "open_request",
    "pull",
    "resolve",
    "source_sizes",
]
