"""What the atari_zarr site adds to Sphinx.

* ``not-run``: a code block shown but not run, with the reason (``:reason:``,
  required). Every other code block must run: a ``>>>`` example (the test suite runs
  those of ``docs/**/*.md`` and of the docstrings) or a notebook cell (executed by
  myst-nb). A block that does neither is a warning, so an error in a strict build.
  Blocks of ``text`` (diagrams, layouts, messages) are not code.
* ``cli-reference``: every verb of ``atari-zarr``, its usage and its options, read
  from the argparse parser itself (it cannot drift from the command line).
* ``bench-results PREFIX``: the figures of the newest
  ``benchmarks/results/PREFIX-*.json``, with its date and machine.
* The notebook is executed on a demo store made at the start of the build
  (``$ATARI_ZARR_STORE``, which the notebook reads).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


# -- code blocks that run, or say why not ---------------------------------------------
class NotRun(SphinxDirective):
    """A code block that the build does not run; ``:reason:`` says why."""

    has_content = True
    optional_arguments = 1
    option_spec = {"reason": directives.unchanged_required}

    def run(self) -> list[nodes.Node]:
        reason = self.options.get("reason", "").strip()
        code = "\n".join(self.content)
        node = nodes.literal_block(
            code, code, language=self.arguments[0] if self.arguments else "text"
        )
        node["not_run"] = reason
        node["classes"].append("not-run")
        self.set_source_info(node)
        if not reason:
            log.warning(
                "a not-run code block must say why it is not run (:reason: ...)",
                location=node,
                type="atari_zarr",
                subtype="code",
            )
        return [node]


def _runs(node: nodes.literal_block) -> bool:
    """True when the block is run, shown as generated, or said not to run."""
    if node.get("not_run") or node.get("generated"):
        return True
    if node.get("language") in ("text", "none"):  # a diagram, a layout, a message: not code
        return True
    if node.astext().lstrip().startswith(">>>"):  # run by the doctests of docs/**/*.md
        return True
    # (a docstring's >>> examples are doctest blocks, run by the suite's doctest-modules)
    parent = node.parent
    while parent is not None:
        if parent.get("nb_element") is not None:  # a notebook cell or its output
            return True
        parent = parent.parent
    return False


def check_code_blocks(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for node in doctree.findall(nodes.literal_block):
        if not _runs(node):
            log.warning(
                "this code block neither runs nor says why not: write it as a >>> example, "
                "or as ```{not-run} LANGUAGE with a :reason: line",
                location=node,
                type="atari_zarr",
                subtype="code",
            )


# -- the command line, from its parser ---------------------------------------------------
def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        return ""
    try:
        return text % {**vars(action), "prog": prog}
    except (KeyError, TypeError, ValueError):
        return text


def _flags(action: argparse.Action) -> str:
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs != 0:
            flags += f" {action.metavar or action.dest.upper()}"
        return flags
    return str(action.metavar or action.dest)


def _table(rows: list[tuple[str, str]], head: tuple[str, str]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=2)
    table += group
    group += nodes.colspec(colwidth=30)
    group += nodes.colspec(colwidth=70)
    thead = nodes.thead()
    group += thead
    body = nodes.tbody()
    group += body
    for target, cells in ((thead, [head]), (body, rows)):
        for left, right in cells:
            row = nodes.row()
            for i, cell in enumerate((left, right)):
                entry = nodes.entry()
                entry += nodes.paragraph(
                    "", "", nodes.literal(cell, cell) if i == 0 else nodes.Text(cell)
                )
                row += entry
            target += row
    return table


class CliReference(SphinxDirective):
    """Every verb of ``atari-zarr``: its usage and options, from the argparse parser."""

    def run(self) -> list[nodes.Node]:
        from atari_zarr.cli import build_parser

        parser = build_parser()
        out: list[nodes.Node] = []
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        globals_ = [
            (_flags(a), _help(a, parser.prog))
            for a in parser._actions
            if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)
        ]
        out.append(
            self._section(
                "atari-zarr",
                "cli-atari-zarr",
                parser.format_usage(),
                parser.description or "",
                globals_,
            )
        )
        for name, p in sub.choices.items():
            rows = [
                (_flags(a), _help(a, p.prog))
                for a in p._actions
                if not isinstance(a, argparse._HelpAction)
            ]
            text = p.description or helps.get(name, "")
            out.append(
                self._section(f"atari-zarr {name}", f"cli-{name}", p.format_usage(), text, rows)
            )
        return out

    def _section(
        self, title: str, ident: str, usage: str, text: str, rows: list[tuple[str, str]]
    ) -> nodes.section:
        section = nodes.section(ids=[ident])
        section += nodes.title(title, title)
        if text:
            for para in re.split(r"\n\s*\n", text.strip()):
                section += nodes.paragraph("", " ".join(para.split()))
        usage = usage.strip()
        block = nodes.literal_block(usage, usage, language="text")
        block["generated"] = True
        section += block
        if rows:
            section += _table(rows, ("option", "what it does"))
        return section


# -- benchmark figures, from their result files ---------------------------------------
def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e7:
            return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        rows: list[tuple[str, str]] = []
        for key, inner in value.items():
            rows += _flatten(inner, f"{prefix}{key} / ")
        return rows
    if isinstance(value, list):
        if all(not isinstance(v, dict | list) for v in value):
            shown = ", ".join(_fmt(v) for v in value[:12]) + (" ..." if len(value) > 12 else "")
            return [(prefix.rstrip(" /"), f"[{shown}]")]
        rows = []
        for i, inner in enumerate(value):
            rows += _flatten(inner, f"{prefix}{i} / ")
        return rows
    return [(prefix.rstrip(" /"), _fmt(value))]


def newest_result(prefix: str) -> Path | None:
    """The newest ``benchmarks/results/PREFIX-*.json`` (file names carry the time)."""
    found = sorted(
        p
        for p in RESULTS.glob(f"{prefix}-*.json")
        if re.fullmatch(rf"{re.escape(prefix)}-\d{{8}}T\d{{4}}\.json", p.name)
    )
    return found[-1] if found else None


def _grid(head: list[str], rows: list[list[str]]) -> nodes.table:
    """A table of text: a header row, then rows; columns after the first are numbers."""
    table = nodes.table(classes=["bench-table"])
    group = nodes.tgroup(cols=len(head))
    table += group
    for i in range(len(head)):
        group += nodes.colspec(colwidth=40 if i == 0 else 12)
    for part, cells in ((nodes.thead(), [head]), (nodes.tbody(), rows)):
        group += part
        for values in cells:
            row = nodes.row()
            for value in values:
                entry = nodes.entry()
                entry += nodes.paragraph("", value)
                row += entry
            part += row
    return table


def _sizes(doc: dict[str, Any]) -> list[str]:
    return sorted(doc["sizes"], key=int)


def _size_label(n: str) -> str:
    v = int(n)
    return f"{v // 1_000_000}M" if v % 1_000_000 == 0 else f"{v // 1000}k"


def random_rates(doc: dict[str, Any]) -> nodes.table:
    """Transitions/s of every reader (best of its rounds), one column per store size."""
    sizes = _sizes(doc)
    names = list(doc["sizes"][sizes[0]]["rates"])
    rows = [[n, *(_fmt(round(doc["sizes"][s]["rates"][n]["best"])) for s in sizes)] for n in names]
    busy = list(doc["sizes"][sizes[0]].get("busy_default_threads", {}))
    if busy:
        rows.append(["a second process busy, torch's default threads:", *([""] * len(sizes))])
        rows += [
            [n, *(_fmt(round(doc["sizes"][s]["busy_default_threads"][n])) for s in sizes)]
            for n in busy
        ]
    head = ["transitions/s, random 256 (best of the rounds)", *map(_size_label, sizes)]
    return _grid(head, rows)


def random_bytes(doc: dict[str, Any]) -> nodes.table:
    """Bytes of every store of the same rows, one column per size."""
    sizes = _sizes(doc)
    names = list(doc["sizes"][sizes[0]]["bytes"])
    rows = [[n, *(f"{doc['sizes'][s]['bytes'][n] / 1e6:,.1f} MB" for s in sizes)] for n in names]
    return _grid(["bytes", *map(_size_label, sizes)], rows)


def catalog_finding(doc: dict[str, Any]) -> nodes.table:
    """Time and requests to find a root's stores, listed and with ``catalog.json``."""
    rows = []
    for key, label in [
        ("ls", "`atari-zarr ls ROOT` (sizes included)"),
        ("available_datasets", "`available_datasets` (TorchRL drop-in)"),
        ("from_root", "`MultiGameDataset.from_root` (then opens each store)"),
    ]:
        cells = [
            f"{doc[f'{key}_{how}']['seconds']:.2f} s, {doc[f'{key}_{how}']['requests']:,} "
            f"request{'s' if doc[f'{key}_{how}']['requests'] != 1 else ''}"
            for how in ("listed", "catalog")
        ]
        rows.append([label, *cells])
    return _grid(["find the stores", "listed", "with catalog.json"], rows)


