"""Fake parts for driving a :class:`~daemon.supervision.supervisor.Supervisor` without
etcd, processes or threads: the ranks, the etcd upkeep and the health monitor answer as
the protocols of ``daemon/supervision/parts.py`` say and record what they were asked;
:func:`node` builds a supervisor in a given state on them, and the setups put it in one
situation each (tests/unit/test_supervisor_transitions.py, test_supervisor_commands.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from daemon.accounting import Activity
from daemon.accounting.incidents import EtcdSeen
from daemon.config import load_daemon_config
from daemon.coordination import JobView
from daemon.fencing import Fence
from daemon.health import HealthReport
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import Join, RanksReport, UpkeepInput, UpkeepReport
from daemon.node_state.states import State
from daemon.node_state.view import NodeView
from daemon.ranks.spec import GroupPart
from daemon.ranks.stop_cause import FENCED_OUT, StopCause
from daemon.ranks.workers import ExitKind, GroupExit
from daemon.supervision.parts import Parts
from daemon.supervision.reports import upkeep_input
from daemon.supervision.seat_probe import Asking
from daemon.supervision.supervisor import HANDLERS, Supervisor
from daemon.supervision.systemd import Notifier

JOB = Path(__file__).resolve().parents[1] / "integration" / "daemon_job.toml"
LIGHTHOUSE = "10.0.0.1:29510"
FAILED = GroupExit(ExitKind.FAILED, [1], "rank 0 exited with 1")


@dataclass
class FakeRanks:
    last_codes: list[int | None] | None = None
    running: bool = False
    outcome: GroupExit | None = None  # what poll() returns
    all_stopped: bool = False  # what stopped() returns
    cause: StopCause = FENCED_OUT  # what take_cause() returns
    now: RankProgress = field(default_factory=RankProgress)  # what progress() returns
    calls: list[str] = field(default_factory=list)
    restarts: list[str | None] = field(default_factory=list)  # each start's restart reason
    modes: list[Activity | None] = field(default_factory=list)  # what account() was told
    standbys_live: list[bool] = field(default_factory=list)  # what tend_standbys() was told
    paused_for: list[str] = field(default_factory=list)  # each pause's reason

    def next_replica_uuid(self) -> str:
        return "uuid"

    def start(
        self,
        slot: int,
        lighthouse: str,
        part: GroupPart | None = None,
        reached: int | None = None,
        *,
        restart: str | None = None,
    ) -> None:
        self.calls.append(f"start {slot} {lighthouse}")
        self.restarts.append(restart)

    def progress(self) -> RankProgress:
        return self.now

    def account(self, mode: Activity | None, etcd: EtcdSeen | None = None) -> None:
        self.modes.append(mode)

    def tend_standbys(self, live: bool, slot: int | None) -> None:
        self.standbys_live.append(live)

    def report(self) -> RanksReport:
        return RanksReport(pids=(101,) if self.running else ())

    def poll(self) -> GroupExit | None:
        return self.outcome

    def failure_word(self, kind: ExitKind, lighthouse: str | None) -> dict[str, Any] | None:
        return {"quorum_id": 1, "kind": kind.value}

    def finishing(self) -> bool:
        return False

    def stop(self, cause: StopCause) -> None:
        self.calls.append("stop")

    def drain(self) -> None:
        self.calls.append("drain")

    def pause(self, why: str) -> None:
        self.calls.append("pause")
        self.paused_for.append(why)

    def resume(self, why: str) -> None:
        self.calls.append("resume")

    def stopped(self, grace_s: float) -> bool:
        return self.all_stopped

    def kill(self) -> None:
        self.calls.append("kill")

    def take_cause(self) -> StopCause:
        return self.cause


@dataclass
class FakeUpkeep:
    """Holds slot 0 of a one-group job whose lighthouse is known; reports it as values."""

    refusal: str = ""
    fenced: bool = False
    joined: Join = Join.JOINED
    must_pause: bool = False
    verdict: tuple[Fence, str] = (Fence.KEEP, "etcd confirmed the lease")
    asking: Asking = field(default_factory=Asking)  # what ask_members comes to
    silent: tuple[str, ...] = ()  # members whose host answers nothing (Seats.silent)
    free_slot: int | None = 0  # what claim() finds
    slot_lost: bool = False  # what the next round reports
    slot: int | None = 0
    lighthouse: str | None = LIGHTHOUSE  # the address etcd publishes
    job: JobView = field(
        default_factory=lambda: JobView({}, {0: "node-a"}, "node-a", LIGHTHOUSE, None, None, None)
    )
    calls: list[str] = field(default_factory=list)
    handed: list[UpkeepInput] = field(default_factory=list)  # what each round was handed
    states: list[tuple[str, int]] = field(default_factory=list)  # the job's, with the step

    def join(self) -> Join:
        return self.joined

    def tick(self, node: UpkeepInput) -> UpkeepReport:
        self.handed.append(node)
        return replace(self.report(), slot_lost=self.slot_lost)

    def report(self) -> UpkeepReport:
        return UpkeepReport(
            ranks_lighthouse=LIGHTHOUSE if self.lighthouse else None,
            lighthouse_up=self.lighthouse is not None,
            lighthouse=self.lighthouse,
            job=self.job,
            slot=self.slot,
            must_pause=self.must_pause,
            members_silent=self.silent,
        )

    def serving_http(self, port: int) -> None:
        pass

    def ranks_started(self) -> int | None:
        self.calls.append("ranks_started")
        return None

    def fence_verdict(self, node: UpkeepInput) -> tuple[Fence, str]:
        return self.verdict

    def claim(self) -> int | None:
        self.slot = self.free_slot
        return self.free_slot

    def give_back(self) -> bool:
        self.slot = None
        return True

    def holds_seat(self, job: JobView) -> bool:
        return True

    def ask_member(self, job: JobView, member: tuple[int, str]) -> None:
        pass

    def ask_members(self, job: JobView, silence: float, gone: tuple[str, ...] = ()) -> Asking:
        return self.asking

    def start_generation(self, gid: int, seen: int, store: dict[str, Any]) -> bool:
        return True

    def end_generation(self, gid: int, ended: int) -> None:
        pass

    def announce_failure(self, word: dict[str, Any] | None) -> None:
        self.calls.append("announce_failure")

    def set_state(self, state: str, step: int, **extra: object) -> None:
        self.calls.append(f"set_state {state}")
        self.states.append((state, step))

    def fail_job(self, message: str, step: int) -> None:
        self.calls.append("fail_job")

    def release(self) -> None:
        self.calls.append("release")

    def close(self) -> None:
        pass


@dataclass
class FakeHealth:
    latest: HealthReport | None = field(default_factory=lambda: HealthReport((), at=0.0))

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass
class Node:
    sup: Supervisor
    ranks: FakeRanks
    upkeep: FakeUpkeep

    @property
    def view(self) -> NodeView:
        return self.sup.view


def node(state: State, *overrides: str) -> Node:
    """A supervisor in `state` with fake parts: a one-node group holding slot 0 of a job
    whose lighthouse is known and whose one group is enough (job.min_replicas = 1)."""
    cfg = load_daemon_config(JOB, ["node.id=node-a", *overrides])
    view = NodeView(state=state, registered=state != State.JOINING)
    ranks, upkeep = FakeRanks(), FakeUpkeep()
    parts = Parts(ranks=ranks, upkeep=upkeep, health=FakeHealth(), notifier=Notifier({}))
    return Node(Supervisor(cfg, view, parts, threading.Event()), ranks, upkeep)


def handle(n: Node) -> State:
    """One handler's turn, after the round a tick does before it."""
    n.view.health = n.sup.health.latest
    n.sup.progress = n.sup.group.progress()
    n.sup.upkept = n.sup.upkeep.tick(upkeep_input(n.view, n.sup.progress))
    n.sup.decide(HANDLERS[n.view.state](n.sup))
    return n.view.state


