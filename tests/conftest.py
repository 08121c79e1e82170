"""Session-wide test helpers: recovery times measured by the failure tests.

Failure tests call ``recovery(name, seconds)`` with what they measured (from
event timestamps where possible). The numbers are printed at the end of the
run and written to runs/recovery-times.json; docs/failure-modes.md quotes them.
A failed test's report carries the last lines of the programs' stderr it started.
A test marked ``alone`` runs with no other under pytest-xdist (tests/support/machine_lock.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.machine_lock import machine

ROOT = Path(__file__).resolve().parent.parent
MEASURED: dict[str, float] = {}
RECOVERY = "recovery_s:"  # the prefix of a recorded figure's property name


# On a failure, the tail of each program's stderr under the test's tmp_path is shown
# with the report: a CI log then says what the daemons and ranks were doing.
TAIL_LINES = 25
TAIL_FILES = 8


@pytest.fixture(autouse=True)
def _machine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Shares the machine with the other xdist worker's test, or holds it alone. The lock
    files are in the run's base directory, which both workers' directories are under."""
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if root.name.startswith("popen-gw") else root
    with machine(shared, request.node.get_closest_marker("alone") is not None):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if not report.failed or not isinstance(tmp, Path) or not tmp.is_dir():
        return
    logs = sorted(tmp.rglob("*.err"), key=lambda p: p.stat().st_mtime, reverse=True)
    for log in logs[:TAIL_FILES]:
        lines = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        report.sections.append((f"last lines of {log.relative_to(tmp)}", "\n".join(lines)))


@pytest.fixture
def recovery(request: pytest.FixtureRequest) -> Callable[[str, float], None]:
    """Records a figure with the test's report: under pytest-xdist the report, not this
    process, reaches the terminal summary."""

    def record(name: str, seconds: float) -> None:
        request.node.user_properties.append((f"{RECOVERY}{name}", round(seconds, 2)))

    return record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key.startswith(RECOVERY) and isinstance(value, int | float):
            MEASURED[key.removeprefix(RECOVERY)] = float(value)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not MEASURED:
        return
    terminalreporter.section("recovery times measured in this run (seconds)")
    for name, seconds in sorted(MEASURED.items()):
        terminalreporter.write_line(f"{name:<55} {seconds:>8.2f}")
    out = ROOT / "runs" / "recovery-times.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(MEASURED, indent=2, sort_keys=True) + "\n")
