"""The ranks of this node's replica group: start, watch, stop.

Every start gets a fresh TCPStore port (rank 0 hosts the store through
``init_process_group``): gloo's full-mesh connect hangs forever when a restarted
group reuses the previous attempt's store keys, which is what torchrun's own
worker restarts do.

Ranks die with the daemon: each one asks the kernel for SIGKILL when the thread
that started it exits (PR_SET_PDEATHSIG), and checks after that request that the
daemon had not already gone. They also run in their own session so a terminal's
Ctrl-C reaches only the daemon, which then drains them. Stopping never relies on
process groups: the daemon signals each rank and then every descendant it finds
in /proc.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from prometheus_client.multiprocess import mark_process_dead

PR_SET_PDEATHSIG = 1
EXIT_BAD_INPUT = 2
EXIT_DRAINED = 128 + signal.SIGTERM

RankEvent = Callable[[int, dict[str, Any]], None]
# torchft's Rust side logs `2026-01-01T00:00:00.000 [INFO] [torchft::manager] - text`.
RUST_LINE = re.compile(r"^\S+ \[(?P<level>[A-Z]+)\] \[(?P<logger>[^\]]+)\] - (?P<message>.*)$")


class ExitKind(StrEnum):
    COMPLETED = "completed"
    BAD_INPUT = "bad_input"
    DRAINED = "drained"
    FAILED = "failed"
    HUNG = "hung"


@dataclass(frozen=True)
class GroupExit:
    kind: ExitKind
    codes: list[int | None]
    reason: str


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid, from /proc (process groups are not trusted)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def die_with_parent(parent: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when the thread that started it exits."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the daemon died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class Rank:
    rank: int
    popen: subprocess.Popen[bytes]
    heartbeat: Path
    readers: list[threading.Thread] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass
class GroupSpec:
    """What the ranks of one start need; built by the supervisor."""

    nproc: int
    slot: int
    num_slots: int
    lighthouse: str  # URL of this daemon's lighthouse forwarder
    config_path: Path
    run_dir: Path
    min_replicas: int
    job: str
    node: str
    advertise_host: str
    extra_env: dict[str, str]
    hang_timeout_s: float
    metrics_dir: Path | None  # PROMETHEUS_MULTIPROC_DIR, or None when metrics are off


class WorkerGroup:
    """One start of the node's ranks. A restart is a new WorkerGroup (fresh store port)."""

    def __init__(self, spec: GroupSpec, attempt: int, on_event: RankEvent) -> None:
        self.spec = spec
        self.attempt = attempt
        self.on_event = on_event
        self.ranks: list[Rank] = []
        self.started_at = 0.0
        self.master_port = 0
        self.stop_requested_at: float | None = None

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    def _env(self, rank: int, heartbeat: Path) -> dict[str, str]:
        s = self.spec
        env = {
            **os.environ,
            **s.extra_env,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(s.nproc),
            "LOCAL_WORLD_SIZE": str(s.nproc),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.master_port),
            "REPLICA_GROUP_ID": str(s.slot),
            "NUM_REPLICA_GROUPS": str(s.num_slots),
            "TORCHFT_LIGHTHOUSE": s.lighthouse,
            "PHALANX_CONFIG": str(s.config_path),
            "PHALANX_MIN_REPLICAS": str(s.min_replicas),
            "PHALANX_HEARTBEAT": str(heartbeat),
            "PHALANX_JOB": s.job,
            "PHALANX_NODE": s.node,
            "PHALANX_ADVERTISE_HOST": s.advertise_host,
            "PHALANX_ATTEMPT": str(self.attempt),
            "PYTHONUNBUFFERED": "1",
        }
        if s.metrics_dir is not None:
            env["PROMETHEUS_MULTIPROC_DIR"] = str(s.metrics_dir)
        # torchrun's marker and systemd's notify socket belong to the daemon, not its ranks.
        for inherited in ("TORCHELASTIC_RUN_ID", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(inherited, None)
        env.setdefault("RUST_LOG", "warn")  # torchft's Rust manager logs every quorum at info
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // s.nproc)))
        return env

    def start(self) -> None:
        s = self.spec
        self.master_port = free_port()
        beats = s.run_dir / "heartbeat"
        beats.mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        argv = [sys.executable, "-m", "trainer", "--config", str(s.config_path)]
        for rank in range(s.nproc):
            heartbeat = beats / f"rank-{rank}"
            heartbeat.touch()
            popen = subprocess.Popen(
                argv,
                env=self._env(rank, heartbeat),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),  # PR_SET_PDEATHSIG must run in the child
            )
            r = Rank(rank, popen, heartbeat)
            for stream, name in ((popen.stdout, "stdout"), (popen.stderr, "stderr")):
                assert stream is not None
                # A copy of the daemon's context: events made here carry job, node, group.
                t = threading.Thread(
                    target=contextvars.copy_context().run,
                    args=(self._pump, rank, stream, name),
                    daemon=True,
                    name=f"rank{rank}-{name}",
                )
                t.start()
                r.readers.append(t)
            self.ranks.append(r)

    def _pump(self, rank: int, stream: IO[bytes], name: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line:
                continue
            event: dict[str, Any] | None = None
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    parsed = json.loads(line)
                    if isinstance(parsed, dict) and "event" in parsed:
                        event = parsed
            if event is None:
                rust = RUST_LINE.match(line)
                if rust:
                    event = {
                        "event": "library_log",
                        "logger": rust["logger"],
                        "level": rust["level"].lower(),
                        "message": rust["message"],
                    }
                else:
                    event = {"event": "rank_output", "stream": name, "line": line}
            event.setdefault("rank", rank)
            event.setdefault("replica_group", self.spec.slot)
            self.on_event(rank, event)
        stream.close()

    def poll(self) -> GroupExit | None:
        """Classify the group's state: None while it is healthy and running."""
        codes = [r.popen.poll() for r in self.ranks]
        now = time.monotonic()
        if any(c is not None and c not in (0, EXIT_DRAINED) for c in codes):
            bad = [c for c in codes if c is not None and c not in (0, EXIT_DRAINED)]
            kind = ExitKind.BAD_INPUT if EXIT_BAD_INPUT in bad else ExitKind.FAILED
            ranks = [r.rank for r, c in zip(self.ranks, codes, strict=True) if c in bad]
            return GroupExit(kind, codes, f"rank {ranks[0]} exited with {_describe(bad[0])}")
        if all(c is not None for c in codes):
            kind = ExitKind.DRAINED if EXIT_DRAINED in codes else ExitKind.COMPLETED
            return GroupExit(kind, codes, kind.value)
        if self.stop_requested_at is None:
            for r, c in zip(self.ranks, codes, strict=True):
                if (
                    c is None
                    and now - _mtime(r.heartbeat, self.started_at) > self.spec.hang_timeout_s
                ):
                    return GroupExit(
                        ExitKind.HUNG,
                        codes,
                        f"rank {r.rank} made no progress for {self.spec.hang_timeout_s:.0f}s",
                    )
        return None

    def request_stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Ask every rank to stop (SIGTERM: finish the step and leave the quorum)."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        for r in self.ranks:
            if r.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    r.popen.send_signal(sig)

    def stopped(self, grace_s: float) -> bool:
        """After request_stop: True once every rank is gone; SIGKILLs whatever outlives the grace."""
        assert self.stop_requested_at is not None
        if all(r.popen.poll() is not None for r in self.ranks):
            self._reap()
            return True
        if time.monotonic() - self.stop_requested_at > grace_s:
            self.kill()
            return True
        return False

    def kill(self) -> None:
        """SIGKILL every rank and every descendant of every rank, then reap."""
        victims = [pid for r in self.ranks for pid in (*descendants(r.pid), r.pid)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def stop(self, grace_s: float) -> None:
        """Blocking stop: SIGTERM, wait up to grace_s, SIGKILL the rest."""
        self.request_stop()
        while not self.stopped(grace_s):
            time.sleep(0.05)

    def _reap(self) -> None:
        for r in self.ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.popen.wait(5)
            if self.spec.metrics_dir is not None and self.spec.metrics_dir.is_dir():
                # Drop the exited rank's live gauges; its counters keep the node's totals.
                mark_process_dead(r.pid, str(self.spec.metrics_dir))  # type: ignore[no-untyped-call]
            for t in r.readers:
                t.join(timeout=2)


def _mtime(path: Path, default: float) -> float:
    """The heartbeat's age reference on the monotonic clock."""
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return default
    return time.monotonic() - age


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"
