"""The lighthouse launcher serves torchft's lighthouse without importing torch."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

import pytest

from daemon.children import capped_log
from daemon.leadership.lighthouse import LAUNCHER, lighthouse_command
from tests.support.ports import free_port, wait_listening


def test_the_launcher_finds_the_native_server_without_importing_torch() -> None:
    probe = (
        "import json, runpy, sys\n"
        f"ns = runpy.run_path({str(LAUNCHER)!r})\n"
        "main = ns['native_lighthouse_main'](ns['native_extension']())\n"
        "print(json.dumps([main.__name__, sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('torch', 'torchft'))]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    name, imported = json.loads(out.stdout)
    assert name == "lighthouse_main"
    assert imported == ["torchft._torchft"], imported


def test_the_launched_lighthouse_listens() -> None:
    assert lighthouse_command() == [sys.executable, str(LAUNCHER)]
    port = free_port()
    argv = [*lighthouse_command(), "--min_replicas", "1", "--bind", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
    finally:
        proc.kill()
        proc.wait()


def test_a_childs_log_is_rotated_at_its_cap(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfor i in range(2000): print(f'line {i:05d}' + 'x' * 90)",
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    capped_log(child.stdout, log, 50_000).join(30)
    assert child.wait(30) == 0
    rotated = log.with_name("child.log.1")
    assert log.stat().st_size <= 50_000 and rotated.stat().st_size <= 50_000
    assert log.read_text().splitlines()[-1].startswith("line 01999")  # the newest lines kept
    assert not list(tmp_path.glob("child.log.2"))


def test_a_chatty_childs_lines_are_copied_whole_and_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52: a child writing a line every 10 ms (as the lighthouse does per quorum on
    a fast job) is copied a batch at a time, not a record and a wake-up per line, and
    every line arrives whole and in order (a multi-byte character included)."""
    records: list[str] = []
    emit = RotatingFileHandler.emit

    def counted(self: RotatingFileHandler, record: logging.LogRecord) -> None:
        records.append(record.getMessage())
        emit(self, record)

    monkeypatch.setattr(RotatingFileHandler, "emit", counted)
    log = tmp_path / "child.log"
    script = (
        "import sys, time\n"
        "for i in range(100):\n"
        "    sys.stdout.write(f'quorum {i:03d} \\u00e9t\\u00e9\\n'); sys.stdout.flush()\n"
        "    time.sleep(0.01)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None
    capped_log(child.stdout, log, 1_000_000).join(30)
    assert child.wait(30) == 0
    expected = [f"quorum {i:03d} \u00e9t\u00e9" for i in range(100)]
    assert log.read_text(encoding="utf-8").splitlines() == expected
    assert all(r.endswith("\n") for r in records)  # no line split between two records
    assert len(records) <= 20, f"{len(records)} records for 100 lines"
