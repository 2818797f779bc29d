"""A root of stores published to a Hugging Face Hub dataset repo: :func:`publish`.

``atari-zarr publish ROOT hf://datasets/ORG/NAME`` uploads every complete store under a
local ``ROOT`` (the catalog's), then the catalog and a dataset card, through
huggingface_hub's own commits (``HfApi.create_commit``: Xet or LFS, as the Hub offers).

* **Within the Hub's limits, checked before anything is sent.** Fewer than 10,000
  entries in every folder and 100,000 files in the repo (what is there already
  included). The layout keeps every array of a store at most
  :data:`~atari_zarr.layout.MAX_OBJECTS_PER_FOLDER` objects, a 50M-row run included; a
  root with more stores than one repo holds is refused with the count, before any upload.
* **Never shown half-published.** Stores go first, in commits of at most
  ``batch_files`` files; ``catalog.json`` (the list readers open a root by) and the
  card go in the last commit, so a reader of the repo never sees a store the catalog
  names before all of it is there. A file written again, removed or replaced since it
  was checked (a conversion started over) stops the publish before that commit.
* **Resumable.** A file already in the repo with the same content is not sent again
  (the Hub's pre-upload check compares checksums): run the same command again after an
  interruption.

Examples
--------
>>> plan = upload_plan(dest_root)  # a root holding a converted Pong/1 fixture store
>>> sorted({path.split("/")[0] for path in plan})
['Pong']
>>> check_hub_limits(plan).files == len(plan)
True
"""

from __future__ import annotations

import json
import logging
import os
import stat
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atari_zarr.catalog import CATALOG, build_catalog, store_objects, store_state
from atari_zarr.errors import (
    AtariZarrError,
    InvalidArgumentError,
    RemoteAccessError,
    StoreChangedError,
    StoreCorruptError,
    StoreExistsError,
    import_optional,
)
from atari_zarr.explore.card import CARD, CURVES, MARK, card_text, curves_png
from atari_zarr.progress import progress_bar
from atari_zarr.storage.filesystem import get_fs, quiet_hub_logs
from atari_zarr.storage.hub import parse_hf_url
from atari_zarr.storage.paths import is_url, local_path, redact

__all__ = [
    "MAX_ENTRIES_PER_FOLDER",
    "MAX_FILES_PER_REPO",
    "HubLimits",
    "Published",
    "check_hub_limits",
    "check_stores",
    "publish",
    "upload_plan",
]

log = logging.getLogger("atari_zarr")

#: Entries one folder of a Hub repo may hold (the Hub's limit is "under 10,000").
MAX_ENTRIES_PER_FOLDER = 9_999
#: Files one Hub repo may hold (the Hub's limit is "under 100,000").
MAX_FILES_PER_REPO = 99_999


@dataclass(frozen=True)
class HubLimits:
    """What a set of repo paths asks of the Hub's limits."""

    #: Files in all.
    files: int
    #: The folder with the most entries (files and folders directly in it), and how many.
    fullest: str
    entries: int


@dataclass(frozen=True)
class Published:
    """What :func:`publish` did."""

    #: The repo's URL (``hf://datasets/ORG/NAME``).
    url: str
    #: Stores published (``"Pong/1.zarr"``, ...).
    stores: tuple[str, ...]
    #: Files planned, and bytes.
    files: int
    bytes: int
    #: Commits made (a commit that changed nothing is not made).
    commits: int


def check_hub_limits(paths: Iterable[str], existing: Iterable[str] = ()) -> HubLimits:
    """Count files and entries per folder of ``paths`` (with ``existing`` repo files).

    Raises
    ------
    InvalidArgumentError
        A folder with 10,000 entries or more, or 100,000 files or more in all.

    Examples
    --------
    >>> check_hub_limits(["a/c/0/0", "a/c/1/0", "a/c/2/0", "a/zarr.json"])
    HubLimits(files=4, fullest='a/c', entries=3)
    """
    files = set(existing) | set(paths)
    entries: dict[str, set[str]] = {}
    for path in files:
        parts = path.split("/")
        for depth in range(len(parts)):
            folder = "/".join(parts[:depth])
            entries.setdefault(folder, set()).add(parts[depth])
    fullest, names = max(entries.items(), key=lambda kv: len(kv[1]), default=("", set()))
    if len(names) > MAX_ENTRIES_PER_FOLDER:
        raise InvalidArgumentError(
            f"folder {fullest or '/'} of the repo would hold {len(names):,} entries; the Hub "
            f"takes fewer than 10,000 per folder. Convert that store again with this version "
            f"(its arrays keep at most 8,192 objects each), or publish fewer stores per repo"
        )
    if len(files) > MAX_FILES_PER_REPO:
        raise InvalidArgumentError(
            f"the repo would hold {len(files):,} files; the Hub takes fewer than 100,000 per "
            f"repo. Publish fewer stores to this repo (names=[...], --names) and the rest to "
            f"another"
        )
    return HubLimits(len(files), fullest, len(names))