def preprocess_runs(doc: dict[str, Any]) -> nodes.table:
    """``preprocess`` by number of workers: rate, time and bytes."""
    rows = [
        [
            str(run["workers"]),
            _fmt(run["transitions_per_s"]),
            f"{run['seconds']:.1f} s",
            f"{run['dest_bytes'] / 1e6:,.1f} MB",
            f"{run['memmap_bytes'] / 1e9:,.2f} GB",
        ]
        for run in doc["runs"]
    ]
    head = ["workers", "transitions/s", "wall time", "dest on disk", "TorchRL's memory maps"]
    return _grid(head, rows)


def _per_game(doc: dict[str, Any], key: str, fmt: Any) -> nodes.table:
    """One row per game of the corpus, one column per figure of ``key``."""
    games = doc["games"]
    names = list(next(iter(games.values()))[key])
    rows = [[g, *(fmt(e[key][n]) for n in names)] for g, e in games.items() if key in e]
    return _grid(["game", *names], rows)


def corpus_bytes(doc: dict[str, Any]) -> nodes.table:
    """Bytes per frame of each game's frames, in each format."""
    return _per_game(doc, "bytes_per_frame", lambda v: f"{v:,.1f}")


def corpus_random(doc: dict[str, Any]) -> nodes.table:
    """Random TED-256 at frame stack 4 beyond the cache, per game and reader."""
    return _per_game(doc, "random_stack4", lambda v: _fmt(round(v)))


