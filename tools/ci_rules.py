"""A pytest plugin (loaded by the root conftest.py): under CI (``CI`` set to true) a skipped or
xfailed test fails the run. A skip hides breakage: a missing libaio or Chromium must fail CI, not
pass it quietly. Outside CI skips stay skips (say, the browser test on a machine without Chromium).
"""

from __future__ import annotations

import os

import pytest

_skipped: list[str] = []


def in_ci() -> bool:
    """True when the ``CI`` environment variable says so (CI runners set CI=true)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if in_ci() and _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    if in_ci() and _skipped:
        terminalreporter.section("CI: skipped tests fail the run", sep="=", red=True, bold=True)
        for line in _skipped:
            terminalreporter.write_line(f"SKIPPED IN CI: {line}")
