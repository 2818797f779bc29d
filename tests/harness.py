"""A run of the suite is whole or it fails: the tests that never ran are counted.

A run can stop early without a failing test: an INTERNALERROR (a timeout that fires
inside pytest's or a plugin's own code), a crash of a plugin. Its closing line then
counts only what ran ("799 passed"), which reads like success. This plugin counts the
tests that finished against those collected and, when some never ran, says so in
one line and makes the run fail.

Under pytest-xdist the count is the controller's: each worker collects every test but
runs its share, so a worker's own count means nothing. The controller learns what the
workers collected (``pytest_xdist_node_collection_finished``) and receives every
test's reports, and a worker that died is counted like a run that stopped early.
"""

from __future__ import annotations

import pytest

_finished: set[str] = set()
_collected_by_workers: dict[str, None] = {}  # in collection order


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a test ran once it was called, or once its setup failed or skipped it
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _finished.add(report.nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    _collected_by_workers.update(dict.fromkeys(ids))


def _collected(session: pytest.Session) -> list[str]:
    if _collected_by_workers:
        return list(_collected_by_workers)
    return [item.nodeid for item in getattr(session, "items", None) or ()]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_xdist_worker(session.config) or session.config.option.collectonly:
        return
    collected = _collected(session)
    if not collected:
        return
    missing = [nodeid for nodeid in collected if nodeid not in _finished]
    if not missing:
        return
    line = (
        f"{len(missing)} of the {len(collected)} tests collected never ran (the first: "
        f"{missing[0]}): the run stopped early, so it fails; the error above says why"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line, red=True, bold=True)
    else:  # pragma: no cover - pytest always has a terminal reporter here
        print(line)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
