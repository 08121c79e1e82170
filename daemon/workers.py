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
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.children import free_port, kill_tree
from daemon.config import DaemonConfig
from daemon.exits import RANK_BAD_INPUT, RANK_DRAINED, RANK_NO_QUORUM
from daemon.fencing import LEASE_FILE
from daemon.netif import interface_for
from daemon.rank_process import ChildProcess, Output, RankEvent, spawn

if TYPE_CHECKING:
    from daemon.standby import Standby

RANK_ARGV = [sys.executable, "-m", "trainer"]


class ExitKind(StrEnum):
    COMPLETED = "completed"
    BAD_INPUT = "bad_input"
    DRAINED = "drained"
    FAILED = "failed"
    HUNG = "hung"
    NO_QUORUM = "no_quorum"  # the ranks that failed timed out waiting for a quorum


@dataclass(frozen=True)
class GroupExit:
    kind: ExitKind
    codes: list[int | None]
    reason: str


@dataclass
class Rank:
    rank: int
    popen: ChildProcess
    heartbeat: Path
    output: Output
    from_standby: bool = False
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
    # The uuid of the group's torchft replica id (PHALANX_REPLICA_UUID), kept across the
    # group's restarts by NodeGroup; "" lets torchft pick one per process.
    replica_uuid: str = ""

    @classmethod
    def for_node(
        cls,
        cfg: DaemonConfig,
        slot: int,
        lighthouse: str,
        config_path: Path,
        replica_uuid: str = "",
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
            replica_uuid=replica_uuid,
        )


def heartbeat_path(spec: GroupSpec, rank: int) -> Path:
    return spec.run_dir / "heartbeat" / f"rank-{rank}"


def rank_env(spec: GroupSpec, rank: int, master_port: int, attempt: int) -> dict[str, str]:
    """The environment of local rank `rank` in one start of the group (a standby is spawned
    with the same variables, placeholders for the start's own, and gets these on takeover)."""
    s = spec
    env = {
        **os.environ,
        **s.extra_env,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(s.nproc),
        "LOCAL_WORLD_SIZE": str(s.nproc),
        "GROUP_RANK": "0",
        "MASTER_ADDR": s.advertise_host,  # rank 0 hosts the store; torchft publishes it to peers
        "MASTER_PORT": str(master_port),
        "REPLICA_GROUP_ID": str(s.slot),
        "NUM_REPLICA_GROUPS": str(s.num_slots),
        "TORCHFT_LIGHTHOUSE": s.lighthouse,
        "PHALANX_CONFIG": str(s.config_path),
        "PHALANX_MIN_REPLICAS": str(s.min_replicas),
        "PHALANX_HEARTBEAT": str(heartbeat_path(s, rank)),
        "PHALANX_LEASE_FILE": str(s.run_dir / LEASE_FILE),
        "PHALANX_JOB": s.job,
        "PHALANX_NODE": s.node,
        "PHALANX_ADVERTISE_HOST": s.advertise_host,
        "PHALANX_BIND_HOST": s.bind_host,
        "PHALANX_ATTEMPT": str(attempt),
        "PYTHONUNBUFFERED": "1",
    }
    if s.replica_uuid:
        env["PHALANX_REPLICA_UUID"] = s.replica_uuid
    else:
        env.pop("PHALANX_REPLICA_UUID", None)
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


class WorkerGroup:
    """One start of the node's ranks. A restart is a new WorkerGroup (fresh store port)."""

    def __init__(
        self,
        spec: GroupSpec,
        attempt: int,
        on_event: RankEvent,
        wake: threading.Event | None = None,
    ) -> None:
        self.spec = spec
        self.attempt = attempt
        self.on_event = on_event
        self.wake = wake  # set when a rank's output ends (it exited): the supervisor looks at once
        self.ranks: list[Rank] = []
        self.started_at = 0.0
        self.master_port = 0
        self.stop_requested_at: float | None = None
        self.paused = False  # SIGSTOPped while the node is fenced

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    @property
    def standbys_used(self) -> int:
        return sum(r.from_standby for r in self.ranks)

    def start(self, standbys: list[Standby | None] | None = None) -> None:
        """Start every rank: local rank r is handed to standbys[r] where there is one that
        takes the assignment, else spawned cold."""
        s = self.spec
        self.master_port = free_port(self.spec.bind_host)
        (s.run_dir / "heartbeat").mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        for rank in range(s.nproc):
            heartbeat = heartbeat_path(s, rank)
            heartbeat.touch()
            env = rank_env(s, rank, self.master_port, self.attempt)
            standby = standbys[rank] if standbys and rank < len(standbys) else None
            if standby is not None and standby.assign(env, s.slot, self.on_event):
                popen, output, warm = standby.popen, standby.output, True
            else:
                argv = [*RANK_ARGV, "--config", str(s.config_path)]
                popen, warm = spawn(argv, env), False
                output = Output(popen, rank, s.slot, self.on_event, self.wake)
            r = Rank(rank, popen, heartbeat, output, warm, progressed_at=self.started_at)
            r.idle_for(self.started_at)
            self.ranks.append(r)

    def poll(self) -> GroupExit | None:
        """Classify the group's state: None while it is healthy and running."""
        codes = [r.popen.poll() for r in self.ranks]
        now = time.monotonic()
        if any(c is not None and c not in (0, RANK_DRAINED) for c in codes):
            bad = [c for c in codes if c is not None and c not in (0, RANK_DRAINED)]
            kind = _failure_kind(bad)
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
            r.output.reap(self.spec.metrics_dir)


def _failure_kind(bad: list[int]) -> ExitKind:
    """What the non-zero exit codes seen so far say: bad input wins, and a group is
    late peers' victim only while every rank that failed says so."""
    if RANK_BAD_INPUT in bad:
        return ExitKind.BAD_INPUT
    return ExitKind.NO_QUORUM if all(c == RANK_NO_QUORUM for c in bad) else ExitKind.FAILED


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code} (no quorum)" if code == RANK_NO_QUORUM else f"code {code}"
