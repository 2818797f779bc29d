"""A run of the suite is whole or it fails: the tests that never ran are counted.

A run can stop early without a failing test: an INTERNALERROR (a timeout that fires
inside pytest's or a plugin's own code), a crash of a plugin. Its closing line then
counts only what ran ("799 passed"), which reads like success. This plugin counts the
tests that finished against those collected and, when some never ran, says so in
one line and makes the run fail.
"""

from __future__ import annotations

import pytest

_finished: set[str] = set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a test ran once it was called, or once its setup failed or skipped it
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _finished.add(report.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    items = getattr(session, "items", None)
    if not items or session.config.option.collectonly:
        return
    missing = [item.nodeid for item in items if item.nodeid not in _finished]
    if not missing:
        return
    line = (
        f"{len(missing)} of the {len(items)} tests collected never ran (the first: "
        f"{missing[0]}): the run stopped early, so it fails; the error above says why"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line, red=True, bold=True)
    else:  # pragma: no cover - pytest always has a terminal reporter here
        print(line)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
