"""The documentation site: built strictly from the repository, then opened in a real Chromium.

The build is the one ``scripts/docs.sh`` runs (``-W --keep-going -n``): a warning, a
broken internal link, an unresolved cross-reference of an atari_zarr name, a notebook
cell that fails, or a code block that neither runs nor says why not, fails it.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from atari_zarr_testkit.browser import HeadlessChromium, find_chromium

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium on PATH: apt-get install chromium (scripts/setup.sh test installs it)",
)


def sphinx_build(source: Path, out: Path, *, timeout: float = 900) -> subprocess.CompletedProcess:
    """The strict build of scripts/docs.sh, of ``source`` into ``out/html``."""
    env = {k: v for k, v in os.environ.items() if k != "ATARI_ZARR_STORE"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-n",
            "-q",
            "-b",
            "html",
            "-d",
            str(out / "doctrees"),
            str(source),
            str(out / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    res = sphinx_build(DOCS, out)
    assert res.returncode == 0, f"the strict build failed:\n{res.stderr[-6000:]}"
    return out / "html"


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[HeadlessChromium]:
    with HeadlessChromium() as chromium:
        yield chromium


# -- the build ------------------------------------------------------------------------
@pytest.mark.slow
def test_every_page_of_the_site_is_built(site: Path):
    for page in [
        "index",
        "getting-started",
        "user-guide",
        "reference",
        "design",
        "development",
        "guides/pull",
        "guides/convert",
        "guides/read",
        "guides/stream",
        "guides/windows",
        "guides/remote",
        "guides/see",
        "guides/viewer",
        "guides/migrate-torchrl",
        "guides/migrate-d3rlpy",
        "guides/migrate-decision-transformer",
        "guides/record",
        "format",
        "guarantees",
        "api/index",
        "api/dataset",
        "cli",
        "architecture",
        "changelog",
        "notebooks/explore",
        "benchmarks/index",
    ]:
        assert (site / f"{page}.html").is_file(), page
    # every module of the package has its API page
    modules = {p.stem for p in (site / "api" / "generated").glob("atari_zarr.*.html")}
    for path in (ROOT / "src" / "atari_zarr").rglob("*.py"):
        rel = path.relative_to(ROOT / "src").with_suffix("")
        name = ".".join(p for p in rel.parts if p != "__init__")
        if name.count(".") >= 1 and not name.split(".")[-1].startswith("_"):
            assert name in modules, f"{name} has no API page"


@pytest.mark.slow
def test_the_cli_reference_is_the_parser(site: Path):
    from atari_zarr.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    html = (site / "cli.html").read_text()
    for verb, p in sub.choices.items():
        assert f'id="cli-{verb}"' in html, verb
        for action in p._actions:
            for flag in action.option_strings:
                assert flag in html, f"{verb} {flag}"


@pytest.mark.slow
def test_benchmark_pages_show_their_newest_result_files(site: Path):
    results = ROOT / "benchmarks" / "results"
    for prefix, page in [
        ("random", "random"),
        ("windows", "windows"),
        ("catalog", "catalog"),
        ("hub", "hub"),
        ("grain", "hub"),
    ]:
        newest = sorted(results.glob(f"{prefix}-*T????.json"))[-1]
        html = (site / "benchmarks" / f"{page}.html").read_text()
        assert newest.name in html, (page, newest.name)
        assert json.loads(newest.read_text())["date"] in html
    # the random-access page's tables are drawn from its result file, not copied
    doc = json.loads((results / "random-20261126T0457.json").read_text())
    html = (site / "benchmarks" / "random.html").read_text()
    for size, rates in doc["sizes"].items():
        for reader, rate in rates["rates"].items():
            assert f"{round(rate['best']):,}" in html, (size, reader)
        assert f"{rates['bytes']['atari_zarr store'] / 1e6:,.1f} MB" in html
    doc = json.loads((results / "catalog-20261125T1307.json").read_text())
    html = (site / "benchmarks" / "catalog.html").read_text()
    for key in ("ls_listed", "ls_catalog", "from_root_listed", "from_root_catalog"):
        assert f"{doc[key]['seconds']:.2f} s, {doc[key]['requests']:,} request" in html, key
    doc = json.loads((results / "preprocess-20261125T0957.json").read_text())
    html = (site / "benchmarks" / "preprocess.html").read_text()
    for run in doc["runs"]:
        assert f"{run['transitions_per_s']:,}" in html and f"{run['seconds']:.1f} s" in html


@pytest.mark.slow
def test_the_notebook_page_holds_its_executed_outputs(site: Path):
    html = (site / "notebooks" / "explore.html").read_text()
    assert "atari-zarr-player" in html  # the episode player, as executed at build time
    figures = re.findall(r'<img[^>]+src="[^"]*\.png"', html)
    assert len(figures) >= 6, figures  # the notebook's matplotlib figures
    assert "Traceback" not in html
    # no builder's directories in its outputs (the demo store records relative paths)
    for builder in (str(ROOT), str(Path.home()), "/tmp/"):
        assert builder not in html, builder


@pytest.mark.slow
def test_the_landing_page_has_the_install_line_the_two_commands_and_an_example(site: Path):
    text = re.sub(r"<[^>]+>", "", (site / "index.html").read_text())
    assert "pip install" in text and "atari-zarr[torchrl]" in text
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text
    assert "&gt;&gt;&gt; from atari_zarr import AtariZarrDataset" in text


def test_every_guide_shows_a_block_of_code_or_commands():
    for page in sorted((DOCS / "guides").glob("*.md")):
        assert re.search(r"^```", page.read_text(), re.M), f"{page.name} has no block"


def test_a_code_block_that_neither_runs_nor_says_why_fails_the_build(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(DOCS / "_ext")!r})
            extensions = ["myst_parser", "atari_zarr_docs"]
            """
        )
    )
    (src / "index.md").write_text(
        "# Page\n\n```python\nprint('shown, never run')\n```\n\n"
        "```{not-run} bash\n:reason: needs a bucket\natari-zarr ls gs://b\n```\n\n"
        "```python\n>>> 1 + 1\n2\n```\n"
    )
    res = sphinx_build(src, tmp_path / "out", timeout=300)
    assert res.returncode != 0
    assert "index.md:3" in res.stderr and "neither runs nor says why not" in res.stderr
    assert res.stderr.count("neither runs") == 1  # the not-run block and the example pass
    (src / "index.md").write_text("# Page\n\n```{not-run} bash\natari-zarr ls\n```\n")
    res = sphinx_build(src, tmp_path / "out2", timeout=300)
    assert res.returncode != 0 and "must say why it is not run" in res.stderr


