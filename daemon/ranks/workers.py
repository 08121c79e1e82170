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
import signal
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from daemon.children import free_port, kill_tree
from daemon.exits import RANK_BAD_INPUT, RANK_DRAINED, RANK_NO_QUORUM
from daemon.ranks.hang import Timeouts
from daemon.ranks.rank_process import ChildProcess, Output, RankEvent, spawn
from daemon.ranks.spec import RANK_ARGV, GroupSpec, heartbeat_path, rank_env
from trainer.contracts import heartbeat as heartbeat_file
from trainer.contracts.heartbeat import Beat, read_beat

if TYPE_CHECKING:
    from daemon.ranks.standby import Standby


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
    beat: Beat = field(
        default_factory=Beat
    )  # the phase the rank last said it entered (daemon.ranks.hang)

    def idle_for(self, now: float, samples: list[float] | None = None) -> float:
        """Seconds since this rank's heartbeat last changed (as seen by the daemon); a
        change also reads the phase, and a step's time into `samples`."""
        try:
            mtime = self.heartbeat.stat().st_mtime_ns
        except OSError:
            mtime = self.beat_mtime_ns
        if mtime != self.beat_mtime_ns:
            self.beat_mtime_ns, self.progressed_at = mtime, now
            self.beat = read_beat(self.heartbeat)
            if samples is not None and self.beat.step_s is not None:
                samples.append(self.beat.step_s)
        return now - self.progressed_at

    @property
    def pid(self) -> int:
        return self.popen.pid


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
        self.samples: list[float] = []  # step times read since take_samples

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    @property
    def standbys_used(self) -> int:
        return sum(r.from_standby for r in self.ranks)

    def start(
        self, standbys: list[Standby | None] | None = None, master_port: int | None = None
    ) -> None:
        """Start every rank: local rank r is handed to standbys[r] where there is one that
        takes the assignment, else spawned cold. `master_port`: the group's store port
        where another node (or this one, before publishing it) chose it."""
        s = self.spec
        self.master_port = master_port or free_port(self.spec.bind_host)
        (s.run_dir / heartbeat_file.DIRECTORY).mkdir(parents=True, exist_ok=True)
        self.started_at = time.monotonic()
        for rank in range(s.nproc):
            heartbeat = heartbeat_path(s, rank)
            # Emptied, not touched: a restart's file still holds the dead rank's last beat,
            # whose phase (`step`, with its learned timeout) and quorum would otherwise be
            # read as the new rank's while it imports and builds.
            heartbeat.write_bytes(b"")
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

    def finishing(self) -> bool:
        """Some rank has begun to leave on its own (its heartbeat reads `finish`: the job's
        last step, or a drain its group agreed on), read from the heartbeats now."""
        now = time.monotonic()
        for r in self.ranks:
            r.idle_for(now, self.samples)  # reads a heartbeat that changed
        return any(r.beat.phase == "finish" for r in self.ranks)

    def take_samples(self) -> list[float]:
        """The step times the ranks reported since the last call."""
        samples, self.samples = self.samples, []
        return samples

    def poll(self, limits: Timeouts) -> GroupExit | None:
        """Classify the group's state: None while it is healthy and running. A rank is
        hung when its heartbeat stays unchanged longer than its phase's timeout."""
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
        idle = [
            r.idle_for(now, self.samples) if c is None else 0.0
            for r, c in zip(self.ranks, codes, strict=True)
        ]
        if self.stop_requested_at is None and not self.paused:
            for r, quiet in zip(self.ranks, idle, strict=True):
                limit = limits.of(r.beat.phase)
                if quiet > limit:
                    how = "learned" if r.beat.phase == "step" and limits.learned else "set"
                    return GroupExit(
                        ExitKind.HUNG,
                        codes,
                        f"rank {r.rank} made no progress for {limit:.1f}s in phase "
                        f"{r.beat.phase} (its timeout, {how})",
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
