"""Helpers for tests that run real processes: ranks, lighthouses, daemons.

Nothing here mocks torch.distributed, torchft or etcd: it starts the real
programs, reads their JSON-lines output, and sends them real signals.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.children import descendants
from tests.support.netns import Host
from tests.support.ports import free_port as free_port  # re-exported for the tests
from trainer.contracts.rank_events import event_of

# The daemon's own helper for /proc walking (not process groups); ports come from tests.support.ports.
children = descendants

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
Event = dict[str, Any]


def read_events(path: Path) -> list[Event]:
    """Every JSON object line of a log file (other lines are skipped)."""
    out: list[Event] = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        event = event_of(line)  # also one written between a Rust log line's two writes
        if event is not None:
            out.append(event)
    return out


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll until predicate() is truthy; return its value or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_all(pids: Sequence[int], sig: signal.Signals = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class Proc:
    """A started program with its output in files."""

    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def events(self, name: str | None = None) -> list[Event]:
        evs = read_events(self.stderr) + read_events(self.stdout)
        return [e for e in evs if name is None or e.get("event") == name]

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"pid {self.pid} still running after {timeout:.0f}s; last output:\n{self.tail()}"
            ) from None

    def tail(self, n: int = 30) -> str:
        text = self.stderr.read_text(errors="replace") if self.stderr.exists() else ""
        return "\n".join(text.splitlines()[-n:])

    def stop(self) -> None:
        """Kill it and everything it started (walking the process tree)."""
        kill_all([*children(self.pid), self.pid])
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


def start(
    argv: Sequence[str], log_dir: Path, name: str, env: Mapping[str, str] | None = None
) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    out, err = log_dir / f"{name}.out", log_dir / f"{name}.err"
    full_env = {**os.environ, **(env or {})}
    with out.open("wb") as o, err.open("wb") as e:
        popen = subprocess.Popen(list(argv), stdout=o, stderr=e, env=full_env, cwd=ROOT)
    return Proc(popen, out, err)


DAEMON_JOB = ROOT / "tests" / "integration" / "daemon_job.toml"
# Slept by every rank at each forward (PHALANX_CHAOS_DELAY, read from a file per daemon):
# on these two cores it leaves the daemons, etcd and lighthouses CPU while ranks train,
# and paces a job so a test sees its faults happen. Daemon.hurry sets it to 0.
PACE_S = 0.05
# Slept instead while a test waits on time rather than steps (a cut held, a restart, a
# heal): the job spends fewer of its steps waiting, so it needs fewer in all, and the
# daemons and standbys get the CPU the ranks leave. Daemon.slow or start_daemon's pace_s.
HOLD_PACE_S = 0.25


@dataclass
class Daemon:
    """A `phalanx run` process with its HTTP port."""

    proc: Proc
    node_id: str
    http_port: int
    host: str = "127.0.0.1"  # where its HTTP server answers (a test host's address)
    pace: Path | None = None  # the file its ranks read PHALANX_CHAOS_DELAY from

    @property
    def pid(self) -> int:
        return self.proc.pid

    def hurry(self) -> None:
        """Its ranks stop sleeping PACE_S at every forward: once a test has seen what it
        injected and checked, the rest of the job (the same steps) runs at full speed."""
        if self.pace is not None:
            write_pace(self.pace, 0.0)

    def slow(self, pace_s: float = HOLD_PACE_S) -> None:
        """Its ranks sleep `pace_s` (HOLD_PACE_S) at every forward, until hurried."""
        if self.pace is not None:
            write_pace(self.pace, pace_s)

    def events(self, name: str | None = None) -> list[Event]:
        return self.proc.events(name)

    def status(self) -> dict[str, Any] | None:
        """GET /status, or None while the daemon is not answering."""
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://{self.host}:{self.http_port}/status", timeout=2
            ) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except OSError:
            return None

    def get(self, path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            url = f"http://{self.host}:{self.http_port}{path}"
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()

    def require_status(self) -> dict[str, Any]:
        doc = self.status()
        assert doc is not None, f"{self.node_id} is not answering /status"
        return doc

    def rank_pids(self) -> list[int]:
        doc = self.status()
        return list(doc["pids"]) if doc else []

    def step(self) -> int:
        doc = self.status()
        return int(doc["step"]) if doc else 0

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        self.proc.stop()


def start_daemon(
    log_dir: Path,
    node_id: str,
    endpoints: Sequence[str] | None,
    config: Path = DAEMON_JOB,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    host: Host | None = None,
    advertise: bool = True,
    pace_s: float = PACE_S,
) -> Daemon:
    """`phalanx run` for one node with its own ports and run directory; on `host` (a
    network namespace of tests.support.netns) it advertises, and so listens on, the host's
    address, unless `advertise` is false (then node.advertise_host is what `config` says).
    Its ranks sleep `pace_s` at every forward until the test changes it (Daemon.hurry)."""
    http_port = free_port()
    settings = [
        f"node.http_port={http_port}",
        f"node.lighthouse_port={free_port()}",
        f'node.run_dir="{log_dir / node_id}"',
    ]
    if host is not None and advertise:  # every listener binds the advertised address by default
        settings.append(f'node.advertise_host="{host.address}"')
    if endpoints is not None:
        settings.append(f"etcd.endpoints={json.dumps(list(endpoints))}")
    argv = [str(BIN / "phalanx"), "run", "--config", str(config), "--node-id", node_id]
    for o in [*settings, *overrides]:
        argv += ["--set", o]
    if host is not None:
        argv = host.argv(argv)
    pace = None
    if "PHALANX_CHAOS_DELAY" not in (env or {}):
        pace = write_pace(log_dir / f"{name or node_id}.pace", pace_s)
    full_env = {"OMP_NUM_THREADS": "1", "PHALANX_CHAOS_DELAY": f"@{pace}", **(env or {})}
    proc = start(argv, log_dir, name or node_id, full_env)
    return Daemon(proc, node_id, http_port, host.address if host else "127.0.0.1", pace)


def hurry(*daemons: Daemon) -> None:
    """Daemon.hurry for each: their ranks, which train together, all stop pacing."""
    for d in daemons:
        d.hurry()


def slow(*daemons: Daemon, pace_s: float = HOLD_PACE_S) -> None:
    """Daemon.slow for each: while a test holds a fault for a fixed time."""
    for d in daemons:
        d.slow(pace_s)


def ready_standby(d: Daemon, timeout: float = 90) -> int:
    """The pid of a standby of `d` that has said standby_ready."""

    def ready() -> int | None:
        pids = (d.status() or {}).get("standby_pids") or []
        said = {e.get("pid") for e in d.events("standby_ready")}
        return next((p for p in pids if p in said), None)

    pid: int = wait_for(ready, timeout, f"a ready standby on {d.node_id}")
    return pid


def write_pace(path: Path, seconds: float) -> Path:
    """`seconds` into the PHALANX_CHAOS_DELAY file `path`, replaced whole (a rank reads it
    when its modification time changes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_suffix(".new")
    fresh.write_text(f"{seconds}\n")
    fresh.replace(path)
    return path


def event_time(event: Event) -> float:
    """An event's timestamp (ISO 8601 UTC) as seconds since the epoch."""
    from datetime import datetime

    return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00")).timestamp()


def largest_step_gap(events: list[Event], after: float = 0.0) -> float:
    """The longest time between consecutive committed steps, over gaps that end after `after`
    (epoch s): the gap that straddles a failure at `after` counts."""
    times = [event_time(e) for e in events if e.get("event") == "train_step"]
    return max((b - a for a, b in itertools.pairwise(times) if b >= after), default=0.0)


def job_groups(endpoint: str, job: str = "itest") -> dict[int, str]:
    """The job's replica-group slots, read from etcd in-process (fast enough to time a lease)."""
    from daemon.coordination.coordinator import Coordinator, EtcdSettings

    observer = Coordinator(
        EtcdSettings(endpoints=[endpoint], timeout_s=2.0), job, "test-observer", 4
    )
    try:
        return dict(observer.snapshot().groups)
    finally:
        observer.close(revoke=False)


def run_dir(ckpt: Path) -> Path:
    """The one run directory (``<job>/run-<id>``) under a ``checkpoint.dir``."""
    found = sorted(ckpt.glob("*/run-*"))
    assert len(found) == 1, found
    return found[0]
