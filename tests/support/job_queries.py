"""What tests ask of a running job: `phalanx status` (JSON or the table), and a daemon's final
digest."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.support.harness import BIN, DAEMON_JOB, Daemon


def _status(endpoint: str, *extra: str) -> str:
    """What `phalanx status` prints for the tests' job at `endpoint`."""
    argv = [str(BIN / "phalanx"), "status", "--config", str(DAEMON_JOB)]
    argv += ["--set", f'etcd.endpoints=["{endpoint}"]', *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def status_json(endpoint: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_status(endpoint, "--json"))
    return doc


def incidents_json(endpoint: str) -> dict[str, Any]:
    """`phalanx status --incidents --json`: the job's incident record."""
    doc: dict[str, Any] = json.loads(_status(endpoint, "--incidents", "--json"))
    return doc


def digest(d: Daemon) -> str:
    done = d.events("train_done")
    assert done, d.proc.tail()
    return str(done[0]["params_sha256"])


def status_table(endpoint: str) -> str:
    """`phalanx status` as an operator reads it (the table)."""
    return _status(endpoint)