# -- in a real browser -------------------------------------------------------------------
@pytest.mark.slow
@needs_chromium
def test_search_finds_windows(served: str, browser: HeadlessChromium):
    page = browser.open(f"{served}/search.html?q=windows")
    links = "Array.from(document.querySelectorAll('#search-results ul.search li a'))"
    # objects are listed first, then the pages whose text holds the word
    page.wait_for(f"{links}.some(a => a.getAttribute('href').includes('guides/windows'))", 60)
    found = page.evaluate(f"{links}.map(a => a.getAttribute('href'))")
    assert any("api/dataset" in href and "windows" in href for href in found), found


@pytest.mark.slow
@needs_chromium
def test_the_player_on_the_notebook_page_plays(served: str, browser: HeadlessChromium):
    page = browser.open(f"{served}/notebooks/explore.html")
    root = "document.querySelector('.atari-zarr-player')"
    page.wait_for(f"{root} && {root}.querySelector('.azp-frame').complete")
    first = page.evaluate(f"{root}.querySelector('.azp-frame').src")
    assert page.evaluate(f"{root}.getAttribute('data-step')") == "0"
    page.evaluate(f"{root}.querySelector('.azp-play').click()")
    page.wait_for(f"Number({root}.getAttribute('data-step')) >= 3", timeout=30)
    assert page.evaluate(f"{root}.querySelector('.azp-frame').src") != first
    caption = page.evaluate(f"{root}.querySelector('.azp-caption').textContent")
    assert caption.startswith("step ")


