"""Dataset ids to stores: the local cache, mirrors, and RL Unplugged's public copy.

The loaders this project replaces took a dataset id and downloaded what was missing:
TorchRL's ``AtariDQNExperienceReplay("Pong/5")``, d3rlpy's
``get_atari_transitions("pong", fraction=0.01, index=0)``, the Decision Transformer's
``create_dataset(..., game, ...)``. Their bucket is gone, but the same runs are
public as RL Unplugged's ordered episodes (:data:`RLU_URL`). :func:`resolve` turns
such an id, a :class:`Request`, into a store, by a list of steps
(:mod:`~atari_zarr.pull.resolution`):

1. **a local source**, where a loader's own call says its files are (the Decision
   Transformer's ``data_dir_prefix``), converted beside them once;
2. **the cache**, ``$ATARI_ZARR_HOME`` (default ``~/.cache/atari_zarr``): a whole run
   is ``{Game}/{run}.zarr``, a part of one (some checkpoints, a subset)
   ``subsets/{label}/{Game}/{run}.zarr``, where the label spells the request
   (:attr:`Request.label`); a whole run in the cache serves any part of it;
3. **mirrors** (``mirrors=``, or ``$ATARI_ZARR_MIRRORS``, comma-separated): roots of
   stores, local or any fsspec URL, asked with one request each (their
   ``catalog.json``, else the store's ``zarr.json``) and read in place, never copied;
4. **RL Unplugged's public copy**, converted into the cache (:func:`pull`): only the
   shards the request needs and, where the rule takes a prefix of each checkpoint
   (:meth:`~atari_zarr.subsets.Subset.prefix_rows`), only that prefix of each shard's
   bytes. Each shard's bytes are fetched once, streamed into the conversion.

``download`` says how far to go: ``True`` fetches what is missing, ``"force"`` fetches
again, ``False`` never touches the network (only the cache and local mirrors), and
says in one line what is missing and the command that fetches it.

:func:`open_request` is what every drop-in calls: the store resolved, opened as an
:class:`~atari_zarr.AtariZarrDataset` and checked once against its catalog entry.

The package has three parts: :mod:`~atari_zarr.pull.request` (the games table and the
request grammar), :mod:`~atari_zarr.pull.resolution` (the steps, and :func:`open_request`)
and :mod:`~atari_zarr.pull.fetch` (a pull, with its locking and wait).

A pull is a conversion: it resumes after a crash, locks the store so that two
processes pulling the same id convert it once (the second waits, and says so), and
never presents an unfinished store as complete. DataLoader workers and DDP ranks
other than 0 on their machine (:func:`~atari_zarr.place.current_place`: ``LOCAL_RANK``,
else ``torch.distributed``'s rank, else ``RANK``) never start a pull: they wait for the
store to be complete, and give up in one line once no process has been pulling it for
``timeout`` seconds.

:data:`GAMES` is the one table of what exists, from TFDS's
``rlu_atari_checkpoints_ordered`` builder: 46 games, runs 1 to 5, 50 shards a run (49
for Carnival, Gravitar and StarGunner), and the size of a run where TFDS's catalog
gives it.

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
