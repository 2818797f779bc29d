"""Sphinx configuration of the atari_zarr site (``bash scripts/docs.sh`` builds it).

The pages are MyST Markdown (``docs/**/*.md``), the API reference comes from the
numpydoc docstrings, the CLI reference from the argparse parser, the benchmark
tables from ``benchmarks/results/*.json``, and the notebook is executed at build
time on a demo store made here. ``-W --keep-going -n`` (scripts/docs.sh) makes
every warning an error: a broken internal link, an unresolved cross-reference of
an ``atari_zarr`` name, or a code block that neither runs nor says why not.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))

import atari_zarr  # noqa: E402

project = "atari_zarr"
author = "the atari_zarr developers"
copyright = "2026, the atari_zarr developers"
release = atari_zarr.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_nb",
    "atari_zarr_docs",
]

exclude_patterns = ["_build", "jupyter_execute", "**/.ipynb_checkpoints", "Thumbs.db"]
root_doc = "index"
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# -- strictness ---------------------------------------------------------------------
nitpicky = True
# Names of other libraries render as text: there is no network at build time for their
# inventories. Every atari_zarr name must resolve.
nitpick_ignore_regex = [
    (r"py:.*", r"(?!atari_zarr\b).*"),
    # numpydoc's type descriptions: words such as "optional", "callable" or "sequence of"
    (r"py:.*", r"(optional|callable|sequence|of|or|default|iterable|mapping|path|\.\.\.)"),
]
suppress_warnings: list[str] = []

# -- MyST ---------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# -- the notebook: executed at build time on a demo store ---------------------------
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# -- autodoc / autosummary / numpydoc -------------------------------------------------------------
# autosummary writes a page per module into api/generated and never removes one: a page
# of a module since moved or removed would be read, and fail the strict build
shutil.rmtree(HERE / "api" / "generated", ignore_errors=True)
autodoc_default_options = {"members": True, "member-order": "bysource"}
autosummary_generate = True
autosummary_ignore_module_all = True
autodoc_typehints = "none"  # numpydoc's Parameters hold the types
numpydoc_show_class_members = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

# -- HTML ---------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"atari_zarr {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
    # the header holds the sections of the root toctree, all of them: no "More" menu
    "header_links_before_dropdown": 8,
    "navbar_align": "left",
    # the left sidebar shows the current section's pages, from its first level down
    "show_nav_level": 1,
    "navigation_depth": 2,
}
html_static_path = ["_static"]
# code wraps instead of being cut, and the article takes the width the sidebars leave
html_css_files = ["atari_zarr.css"]
# search ranks the guides first (a migration guide for the name of the class it replaces)
html_search_scorer = str(HERE / "_static" / "scorer.js")
templates_path = ["_templates"]
# pages outside every section's toctree have no navigation of their own: no empty column
html_sidebars = {"getting-started": []}
html_show_sourcelink = False