def upload_plan(root: str, names: Sequence[str] | None = None) -> dict[str, Path]:
    """Repo path -> local file, of every complete store under ``root`` (or of ``names``,
    ``"Game/run"``), the catalog and card aside: the files each store's metadata names
    (:func:`~atari_zarr.catalog.store_objects`), and nothing else in its folder.

    Raises
    ------
    InvalidArgumentError
        A name with no complete store.
    StoreCorruptError
        A store with a symbolic link inside or a named object missing, or a named file
        that is not a regular file: nothing of another place is ever uploaded.
    """
    from atari_zarr.catalog import complete_store_entries, object_problems

    base = Path(local_path(root))
    available, _ = complete_store_entries(str(base), None)
    chosen = list(available if names is None else dict.fromkeys(names))
    missing = [n for n in chosen if n not in available]
    if missing:
        raise InvalidArgumentError(
            f"{base} holds no complete store {', '.join(missing)} (complete: "
            f"{', '.join(available) or 'none'}); expected names as 'Game/run'. Pass names of "
            f"complete stores, or convert the others first"
        )
    fs, _ = get_fs(str(base))
    plan: dict[str, Path] = {}
    for name in chosen:
        store = base / f"{name}.zarr"
        problems = object_problems(fs, str(store))
        if problems:
            raise _unpublishable(store, problems[0], len(problems))
        for key in store_objects(fs, str(store)):
            full = store / key
            if full.is_symlink() or not full.is_file():  # changed since it was looked at
                raise _unpublishable(store, f"{key} is not a regular file", 1)
            plan[full.relative_to(base).as_posix()] = full
    return plan


def _unpublishable(store: Path, problem: str, count: int) -> AtariZarrError:
    """The refusal of ``store`` for ``problem``: damage, unless the store is no longer
    complete (being written again: never called damaged)."""
    if store_state(str(store)) != "complete":
        return StoreChangedError(
            f"{store} changed while publish read it: it is being written again (it is not "
            f"marked complete now), which is not damage; nothing was sent. Publish it once "
            f"it is complete, or publish the others (--names)"
        )
    more = f" ({count - 1} more problems)" if count > 1 else ""
    return StoreCorruptError(
        f"{store} cannot be published: {problem}{more}; expected a store as convert wrote "
        f"it, and nothing was sent. Run `atari-zarr verify {store}`, convert it again "
        f"(--overwrite), or publish the others (--names)"
    )


def check_stores(base: Path, stores: Sequence[str], *, progress: bool = False) -> None:
    """Refuse to publish stores that ``atari-zarr verify`` fails (every chunk read and
    checked): a reader of the repo would meet the damage, far from its cause.

    Raises
    ------
    StoreCorruptError
        A store fails: its first problem, and the command that lists them all.
    StoreChangedError
        A store is being written again (no longer marked complete): not damage.
    """
    from atari_zarr.verify import verify_store

    for store in stores:
        url = str(base / store)
        report = verify_store(url, progress=progress)
        if not report.ok:
            raise _unpublishable(Path(url), report.problems[0], len(report.problems))


