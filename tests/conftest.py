"""Session-wide test helpers: recovery times measured by the failure tests.

Failure tests call ``recovery(name, seconds)`` with what they measured (from
event timestamps where possible). The numbers are printed at the end of the
run and written to runs/recovery-times.json; docs/failure-modes.md quotes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MEASURED: dict[str, float] = {}


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