@pytest.mark.slow
@needs_chromium
def test_the_api_page_of_the_dataset_lists_sample_stream_and_windows(
    served: str, browser: HeadlessChromium
):
    page = browser.open(f"{served}/api/dataset.html")
    names = page.evaluate(
        "Array.from(document.querySelectorAll('dt[id^=\"atari_zarr.AtariZarrDataset.\"]'))"
        ".map(d => d.id)"
    )
    for method in ("sample", "stream", "windows", "sample_iter", "episode"):
        assert f"atari_zarr.AtariZarrDataset.{method}" in names, names
    visible = page.evaluate(
        "document.getElementById('atari_zarr.AtariZarrDataset.windows').offsetHeight > 0"
    )
    assert visible


#: the header's sections, in order: the root toctree of docs/index.md
SECTIONS = [
    "Getting started",
    "User guide",
    "Benchmarks",
    "API reference",
    "Command line",
    "Reference",
    "Design notes",
    "Development",
]
#: every page users navigate (the generated per-module API pages aside)
PAGES = [
    "index",
    "getting-started",
    "user-guide",
    *(f"guides/{p.stem}" for p in sorted((DOCS / "guides").glob("*.md"))),
    "notebooks/explore",
    *(f"benchmarks/{p.stem}" for p in sorted((DOCS / "benchmarks").glob("*.md"))),
    "api/index",
    "api/dataset",
    "api/reading",
    "cli",
    "reference",
    "format",
    "guarantees",
    "limitations",
    "design",
    "architecture",
    "remote",
    "development",
    "changelog",
]
HEADER = (
    "Array.from(document.querySelectorAll('.bd-header .navbar-header-items__center "
    ".navbar-nav > li > a.nav-link')).map(a => a.textContent.trim())"
)
#: the theme's "More" menu of header links that did not fit (none expected)
MORE = "document.querySelector('.bd-header .navbar-header-items__center .navbar-nav .dropdown')"
SIDEBAR = "document.querySelectorAll('.bd-sidebar-primary nav.bd-docs-nav a').length"
OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


@pytest.mark.slow
@needs_chromium
def test_the_header_holds_the_sections_and_every_guide_its_sidebar(
    served: str, browser: HeadlessChromium
):
    guides = [p for p in PAGES if p.startswith(("guides/", "notebooks/"))]
    for name in PAGES:
        page = browser.open(f"{served}/{name}.html")
        assert page.evaluate(HEADER) == SECTIONS, name
        more = page.evaluate(f"{MORE} ? {MORE}.getBoundingClientRect().right : null", width=1280)
        assert more is None or more <= 1280, (name, more)
        if name in guides or name.startswith("benchmarks/"):
            links = page.evaluate(SIDEBAR, width=1280)
            assert links >= 10, f"{name}: {links} links in its sidebar"


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("width", [1280, 390])
def test_no_page_scrolls_sideways(served: str, browser: HeadlessChromium, width: int):
    wide = {}
    for name in PAGES:
        page = browser.open(f"{served}/{name}.html")
        overflow = page.evaluate(OVERFLOW, width=width)
        if overflow > 0:
            wide[name] = overflow
    assert not wide, f"pages wider than {width} px, by px: {wide}"


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize(
    "query,guide",
    [
        ("AtariDQNExperienceReplay", "guides/migrate-torchrl"),
        ("get_atari_transitions", "guides/migrate-d3rlpy"),
        ("create_dataset", "guides/migrate-decision-transformer"),
    ],
)
def test_search_lists_the_migration_guide_first(
    served: str, browser: HeadlessChromium, query: str, guide: str
):
    page = browser.open(f"{served}/search.html?q={query}")
    links = "Array.from(document.querySelectorAll('#search-results ul.search li a'))"
    status = "document.querySelector('#search-results p.search-summary')"
    # the summary is written once every result is listed
    page.wait_for(f"{status} && {status}.textContent.length > 0", 60)
    found = page.evaluate(f"{links}.map(a => a.getAttribute('href'))")
    assert found and found[0].split("#")[0] == f"{guide}.html", found[:5]