def _identity(path: Path) -> tuple[int, ...] | None:
    """What tells a file written again from the one planned: its device, inode, size and
    modification time (None: gone, or no longer a regular file, a link say)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _check_unchanged(
    base: Path,
    items: Iterable[tuple[str, Path]],
    seen: dict[str, tuple[int, ...] | None],
    after: str,
) -> None:
    """Refuse to go on when a planned file was written again, removed or replaced (by
    a link, say) since it was planned: the store is being converted again.

    Raises
    ------
    StoreChangedError
        Naming the file; ``after`` says what was sent, and that the catalog was not.
    """
    for name, path in items:
        if _identity(path) != seen[name]:
            store = "/".join(name.split("/")[:2])
            raise StoreChangedError(
                f"{base / store} changed while it was being published: {name} was written "
                f"again, removed or replaced since it was checked, which is not damage; "
                f"{after}, and the catalog and card were not, so the repo does not list it "
                f"as published. Publish again once its conversion is complete"
            )


def _batches(
    items: list[tuple[str, Path]], sizes: dict[str, int], max_files: int, max_bytes: int
) -> Iterable[list[tuple[str, Path]]]:
    batch: list[tuple[str, Path]] = []
    size = 0
    for item in items:
        n = sizes[item[0]]
        if batch and (len(batch) >= max_files or size + n > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        yield batch


def publish(
    root: str,
    repo_url: str,
    *,
    names: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    private: bool | None = None,
    license: str = "cc-by-4.0",
    message: str | None = None,
    batch_files: int = 1000,
    batch_bytes: int = 8 << 30,
    progress: bool = True,
    overwrite: bool = False,
) -> Published:
    """Upload the complete stores under the local ``root`` to a Hub dataset repo.

    Parameters
    ----------
    root : str
        A local directory that ``atari-zarr convert`` wrote to.
    repo_url : str
        ``hf://datasets/ORG/NAME`` (``@BRANCH`` for another branch than ``main``; a path
        after the name publishes under that folder). The repo is created if it does not
        exist.
    names : sequence of str, optional
        ``"Game/run"`` of the stores to publish (default: every complete store).
    storage_options : dict, optional
        ``endpoint`` (default ``$HF_ENDPOINT``) and ``token`` (default the user's:
        ``$HF_TOKEN`` or ``huggingface-cli login``'s), one that may write the repo.
    private : bool, optional
        Create the repo private (an existing repo keeps its visibility).
    license : str
        The card's ``license``.
    message : str, optional
        The commits' message.
    batch_files, batch_bytes : int
        Files and bytes per commit at most.
    progress : bool
        Show a progress bar of the bytes.
    overwrite : bool
        Replace the repo's ``README.md`` (in the folder published to) even when it is not
        a card ``atari-zarr`` wrote, as ``atari-zarr card --overwrite`` does.

    Returns
    -------
    Published

    Raises
    ------
    InvalidArgumentError
        ``root`` is not local, ``repo_url`` not a Hub dataset URL, or the stores do not
        fit the Hub's limits.
    StoreCorruptError
        A store fails ``atari-zarr verify`` (a link inside, an object missing, a chunk
        failing its check): nothing is sent.
    StoreExistsError
        The repo holds a ``README.md`` that is not a card of ours (without ``overwrite``).
    RemoteAccessError
        The Hub refused (no token, or one that may not write the repo).

    Nothing is written to ``root``: a publish that fails leaves it as it was.
    """
    hub = import_optional("huggingface_hub", extra="hf", purpose="publishing to the Hub")
    quiet_hub_logs()  # its notes ("No files have been modified ...") reach -v only
    if is_url(str(root)) or not Path(local_path(root)).is_dir():
        raise InvalidArgumentError(
            f"{redact(str(root))} is not a local directory: publish uploads a root written "
            f"by `atari-zarr convert` on this machine. Pass that directory"
        )
    where = parse_hf_url(repo_url)
    if where.repo_type != "dataset":
        raise InvalidArgumentError(
            f"{repo_url}: stores are published to a dataset repo, hf://datasets/ORG/NAME; "
            f"write the URL with datasets/"
        )
    options = dict(storage_options or {})
    token = options.get("token")
    secrets = {**options, "token": token if isinstance(token, str) else ""}
    base = str(Path(local_path(root)).absolute())
    plan = upload_plan(base, names)
    if not plan:
        raise InvalidArgumentError(
            f"{base} holds no complete store{' named ' + ', '.join(names) if names else ''}: "
            f"nothing to publish. Convert one there first (atari-zarr convert ... {base})"
        )
    prefix = f"{where.path}/" if where.path else ""
    stores = tuple(sorted({"/".join(p.split("/")[:2]) for p in plan}))
    # each file as planned: one written again (a conversion started over), removed or
    # replaced by a link while publish runs is never sent as part of a store published
    seen = {name: _identity(path) for name, path in plan.items()}
    check_stores(Path(base), stores, progress=progress)  # every chunk, before any upload
    _check_unchanged(Path(base), plan.items(), seen, "nothing was sent")
    sizes = {name: (found or (0, 0, 0))[2] for name, found in seen.items()}
    # what is complete now, of the stores published; written nowhere here (the root stays
    # as it was whatever the Hub answers): the repo's copy goes up in the last commit
    with warnings.catch_warnings():
        # of a store left out of the catalog for its damage: not one published here
        warnings.simplefilter("ignore")
        catalog = build_catalog(base)
    catalog["stores"] = [e for e in catalog["stores"] if e["path"] in stores]
    try:
        picture: bytes | None = curves_png(base, entries=catalog["stores"])
    except ImportError:
        picture = None  # matplotlib (the plot extra) draws them; the card goes without
    # the loading lines name the repo as readers spell it (its branch and folder too)
    card = card_text(
        base,
        public_url=repo_url,
        license=license,
        curves=picture is not None,
        entries=catalog["stores"],
    )
    api = hub.HfApi(endpoint=options.get("endpoint"), token=token)
    what = redact(repo_url, secrets)
    try:
        api.create_repo(where.repo_id, repo_type="dataset", private=private, exist_ok=True)
        existing = [
            f.path
            for f in api.list_repo_tree(
                where.repo_id, repo_type="dataset", revision=where.revision, recursive=True
            )
            if isinstance(f, hub.hf_api.RepoFile)
        ]
    except hub.errors.HfHubHTTPError as exc:
        raise _refused(what, exc, secrets) from None
    if prefix + CARD in existing and not overwrite:
        _check_card(where, options, what)
    extra = [CATALOG, CARD] + ([CURVES] if picture is not None else [])
    limits = check_hub_limits([prefix + p for p in [*plan, *extra]], existing)
    log.info(
        "%s: %d files; fullest folder %s (%d entries)",
        what,
        limits.files,
        limits.fullest,
        limits.entries,
    )
    total = sum(sizes.values())
    commits = 0
    summary = message or f"Upload {len(stores)} store{'s' if len(stores) != 1 else ''}"
    bar = progress_bar(total, "publish", unit="B", enabled=progress)
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    theirs = not are_progress_bars_disabled()
    disable_progress_bars()  # one bar, ours, not one per file
    try:
        sent = "the files sent before stay in the repo"
        for batch in _batches(sorted(plan.items()), sizes, batch_files, batch_bytes):
            _check_unchanged(Path(base), batch, seen, sent)
            try:
                ops = [
                    hub.CommitOperationAdd(path_in_repo=prefix + name, path_or_fileobj=str(path))
                    for name, path in batch
                ]
                commits += _commit(api, where, ops, f"{summary}: {batch[0][0]} ...", what, secrets)
            except (OSError, RuntimeError) as exc:  # a file read by huggingface_hub, gone?
                if not isinstance(exc, AtariZarrError):
                    _check_unchanged(Path(base), batch, seen, sent)
                raise
            bar.update(sum(sizes[name] for name, _ in batch))
        # the catalog and card present the stores as published: only stores sent as
        # they were checked
        _check_unchanged(Path(base), plan.items(), seen, "its files were sent")
        last = [
            hub.CommitOperationAdd(
                path_in_repo=prefix + CATALOG,
                path_or_fileobj=json.dumps(catalog, indent=1).encode(),
            ),
            hub.CommitOperationAdd(path_in_repo=prefix + CARD, path_or_fileobj=card.encode()),
        ]
        if picture is not None:
            last.append(
                hub.CommitOperationAdd(path_in_repo=prefix + CURVES, path_or_fileobj=picture)
            )
        commits += _commit(api, where, last, f"{summary}: catalog and card", what, secrets)
    finally:
        bar.close()
        if theirs:
            enable_progress_bars()
    return Published(where.url(), stores, len(plan), total, commits)


def _check_card(where: Any, options: dict[str, Any], what: str) -> None:
    """Refuse to replace the repo's ``README.md`` unless ``atari-zarr`` wrote it (it holds
    :data:`~atari_zarr.explore.card.MARK`), as ``atari-zarr card`` refuses a root's."""
    fs, path = get_fs(where.url(), options)
    found = fs.cat_file(f"{path.rstrip('/')}/{CARD}")
    if MARK.encode() not in found:
        raise StoreExistsError(
            f"{what}/{CARD} exists and is not a card atari-zarr wrote (it has no line "
            f"{MARK}); nothing was sent. Expected none, or a card of ours to refresh: move "
            f"it, or pass --overwrite (overwrite=True) to replace it"
        )