def completed(n: Node) -> None:
    n.upkeep.job = replace(n.upkeep.job, state={"state": "completed", "step": 10})


def no_slot(n: Node) -> None:
    n.upkeep.slot = None


def stopped_by(cause: StopCause) -> Callable[[Node], None]:
    def setup(n: Node) -> None:
        n.ranks.all_stopped, n.ranks.cause = True, cause

    return setup


def refused(n: Node) -> None:
    n.upkeep.joined, n.upkeep.refusal = Join.REFUSED, "another job file"


def waited_out(n: Node) -> None:  # no lighthouse for longer than node.wait_timeout_s (1 s)
    n.upkeep.lighthouse = None
    n.sup.entered_at = time.monotonic() - 10.0


def running_ranks(outcome: GroupExit | None) -> Callable[[Node], None]:
    def setup(n: Node) -> None:
        n.ranks.running, n.ranks.outcome = True, outcome

    return setup


def verdict(fence: Fence) -> Callable[[Node], None]:
    def setup(n: Node) -> None:
        n.upkeep.verdict = (fence, "judged")

    return setup


def pause(n: Node) -> None:
    n.upkeep.must_pause = True


def nothing(n: Node) -> None:
    pass


def past_backoff(n: Node) -> None:
    n.sup.restart_at = 0.0


def fenced_out_without_a_slot(n: Node) -> None:
    stopped_by(FENCED_OUT)(n)
    no_slot(n)