def fullsize_run(doc: dict[str, Any]) -> nodes.table:
    """Every figure of a run at each size, one column per size (checkpoints of 1M)."""
    sizes = doc["sizes"]
    rows: list[list[str]] = []
    for label, get in [
        ("transitions", lambda r: _fmt(r["convert"]["transitions"])),
        ("convert, 2 workers: wall", lambda r: f"{r['convert']['seconds']:,.0f} s"),
        ("convert: frames/s", lambda r: _fmt(r["convert"]["frames_per_s"])),
        ("convert: frames per worker CPU second", lambda r: _fmt(r["convert"]["frames_per_worker_cpu_s"])),
        ("convert: peak RSS per worker", lambda r: f"{r['convert']['worker_peak_rss_MB']:,} MB"),
        ("store on disk", lambda r: f"{r['convert']['store_bytes'] / 1e9:,.2f} GB"),
        ("frames: bytes per frame", lambda r: f"{r['convert']['bytes_per_frame']:.1f}"),
        ("verify: wall", lambda r: f"{r['verify']['seconds']:,.0f} s"),
        ("verify / convert", lambda r: f"{r['verify']['seconds'] / r['convert']['seconds']:.2f}"),
        ("open: time", lambda r: f"{r['open']['seconds'] * 1e3:,.0f} ms"),
        ("open: RSS growth", lambda r: f"{r['open']['rss_growth_MB']:,.1f} MB"),
        ("episode table", lambda r: f"{r['episode_table']['seconds']:.2f} s"),
        ("`info --checkpoints` (a process)", lambda r: f"{r['info_checkpoints']['seconds']:.2f} s"),
        ("decoded-frame cache", lambda r: f"{r['cache_bytes'] / 2**30:,.2f} GiB"),
        ("random TED-256, frame stack 4 (/s)", lambda r: _fmt(r["random_stack4"])),
        ("stream(256), one process (/s)", lambda r: _fmt(r["stream"])),
        ("windows(8), batches of 64 (steps/s)", lambda r: _fmt(r["windows8"])),
        ("RSS at the end", lambda r: f"{r['rss_end_MB']:,} MB"),
    ]:
        rows.append([label, *(get(r) for r in sizes)])
    return _grid(["checkpoints of 1M", *(str(r["checkpoints"]) for r in sizes)], rows)


def fullsize_reads(doc: dict[str, Any]) -> nodes.table:
    """The reads of kept stores in their steady state: the median and every round."""
    rows: list[list[str]] = []
    for r in doc["sizes"]:
        for key, label in [
            ("random_stack4", "random TED-256, frame stack 4 (/s)"),
            ("stream", "stream(256), one process (/s)"),
            ("windows8", "windows(8), batches of 64 (steps/s)"),
        ]:
            runs = ", ".join(_fmt(x[key]) for x in r["runs"])
            rows.append([_fmt(r["transitions"]), label, _fmt(r[key]), runs])
        first = r["runs"][0]
        rows.append([_fmt(r["transitions"]), "episode table: RSS it adds",
                     f"{first['episode_table_rss_MB']:,.1f} MB", ""])
    return _grid(["transitions", "read", "median", "rounds"], rows)