def _commit(api: Any, where: Any, ops: list[Any], message: str, what: str, secrets: dict) -> int:
    """One commit of ``ops``; 0 when the Hub already had every file as it is."""
    from huggingface_hub.errors import HfHubHTTPError

    before = None
    try:
        before = api.repo_info(where.repo_id, repo_type="dataset", revision=where.revision).sha
        with warnings.catch_warnings():
            # huggingface_hub's LFS upload hands httpx a file as `data=`, which httpx
            # deprecates; nothing a user of this package can change
            warnings.filterwarnings("ignore", "Use 'content=", DeprecationWarning)
            info = api.create_commit(
                where.repo_id,
                operations=ops,
                commit_message=message,
                repo_type="dataset",
                revision=where.revision,
            )
    except HfHubHTTPError as exc:
        raise _refused(what, exc, secrets) from None
    except RuntimeError as exc:  # an upload's failure, wrapped by huggingface_hub's threads
        if isinstance(exc.__cause__, HfHubHTTPError):
            raise _refused(what, exc.__cause__, secrets) from None
        raise
    return int(info.oid != before)


def _refused(what: str, exc: Any, secrets: dict) -> RemoteAccessError:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    advice = (
        "log in with a token that may write it (HF_TOKEN, `huggingface-cli login`)"
        if status in (401, 403)
        else "check the repo's name and the endpoint (HF_ENDPOINT), then run it again: "
        "files already sent are not sent twice"
    )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return RemoteAccessError(redact(f"{what}: the Hub refused ({first}); {advice}", secrets))
