"""The ``>>>`` examples of the site's pages run with the test suite.

Each fenced code block of ``docs/**/*.md`` that starts with ``>>>`` is a doctest; the
rest of the page is prose (a fence closing right after an output is not read as
output). The examples find ``store_url`` (a small converted Pong/1 store) in their
namespace, as the docstrings' examples do. Sphinx's own files are not tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _pytest.doctest import DoctestItem, DoctestTextfile

collect_ignore = ["conf.py", "_ext", "_build", "_templates", "api/generated", "jupyter_execute"]

_FENCE = re.compile(r"^(\s*)(`{3,})[^\n]*\n(.*?)^\1\2\s*$", re.S | re.M)


def page_examples(text: str) -> str:
    """``text`` with everything but the ``>>>`` blocks blanked, line numbers kept."""
    keep = [""] * text.count("\n")
    for m in _FENCE.finditer(text):
        body = m.group(3)
        if body.lstrip().startswith(">>>"):
            first = text.count("\n", 0, m.start(3))
            for i, line in enumerate(body.split("\n")[:-1]):
                keep[first + i] = line
    return "\n".join(keep) + "\n"


class PageExamples(DoctestTextfile):
    def collect(self):  # type: ignore[no-untyped-def]
        import doctest

        from _pytest.doctest import (
            _get_checker,
            _get_continue_on_failure,
            _get_runner,
            get_optionflags,
        )

        text = page_examples(self.path.read_text())
        runner = _get_runner(
            verbose=False,
            optionflags=get_optionflags(self.config),
            checker=_get_checker(),
            continue_on_failure=_get_continue_on_failure(self.config),
        )
        test = doctest.DocTestParser().get_doctest(
            text, {"__name__": "__main__"}, self.path.name, str(self.path), 0
        )
        if test.examples:
            yield DoctestItem.from_parent(self, name=test.name, runner=runner, dtest=test)


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    if file_path.suffix == ".md":
        return PageExamples.from_parent(parent, path=file_path)
    return None