def fullsize_verify(doc: dict[str, Any]) -> nodes.table:
    """``verify`` of kept stores on one process and on one per core, against the conversion."""
    rows: list[list[str]] = []
    for r in doc["sizes"]:
        for w in sorted({run["workers"] for run in r["runs"]}):
            runs = ", ".join(f"{x['seconds']:,.1f} s" for x in r["runs"] if x["workers"] == w)
            share = r.get(f"of_conversion_{w}_workers")
            rows.append([
                str(r["checkpoints"]),
                str(w),
                f"{r[f'seconds_{w}_workers']:,.1f} s",
                runs,
                "" if share is None else f"{share:.2f} of {r['conversion_seconds']:,.0f} s",
            ])
    return _grid(["checkpoints of 1M", "processes", "best", "rounds", "of the conversion"], rows)


#: Tables drawn from a result file by name (``:table:``); without one, every figure.
TABLES = {
    "random-rates": random_rates,
    "random-bytes": random_bytes,
    "catalog": catalog_finding,
    "preprocess": preprocess_runs,
    "corpus-bytes": corpus_bytes,
    "corpus-random": corpus_random,
    "fullsize": fullsize_run,
    "fullsize-reads": fullsize_reads,
    "fullsize-verify": fullsize_verify,
}


class BenchResults(SphinxDirective):
    """The figures of the newest result file of a benchmark, as a table."""

    required_arguments = 1
    option_spec = {"file": directives.unchanged, "table": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        name = self.options.get("file")
        path = RESULTS / name if name else newest_result(self.arguments[0])
        if path is None or not path.is_file():
            log.warning(
                f"no result file for {self.arguments[0]!r} in {RESULTS}",
                location=self.get_location(),
            )
            return []
        self.env.note_dependency(str(path))
        doc = json.loads(path.read_text())
        table = self.options.get("table")
        if table is not None:
            if table not in TABLES:
                log.warning(
                    f"no table {table!r}; known: {sorted(TABLES)}", location=self.get_location()
                )
                return []
            return [TABLES[table](doc)]
        machine = doc.get("machine")
        if isinstance(machine, dict):
            machine = machine.get("summary") or ", ".join(f"{k} {v}" for k, v in machine.items())
        rel = path.relative_to(REPO)
        intro = nodes.paragraph()
        intro += nodes.Text("Every figure of ")
        intro += nodes.literal(str(rel), str(rel))
        intro += nodes.Text(
            f", measured {doc.get('date', '(no date)')} on {machine or '(machine not recorded)'}."
        )
        rows = [
            (k, v)
            for k, v in _flatten({k: v for k, v in doc.items() if k not in ("date", "machine")})
        ]
        return [intro, _table(rows, ("figure", "value"))]


# -- the demo store the notebook reads ---------------------------------------------------
def make_demo_store(app: Sphinx) -> None:
    if os.environ.get("ATARI_ZARR_STORE"):
        return
    from atari_zarr.demo import run_demo

    # made from the build directory with relative paths: the store records where its
    # source was and the command that converted it, and the notebook shows both; a
    # reader of the site sees "demo/source/...", not the builder's directories
    build = Path(app.outdir).parent
    build.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    os.chdir(build)
    try:
        result = run_demo("demo", steps=2000, progress=False, echo=False)
    finally:
        os.chdir(here)
    os.environ["ATARI_ZARR_STORE"] = str(build / result.store)


def copy_viewer(app: Sphinx, exception: Exception | None) -> None:
    """The episode viewer's page and script, as the package ships them, at ``viewer/``
    of the site (guides/viewer.md links to it)."""
    if exception is not None or app.builder.format != "html":
        return
    import shutil

    from atari_zarr.explore.viewer import page_path

    target = Path(app.outdir) / "viewer"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("index.html", "viewer.js"):
        shutil.copyfile(page_path().parent / name, target / name)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("not-run", NotRun)
    app.add_directive("cli-reference", CliReference)
    app.add_directive("bench-results", BenchResults)
    app.connect("doctree-resolved", check_code_blocks)
    app.connect("builder-inited", make_demo_store)
    app.connect("build-finished", copy_viewer)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
