"""What every test shares: its time limit, whether a skip may pass, and how the process
ends.

``PLACECTL_NO_SKIPS=1`` (CI sets it) turns every skip into a failure that names the
reason, so a missing package (verl, RLinf, OpenRLHF, torch, a Redis server, whatever
comes next), or one of their own dependencies that failed to install, fails the run
instead of leaving it green with the tests unrun. A test that may skip on a machine of
another kind says so with ``@pytest.mark.may_skip``.

CI runs the unit tests twice over the same checkout: in an environment of the ``dev``
extra alone (``scripts/fresh``), then in the full one. ``PLACECTL_PASSED_LOG=FILE`` has a
run write the ids of the tests it passed to FILE; ``PLACECTL_SKIP_PASSED=FILE`` has a
later run leave those out (and say how many), so the second run spends its time only on
what the first skipped or could not run. ``PLACECTL_FAILED_LOG=FILE`` has a run write the
ids of the tests that failed (or errored) to FILE: ``scripts/test`` runs the modules of
those of its lanes again, alone.
"""

from __future__ import annotations

import os
import sys

import pytest

NO_SKIPS = os.environ.get("PLACECTL_NO_SKIPS", "") not in ("", "0")
PASSED_LOG = os.environ.get("PLACECTL_PASSED_LOG", "")
SKIP_PASSED = os.environ.get("PLACECTL_SKIP_PASSED", "")
FAILED_LOG = os.environ.get("PLACECTL_FAILED_LOG", "")
UNIT_TIMEOUT_S = 60


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "may_skip: this test's skip is right on some machines, even in CI"
    )
    config.addinivalue_line(
        "markers",
        "alone: runs with no other lane busy (scripts/test runs these after the lanes): it "
        "times a figure the docs state, or a fault against a grace, on a machine doing "
        "nothing else",
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/unit/" in item.nodeid and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))
    if SKIP_PASSED:
        with open(SKIP_PASSED) as f:
            passed = set(f.read().splitlines())
        left = [i for i in items if i.nodeid in passed]
        items[:] = [i for i in items if i.nodeid not in passed]
        config.hook.pytest_deselected(items=left)
        print(f"\n{len(left)} tests left out: they passed earlier in this run ({SKIP_PASSED})")


_PASSED: set[str] = set()
_FAILED: set[str] = set()


def pytest_runtest_logreport(report):
    if report.failed:
        _FAILED.add(report.nodeid)
    elif report.when == "call" and report.passed:
        _PASSED.add(report.nodeid)


def _refuse(report, where: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"{where} skipped with PLACECTL_NO_SKIPS set: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (
        NO_SKIPS
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("may_skip") is None
    ):
        _refuse(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if NO_SKIPS and report.skipped:  # a module-level skip or importorskip
        _refuse(report, collector.nodeid)


_SESSION: list = []


def pytest_sessionfinish(session, exitstatus):
    _SESSION.append(session)
    if FAILED_LOG and _FAILED:
        with open(FAILED_LOG, "a") as f:
            f.writelines(f"{nodeid}\n" for nodeid in sorted(_FAILED))
    if PASSED_LOG:
        with open(PASSED_LOG, "a") as f:
            f.writelines(f"{nodeid}\n" for nodeid in sorted(_PASSED - _FAILED))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the process with pytest's exit status once everything is reported, without
    the interpreter's teardown. After the whole suite the process holds Ray's core worker,
    grpc and torch with their threads; tearing them down at exit crashed once in CI with
    SIGSEGV after all 874 tests had passed and been reported (exit 139, cause in those
    extensions' finalisation, not reproduced by the unit tests alone). Nothing is left to
    run by then: the reports are written, the clusters shut down by their fixtures."""
    if _SESSION:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(_SESSION[0].exitstatus))
