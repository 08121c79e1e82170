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
import json
import os
import re
import signal
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

from daemon.children import die_with_parent, free_port, kill_tree
from daemon.config import DaemonConfig
from daemon.exits import RANK_BAD_INPUT, RANK_DRAINED
from daemon.fencing import LEASE_FILE
from daemon.netif import interface_for

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


@dataclass
class Rank:
    rank: int
    popen: subprocess.Popen[bytes]
    heartbeat: Path
    readers: list[threading.Thread] = field(default_factory=list)
    # Progress on the daemon's monotonic clock: when the heartbeat's mtime was last
    # seen to change. Only a change counts, never the mtime's value, so a wall-clock
    # step (NTP) neither fakes progress nor makes a healthy rank look hung.
    beat_mtime_ns: int = -1
    progressed_at: float = 0.0

    def idle_for(self, now: float) -> float:
        """Seconds since this rank's heartbeat last changed (as seen by the daemon)."""
        try:
            mtime = self.heartbeat.stat().st_mtime_ns
        except OSError:
            mtime = self.beat_mtime_ns
        if mtime != self.beat_mtime_ns:
            self.beat_mtime_ns, self.progressed_at = mtime, now
        return now - self.progressed_at

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
    bind_host: str  # the address the ranks' listeners bind
    extra_env: dict[str, str]
    hang_timeout_s: float
    metrics_dir: Path | None  # PROMETHEUS_MULTIPROC_DIR, or None when metrics are off
    python_path: list[str]  # workload.python_path, absolute: first on the ranks' PYTHONPATH

    @classmethod
    def for_node(
        cls, cfg: DaemonConfig, slot: int, lighthouse: str, config_path: Path
    ) -> GroupSpec:
        """The spec of this node's group in `slot`, from the daemon's config."""
        node = cfg.node
        return cls(
            nproc=node.nproc,
            slot=slot,
            num_slots=cfg.job.max_replicas,
            lighthouse=lighthouse,
            config_path=config_path,
            run_dir=cfg.run_dir,
            min_replicas=cfg.job.min_replicas,
            job=cfg.job.name,
            node=cfg.node_id,
            advertise_host=cfg.advertise_host,
            bind_host=cfg.bind_host,
            extra_env=node.env,
            hang_timeout_s=node.hang_timeout_s,
            metrics_dir=cfg.metrics_dir if cfg.metrics.enabled else None,
            python_path=[str(Path(p).resolve()) for p in cfg.workload.python_path],
        )


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
        self.paused = False  # SIGSTOPped while the node is fenced

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
            "MASTER_ADDR": s.advertise_host,  # rank 0 hosts the store; torchft publishes it to peers
            "MASTER_PORT": str(self.master_port),
            "REPLICA_GROUP_ID": str(s.slot),
            "NUM_REPLICA_GROUPS": str(s.num_slots),
            "TORCHFT_LIGHTHOUSE": s.lighthouse,
            "PHALANX_CONFIG": str(s.config_path),
            "PHALANX_MIN_REPLICAS": str(s.min_replicas),
            "PHALANX_HEARTBEAT": str(heartbeat),
            "PHALANX_LEASE_FILE": str(s.run_dir / LEASE_FILE),
            "PHALANX_JOB": s.job,
            "PHALANX_NODE": s.node,
            "PHALANX_ADVERTISE_HOST": s.advertise_host,
            "PHALANX_BIND_HOST": s.bind_host,
            "PHALANX_ATTEMPT": str(self.attempt),
            "PYTHONUNBUFFERED": "1",
        }
        if s.metrics_dir is not None:
            env["PROMETHEUS_MULTIPROC_DIR"] = str(s.metrics_dir)
        if s.python_path:
            env["PYTHONPATH"] = os.pathsep.join(
                [*s.python_path, *filter(None, [env.get("PYTHONPATH")])]
            )
        interface = interface_for(s.advertise_host)
        if interface is not None:  # peers on other hosts must reach gloo/NCCL at this address
            env.setdefault("GLOO_SOCKET_IFNAME", interface)
            env.setdefault("NCCL_SOCKET_IFNAME", interface)
        # torchrun's marker and systemd's notify socket belong to the daemon, not its ranks.
        for inherited in ("TORCHELASTIC_RUN_ID", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(inherited, None)
        env.setdefault("RUST_LOG", "warn")  # torchft's Rust manager logs every quorum at info
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // s.nproc)))
        return env

    def start(self) -> None:
        s = self.spec
        self.master_port = free_port(self.spec.bind_host)
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
            r = Rank(rank, popen, heartbeat, progressed_at=self.started_at)
            r.idle_for(self.started_at)
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
        """Read one output stream to its end. Nothing a rank prints may stop this thread:
        a reader that died would leave the pipe to fill, and the rank to block on it."""
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line:
                continue
            try:
                self._relay(rank, line, name)
            except Exception as e:  # a line that parses but does not fit what its event means
                fallback: dict[str, Any] = {"event": "rank_output", "stream": name, "line": line}
                fallback.update(rank=rank, replica_group=self.spec.slot, unreadable=repr(e))
                with contextlib.suppress(Exception):
                    self.on_event(rank, fallback)
        stream.close()

    def _relay(self, rank: int, line: str, name: str) -> None:
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

    def poll(self) -> GroupExit | None:
        """Classify the group's state: None while it is healthy and running."""
        codes = [r.popen.poll() for r in self.ranks]
        now = time.monotonic()
        if any(c is not None and c not in (0, RANK_DRAINED) for c in codes):
            bad = [c for c in codes if c is not None and c not in (0, RANK_DRAINED)]
            kind = ExitKind.BAD_INPUT if RANK_BAD_INPUT in bad else ExitKind.FAILED
            ranks = [r.rank for r, c in zip(self.ranks, codes, strict=True) if c in bad]
            return GroupExit(kind, codes, f"rank {ranks[0]} exited with {_describe(bad[0])}")
        if all(c is not None for c in codes):
            kind = ExitKind.DRAINED if RANK_DRAINED in codes else ExitKind.COMPLETED
            return GroupExit(kind, codes, kind.value)
        if self.stop_requested_at is None and not self.paused:
            for r, c in zip(self.ranks, codes, strict=True):
                if c is None and r.idle_for(now) > self.spec.hang_timeout_s:
                    return GroupExit(
                        ExitKind.HUNG,
                        codes,
                        f"rank {r.rank} made no progress for {self.spec.hang_timeout_s:.0f}s",
                    )
        return None

    def pause(self) -> None:
        """SIGSTOP every rank and its descendants (a fenced node, see daemon.fencing)."""
        self.paused = True
        kill_tree(self.pids, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT them; the pause does not count towards a hang."""
        kill_tree(self.pids, signal.SIGCONT)
        self.paused = False
        now = time.monotonic()
        for r in self.ranks:
            r.progressed_at = now

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
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        kill_tree(self.pids)
        self._reap()

    def _reap(self) -> None:
        for r in self.ranks:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.popen.wait(5)
            if self.spec.metrics_dir is not None and self.spec.metrics_dir.is_dir():
                # Drop the exited rank's live gauges; its counters keep the node's totals.
                mark_process_dead(r.pid, str(self.spec.metrics_dir))  # type: ignore[no-untyped-call]
            for t in r.readers:
                t.join(timeout=0.5)


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"
