"""Session-wide test helpers: recovery times measured by the failure tests.

Failure tests call ``recovery(name, seconds)`` with what they measured (from
event timestamps where possible). The numbers are printed at the end of the
run and written to runs/recovery-times.json; docs/failure-modes.md quotes them.
A failed test's report carries the last lines of the programs' stderr it started.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEASURED: dict[str, float] = {}


# On a failure, the tail of each program's stderr under the test's tmp_path is shown
# with the report: a CI log then says what the daemons and ranks were doing.
TAIL_LINES = 25
TAIL_FILES = 8


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
def recovery() -> Callable[[str, float], None]:
    def record(name: str, seconds: float) -> None:
        MEASURED[name] = round(seconds, 2)

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not MEASURED:
        return
    terminalreporter.section("recovery times measured in this run (seconds)")
    for name, seconds in sorted(MEASURED.items()):
        terminalreporter.write_line(f"{name:<55} {seconds:>8.2f}")
    out = ROOT / "runs" / "recovery-times.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(MEASURED, indent=2, sort_keys=True) + "\n")