#: elements whose content is cut off: wider inside than the box they are drawn in
CLIPPED = (
    "Array.from(document.querySelectorAll(SELECTOR)).filter(e => e.offsetWidth > 0 && "
    "e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.trim().slice(0, 60))"
)


@pytest.mark.slow
@needs_chromium
def test_getting_started_has_no_empty_navigation_column(served: str, browser: HeadlessChromium):
    """Getting started is outside every section's toctree: it showed an empty navigation
    column at 1280 px. It has no column, or one with links."""
    page = browser.open(f"{served}/getting-started.html")
    column = page.evaluate(
        "(() => { const s = document.querySelector('.bd-sidebar-primary');"
        " if (!s || s.offsetWidth === 0) return null;"
        " return s.querySelectorAll('nav.bd-docs-nav a').length; })()",
        width=1280,
    )
    assert column is None or column > 0


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("width", [1280, 390])
def test_code_blocks_scroll_and_never_wrap_mid_token(
    served: str, browser: HeadlessChromium, width: int
):
    """Code wrapped mid-token (`--dt-` / `buffers`): every block keeps its lines whole
    and scrolls inside itself; the page itself never scrolls sideways (above)."""
    for name in ("getting-started", "guides/pull", "guides/migrate-decision-transformer"):
        page = browser.open(f"{served}/{name}.html")
        styles = page.evaluate(
            "Array.from(document.querySelectorAll('div.highlight pre')).map(p => "
            "[getComputedStyle(p).whiteSpace, getComputedStyle(p).overflowX])",
            width=width,
        )
        assert styles and all(s == ["pre", "auto"] for s in styles), (name, styles)


#: The code spans of the tables' first cells that take more than one line box.
WRAPPED_NAMES = (
    "Array.from(document.querySelectorAll('.bd-article table td:first-child code'))"
    ".filter(c => c.getClientRects().length > 1).map(c => c.textContent)"
)


@pytest.mark.slow
@needs_chromium
def test_the_cli_tables_never_break_a_verb_or_an_option(served: str, browser: HeadlessChromium):
    """At 390 px the CLI table broke `pull ID [ID ...]` over three lines: the names in a
    table's first column keep one line, and the table scrolls inside the article."""
    page = browser.open(f"{served}/cli.html")
    names = page.evaluate(
        "document.querySelectorAll('.bd-article table td:first-child code').length", width=390
    )
    assert names > 20, names
    wrapped = page.evaluate(WRAPPED_NAMES, width=390)
    assert not wrapped, wrapped


@pytest.mark.slow
@needs_chromium
def test_the_api_pages_titles_signatures_and_contents_are_never_clipped(
    served: str, browser: HeadlessChromium
):
    """At 390 px the API page's title and signatures were clipped, and at 1280 px its
    right-hand contents were truncated: long names break instead."""
    page = browser.open(f"{served}/api/dataset.html")
    for selector, width in (
        (".bd-article h1", 390),
        (".bd-article dl.py > dt", 390),
        (".bd-sidebar-secondary .bd-toc-nav a", 1280),
    ):
        clipped = page.evaluate(CLIPPED.replace("SELECTOR", repr(selector)), width=width)
        assert not clipped, (selector, width, clipped)


@pytest.mark.slow
def test_the_benchmarks_index_carries_the_headline_table(site: Path):
    """The benchmarks index was only a list of links: it opens with the headline table."""
    html = (site / "benchmarks" / "index.html").read_text()
    table = html.split("<table", 1)[1].split("</table>", 1)[0] if "<table" in html else ""
    assert "random TED-256" in table and "Lance" in table and "TorchRL" in table
