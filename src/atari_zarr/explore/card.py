"""A dataset card for a root of stores: ``README.md`` in the Hugging Face convention.

:func:`write_card` writes ``{root}/README.md`` and ``{root}/learning_curves.png``:

* YAML front matter (``license``, ``task_categories``, ``size_categories``, ``tags``,
  ``pretty_name``), as Hugging Face dataset cards have it;
* a table of the games/runs: transitions, episodes, size, mean return;
* where the data came from: each store's source kind and URL (credentials removed),
  and the shards or checkpoints missing from it;
* how to load it: the exact ``AtariZarrDataset(...)`` and TorchRL lines for the URL
  readers use (``public_url``, with ``reader_options`` such as ``token=anon``);
* the learning curves, one panel per game and one line per run.

The stores are found through the root's ``catalog.json`` when there is one
(:mod:`atari_zarr.catalog`), else by listing.

Examples
--------
>>> text = card_text(dest_root)  # a root holding a converted Pong/1 fixture store
>>> text.splitlines()[0], "task_categories:" in text, "AtariZarrDataset(" in text
('---', True, True)
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from atari_zarr.catalog import (
    CATALOG,
    CatalogEntry,
    catalog_entries,
    check_root,
    object_problems,
    size_text,
    store_state,
)
from atari_zarr.errors import (
    StoreCorruptError,
    StoreExistsError,
    StoreNotFoundError,
    import_optional,
)
from atari_zarr.explore.curves import plot_learning_curves
from atari_zarr.opening import open_store
from atari_zarr.sources.registry import kind_of
from atari_zarr.storage.deadline import Timeout
from atari_zarr.storage.filesystem import get_fs
from atari_zarr.storage.paths import redact

__all__ = ["CARD", "CURVES", "MARK", "card_text", "curves_png", "size_category", "write_card"]

#: The card, at the root.
CARD = "README.md"
#: The learning curves' picture, beside it.
CURVES = "learning_curves.png"
#: The line that says a card was written here (and may be written again).
MARK = "<!-- written by `atari-zarr card`: run it again to refresh; edits here are replaced -->"

_SIZES = [
    (1e3, "n<1K"),
    (1e4, "1K<n<10K"),
    (1e5, "10K<n<100K"),
    (1e6, "100K<n<1M"),
    (1e7, "1M<n<10M"),
    (1e8, "10M<n<100M"),
    (1e9, "100M<n<1B"),
    (1e10, "1B<n<10B"),
]


def size_category(transitions: int) -> str:
    """Hugging Face's ``size_categories`` label for a number of rows.

    Examples
    --------
    >>> size_category(300), size_category(50_000_000)
    ('n<1K', '10M<n<100M')
    """
    for bound, label in _SIZES:
        if transitions < bound:
            return label
    return "n>10B"


def _sources(
    root: str, entries: list[CatalogEntry], options: dict[str, Any] | None, timeout: Timeout
) -> list[str]:
    """One line per store: its source kind and URL, and the parts missing from it."""
    lines = []
    for e in entries:
        url = f"{root.rstrip('/')}/{e['path']}"
        state = store_state(url, options, timeout=timeout)
        if state != "complete":
            shown = redact(root, options).rstrip("/")
            raise StoreNotFoundError(
                f"{shown}/{CATALOG} lists {e['path']}, which is {state} there; expected the "
                f"complete stores it lists. Run `atari-zarr index {shown}` to refresh the "
                f"catalog, then `atari-zarr card` again."
            )
        fs, where = get_fs(url, options, timeout=timeout)
        problems = object_problems(fs, where.rstrip("/"))
        if problems:  # a store opened through it would read another file, or zeros
            raise StoreCorruptError(
                f"{redact(url, options)}, which {CATALOG} lists, has {problems[0]}; expected "
                f"a store as convert wrote it. Run `atari-zarr verify {redact(url, options)}`, "
                f"convert it again (--overwrite), then `atari-zarr index` and `card` again"
            )
        meta = open_store(url, options, timeout=timeout).metadata
        kind = kind_of(meta)
        source = meta.get("source") or {}
        where = redact(str(source.get("url", "?")))
        if kind is None:
            lines.append(f"- `{e['path']}`: recorded with atari-zarr ({meta.get('kind')})")
            continue
        summary = kind.source_summary(meta) or {}
        missing = summary.get("missing")
        gaps = (meta.get("conversion") or {}).get("gaps") or []
        note = (
            f"shards missing from the source: {missing}"
            if missing
            else f"{len(gaps)} gaps (missed logs)"
            if gaps
            else "nothing missing"
        )
        parts = kind.parts_converted(meta)
        lines.append(
            f"- `{e['path']}`: {kind.name} from `{where}`, {len(parts)} {kind.part_name}s "
            f"converted; {note}"
        )
    return lines


def card_text(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    public_url: str | None = None,
    reader_options: Mapping[str, Any] | None = None,
    license: str = "cc-by-4.0",
    timeout: Timeout = "default",
    curves: bool = True,
    paths: Sequence[str] | None = None,
    entries: Sequence[CatalogEntry] | None = None,
) -> str:
    """The card of ``root`` as Markdown (see the module docstring); ``curves=False``
    leaves out the section that shows :data:`CURVES`; ``paths`` (``"Pong/1.zarr"``, ...)
    keeps only those stores; ``entries``, the catalog's entries of the stores the card
    shows, which a catalog beside it lists (default: the root's, or what listing finds)."""
    if entries is not None:
        entries, indexed = list(entries), True
    else:
        entries, indexed = catalog_entries(root, storage_options, timeout=timeout)
    if paths is not None:
        entries = [e for e in entries if e["path"] in set(paths)]
    return _card_text(
        root,
        entries,
        indexed,
        storage_options,
        public_url,
        reader_options,
        license,
        timeout,
        curves,
    )


def curves_png(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    timeout: Timeout = "default",
    paths: Sequence[str] | None = None,
    entries: Sequence[CatalogEntry] | None = None,
) -> bytes:
    """The learning curves of the stores under ``root`` (of ``paths`` only, where given;
    of ``entries``, catalog entries, where given) as a PNG: one panel per game, one line
    per run (needs matplotlib: the ``plot`` extra)."""
    plt = import_optional("matplotlib.pyplot", extra="plot", purpose="a dataset card")
    if entries is None:
        entries, _ = catalog_entries(root, storage_options, timeout=timeout)
    if paths is not None:
        entries = [e for e in entries if e["path"] in set(paths)]
    by_game: dict[str, list[str]] = {}
    for e in entries:
        by_game.setdefault(str(e["game"]), []).append(f"{root.rstrip('/')}/{e['path']}")
    n = max(1, len(by_game))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.5 * rows), squeeze=False)
    for ax, (_game, urls) in zip(axes.flat, sorted(by_game.items()), strict=False):
        plot_learning_curves(urls, ax, storage_options=storage_options, timeout=timeout)
    for ax in list(axes.flat)[len(by_game) :]:
        ax.set_visible(False)
    fig.tight_layout()
    picture = io.BytesIO()
    fig.savefig(picture, format="png", dpi=90)
    plt.close(fig)
    return picture.getvalue()


def _card_text(
    root: str,
    entries: list[CatalogEntry],
    indexed: bool,
    storage_options: dict[str, Any] | None,
    public_url: str | None,
    reader_options: Mapping[str, Any] | None,
    license: str,
    timeout: Timeout,
    curves: bool = True,
) -> str:
    url = (public_url or root).rstrip("/")
    total = sum(int(e["transitions"] or 0) for e in entries)
    games = sorted({str(e["game"]) for e in entries})
    kinds = sorted({str(e["kind"]) for e in entries if e["kind"]})
    front = [
        "---",
        f"license: {license}",
        f"pretty_name: Atari offline RL data ({', '.join(games) or 'empty'}) in Zarr",
        "task_categories:",
        "- reinforcement-learning",
        "size_categories:",
        f"- {size_category(total)}",
        "tags:",
        "- atari",
        "- offline-reinforcement-learning",
        "- zarr",
        *[f"- {k}" for k in kinds],
        "---",
    ]
    table = [
        "| game/run | kind | transitions | episodes | size | mean return |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for e in entries:
        mean = "-" if e["return_mean"] is None else f"{e['return_mean']:.2f}"
        table.append(
            f"| {e['game']}/{e['run']} | {e['kind']} | {int(e['transitions'] or 0):,} | "
            f"{int(e['episodes'] or 0):,} | {size_text(e['stored_bytes'])} | {mean} |"
        )
    first = entries[0]["path"].removesuffix(".zarr") if entries else "Game/run"
    opts = f", storage_options={dict(reader_options)!r}" if reader_options else ""
    load = [
        "```python",
        "from atari_zarr import AtariZarrDataset",
        "",
        f'ds = AtariZarrDataset("{url}/{first}.zarr"{opts})',
        "batch = ds.sample(32)  # TorchRL TED transitions",
        'print(batch["observation"].shape, batch["next", "reward"].shape)',
        "```",
        "",
        "```python",
        "from atari_zarr.torchrl import AtariZarrExperienceReplay",
        "",
        f'replay = AtariZarrExperienceReplay("{first}", batch_size=32, root="{url}"{opts})',
        "print(replay.available_datasets)",
        "print(replay.sample())",
        "```",
        "",
        "Each store is plain Zarr v3 (`docs/format.md` of atari-zarr defines the layout), so",
        "any Zarr v3 reader opens it: zarr-python, tensorstore, zarrs.",
        "",
        "```python",
        "import zarr",
        "",
        f'run = zarr.open_group("{url}/{first}.zarr", mode="r"{opts})',
        'frames, actions = run["observation"], run["action"]  # row i is transition i',
        'print("zarr", frames.shape, frames.dtype, actions[:4], run["next/reward"][:4])',
        "```",
    ]
    body = [
        f"# Atari offline RL data: {', '.join(games) or 'no stores yet'}",
        "",
        f"{len(entries)} store{'s' if len(entries) != 1 else ''}, {total:,} transitions, "
        f"written by atari-zarr: one Zarr v3 store per game/run, row `i` of every array is "
        f"transition `i` (`observation`, `action`, `next/reward`, `next/terminated`, "
        f"`next/truncated`, episode ids)."
        + (f" `{CATALOG}` at this root lists them." if indexed else ""),
        "",
        *table,
        "",
        "## Where the data came from",
        "",
        *_sources(root, entries, storage_options, timeout),
        "",
        "## How to load it",
        "",
        "`pip install 'atari-zarr[torchrl]'`, then:",
        "",
        *load,
        "",
        *(
            [
                "## Learning curves",
                "",
                "The return of the episodes per source checkpoint (RL Unplugged: per shard), "
                "one line per run; the band holds the middle half of the episodes.",
                "",
                f"![learning curves]({CURVES})",
                "",
            ]
            if curves
            else []
        ),
    ]
    secrets = {**(storage_options or {}), **dict(reader_options or {})}
    # what is published goes through the one redaction: URL user info, signed queries,
    # secret-looking options (a reader's token=anon stays: it is no secret)
    return redact("\n".join([*front, "", MARK, "", *body]), secrets)


def write_card(
    root: str,
    storage_options: dict[str, Any] | None = None,
    *,
    public_url: str | None = None,
    reader_options: Mapping[str, Any] | None = None,
    license: str = "cc-by-4.0",
    timeout: Timeout = "default",
    overwrite: bool = False,
) -> str:
    """Write ``{root}/README.md`` and ``{root}/learning_curves.png``; the card's URL.

    A ``README.md`` already there is replaced only when it is a card written here (it
    holds :data:`MARK`), or with ``overwrite=True``: a hand-written one is refused.

    Parameters
    ----------
    root : str
        The root (local path or fsspec URL) that ``atari-zarr convert`` wrote to.
    storage_options : dict, optional
        fsspec options to read and write ``root``.
    public_url : str, optional
        The URL readers use for ``root`` (e.g. ``https://storage.googleapis.com/B/atari``);
        default ``root``.
    reader_options : mapping, optional
        The storage options the loading lines pass (e.g. ``{"token": "anon"}``).
    license : str
        The ``license`` of the front matter (DQN Replay and RL Unplugged: CC BY 4.0).
    timeout : float, None or "default"
        Seconds each call to storage may take (default 60).
    overwrite : bool
        Replace a ``README.md`` that is not a card written here.

    Raises
    ------
    StoreExistsError
        ``README.md`` exists and is not a card of ours (without ``overwrite``).
    """
    import_optional("matplotlib.pyplot", extra="plot", purpose="a dataset card")
    check_root(root, storage_options, timeout=timeout)
    fs, path = get_fs(root, storage_options, timeout=timeout)
    path = path.rstrip("/")
    if not overwrite:
        try:
            found = fs.cat_file(f"{path}/{CARD}")
        except FileNotFoundError:
            found = None
        if found is not None and MARK.encode() not in found:
            raise StoreExistsError(
                f"{redact(root, storage_options).rstrip('/')}/{CARD} exists and is not a card "
                f"`atari-zarr card` wrote (it has no line {MARK}); expected none, or a card "
                f"of ours to refresh. Move it, or pass --overwrite (overwrite=True) to "
                f"replace it."
            )
    entries, indexed = catalog_entries(root, storage_options, timeout=timeout)
    text = _card_text(
        root, entries, indexed, storage_options, public_url, reader_options, license, timeout
    )
    picture = curves_png(root, storage_options, timeout=timeout)
    fs.write_whole(f"{path}/{CURVES}", picture)  # whole, or not there at all
    fs.write_whole(f"{path}/{CARD}", text.encode())
    return f"{root.rstrip('/')}/{CARD}"
