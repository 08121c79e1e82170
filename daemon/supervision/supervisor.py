"""The per-node supervisor: one loop, one handler per state, one table of transitions.

Each tick: honour a pending SIGTERM, do one round of etcd upkeep, run the
current state's handler, which returns the next state (or the same one). The
moves allowed are :data:`daemon.node_state.states.TRANSITIONS`; any other is a bug and
raises. The table (a test keeps this copy equal to it)::

    JOINING    -> CLAIMING | DRAINING | FAILED
    CLAIMING   -> WAITING | DRAINING | DONE
    WAITING    -> CLAIMING | RUNNING | DRAINING | DONE | FAILED
    RUNNING    -> FENCED | STOPPING | DRAINING | DONE
    FENCED     -> RUNNING | STOPPING | DRAINING
    STOPPING   -> CLAIMING | WAITING | RESTARTING | DRAINING | DONE | FAILED
    RESTARTING -> CLAIMING | WAITING | DRAINING | DONE
    DRAINING   -> DONE
    DONE       -> (exit)
    FAILED     -> (exit)

No handler blocks (stopping ranks and a new leader's lighthouse have deadlines checked
each tick), and no etcd error reaches one as an exception (upkeep.py): a short outage
never touches the ranks, one that puts the lease in doubt pauses them (FENCED, fencing).
The parts are handed in (parts.py) and hand back frozen reports (node_state/).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from daemon import __version__
from daemon.config import DaemonConfig
from daemon.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from daemon.fencing import Fence
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import Join, RanksReport, UpkeepReport
from daemon.node_state.states import TERMINAL, IllegalTransition, State, allowed
from daemon.node_state.view import NodeView
from daemon.ranks import stop_cause as stops
from daemon.ranks.workers import ExitKind
from daemon.supervision import aside as asides
from daemon.supervision import commands as do
from daemon.supervision import health_gate as gate
from daemon.supervision.after_stop import after_stop
from daemon.supervision.commands import Command, Decision, carry_out, to
from daemon.supervision.generation import next_part
from daemon.supervision.parts import Parts
from daemon.supervision.reports import exit_report, node_status, time_goes_to, upkeep_input
from daemon.supervision.restarts import RestartBudget
from daemon.supervision.spanning import SpanningGroup
from daemon.supervision.waiting import Waiting
from trainer import logs

TICK_S = 0.25
SPARE = "a free seat (every seat is held: this node waits as a spare)"
# States in which the node keeps standbys: it holds a slot or is on its way to one.
STANDBY_STATES = (State.CLAIMING, State.WAITING, State.RUNNING, State.STOPPING, State.RESTARTING)
STOP_GRACE_S = 5.0  # ranks of a failed group get this long after SIGTERM before SIGKILL


class Supervisor:
    """The node's loop over its parts (parts.py), handed in: :func:`build_supervisor`
    (assembly.py) wires the real ones; a unit test drives it with fakes."""

    def __init__(
        self, cfg: DaemonConfig, view: NodeView, parts: Parts, wake: threading.Event
    ) -> None:
        self.cfg, self.view = cfg, view
        self.parts, self.group, self.upkeep = parts, parts.ranks, parts.upkeep
        self.health, self.notifier, self.log = parts.health, parts.notifier, logs.get()
        self.wake = wake  # a rank's output ended, or the job changed in etcd: look at once
        self._publishing = threading.Lock()  # builds and swaps of the published status
        self.upkept = UpkeepReport()  # the last round's (the published status has it too)
        self.ranked, self.progress = RanksReport(), RankProgress()  # the node group's, see tick
        self.waiting = Waiting(cfg)
        self.budget = RestartBudget.for_node(cfg.node)
        nodes = cfg.job.nodes_per_group  # a group across nodes: its generations (spanning.py)
        self.spanning = SpanningGroup(nodes) if nodes > 1 else None
        self.exit_code, self.drain_requested = EXIT_OK, threading.Event()
        self.entered_at = time.monotonic()  # when the current state began
        self.restart_at = 0.0  # when RESTARTING's backoff ends
        self.restart_reason: str | None = None  # why the next start is a restart
        self.note: dict[str, Any] = {}  # fields for the next state_changed event
        self.aside = asides.Aside()  # paused while a silent member is asked (aside.py)
        self.published = node_status(view, cfg)  # see publish

    # ------------------------------------------------------------------ the loop

    def run(self, http_port: int | None = None) -> int:
        """The loop until a terminal state; returns the exit code. `http_port`: the port the
        status server is bound to (node.http_port = 0 picks one), for the node's record."""
        if http_port is not None:
            self.upkeep.serving_http(http_port)
        self.log.info(
            "daemon_started", version=__version__, pid=os.getpid(), run_dir=str(self.cfg.run_dir)
        )
        self.health.start()  # its first report comes before the node may claim a seat
        try:
            while self.view.state not in TERMINAL:
                started = time.monotonic()
                self.tick()
                self.wake.wait(max(0.0, TICK_S - (time.monotonic() - started)))
                self.wake.clear()
        finally:
            self.health.stop()
            self.group.kill()
            self.upkeep.close()
            self.progress = self.group.progress()  # with what the ranks said as they ended
        ending = exit_report(self.cfg, self.view, self.exit_code, self.progress, self.upkept)
        self.log.info("daemon_exit", **ending)
        return self.exit_code

    def tick(self) -> None:
        state, self.progress = self.view.state, self.group.progress()
        if self.cfg.node.straggler_drain and self.progress.stragglers and state == State.RUNNING:
            self.log.warning("straggler_drain", ranks=dict(self.progress.stragglers))
            self.drain_requested.set()  # the others stop waiting for this node's group
        self.view.health = self.health.latest  # one immutable report (daemon.health)
        if self.drain_requested.is_set() and state not in (*TERMINAL, State.DRAINING):
            self.decide(self._drain())
        self.upkept = self.upkeep.tick(upkeep_input(self.view, self.progress, self.aside.active))
        if self.upkept.slot_lost and self.view.state in (State.RUNNING, State.FENCED):
            self.decide(self._stop(stops.SLOT_LOST))
        # Each live state's handler (HANDLERS); a move runs the next one in the same tick
        # (STOPPING -> RESTARTING -> WAITING -> RUNNING), a handler that stays put ends it.
        for _ in range(len(State)):
            if self.view.state in TERMINAL:
                break
            before = self.view.state
            self.decide(HANDLERS[before](self))
            self.upkept = self.upkeep.report()  # as the handler's verbs left it
            if self.view.state == before:
                break
        live = self.view.state in STANDBY_STATES or self.aside.active  # (not the fence's)
        self.group.tend_standbys(live and not self.drain_requested.is_set(), self.upkept.slot)
        up = self.upkept  # a spare's wait is its own; etcd's answers: an outage (incidents)
        self.group.account(time_goes_to(self.view.state, up.spare), up.etcd_seen)
        self.ranked = self.group.report()  # what the ranks look like after this tick
        self.view.ticks, self.view.last_tick = self.view.ticks + 1, time.monotonic()
        self.publish()
        self.notifier.watchdog()

    def publish(self, upkept: UpkeepReport | None = None) -> None:
        """Swap in what /status and /metrics show (node_state.status), under one lock: after
        each tick, each rank event, and mid-round with the upkeep's report (the election)."""
        with self._publishing:
            up = self.upkept = upkept or self.upkept  # and the ranks' newest progress:
            self.published = node_status(
                self.view, self.cfg, up, self.ranked, self.group.progress()
            )

    def decide(self, decision: Decision) -> None:
        """Carry out a handler's commands, in order (commands.py), then move on."""
        carry_out(decision.commands, self.parts, self.log, self.publish)
        self.move(decision.state)

    def move(self, state: State) -> None:
        frm = self.view.state
        if state == frm:
            return
        if not allowed(frm, state):
            raise IllegalTransition(f"{frm.name} -> {state.name} is not in states.TRANSITIONS")
        note, self.note = self.note, {}
        self.log.info("state_changed", **{"from": frm.value, "to": state.value}, **note)
        self.view.state, self.entered_at = state, time.monotonic()
        self.aside = replace(self.aside, active=self.aside.active and state == State.FENCED)
        self.group.account(time_goes_to(state, self.upkept.spare))  # every state it passes
        self.view.waiting_for = None
        step = self.progress.step
        self.notifier.status(f"{state.value} group={self.upkept.slot_label} step={step}")

    def request_drain(self) -> None:
        """Called from the SIGTERM handler: only sets a flag, the loop does the work."""
        self.drain_requested.set()

    # ------------------------------------------------------------------ handlers

    def _joining(self) -> Decision:
        joined = self.upkeep.join()
        if joined == Join.REFUSED:
            return self._fail(self.upkeep.refusal, EXIT_BAD_INPUT)
        if joined == Join.NOT_YET:
            return to(State.JOINING)
        self.view.registered = True
        host = self.cfg.advertise_host
        return to(
            State.CLAIMING,
            do.info("node_registered", node=self.cfg.node_id, host=host),
            do.Notify("ready", f"claiming group=- step={self.progress.step}"),
        )

    def _claiming(self) -> Decision:
        if self.upkept.job_completed:
            return self._done("job completed")
        shared = gate.shared_fault(self.view.health, self.upkept.job, self.cfg.node_id)
        # An unhealthy node claims no seat (but on a fault every node shares).
        blocked = gate.claim_blocked(self.view.health, shared)
        if blocked is not None:
            self.waiting.say(blocked, since=self.entered_at, shown=self.view.waiting_for)
            self.view.waiting_for = blocked
            return to(State.CLAIMING)
        # None: every slot is taken (stand by) or etcd is away
        if self.upkeep.claim() is None:  # what it waits for is a seat, not the health
            self.view.waiting_for = SPARE if self.upkeep.report().spare else None
            return to(State.CLAIMING)
        if not shared:
            return to(State.WAITING)
        fields = {"failing": gate.failing(self.view.health), "detail": gate.SHARED}
        return to(State.WAITING, do.warning("shared_fault_claim", **fields))

    def _waiting(self) -> Decision:
        v, up, spanning = self.view, self.upkept, self.spanning
        if up.job_completed:
            return self._done("job completed")
        if up.slot is None:
            return to(State.CLAIMING)
        shared = gate.shared_fault(v.health, up.job, self.cfg.node_id)
        if not shared and gate.must_leave(v.health, self.cfg.health.leave_after, False, 0, 0):
            return to(State.CLAIMING if self.upkeep.give_back() else State.WAITING)
        # No ranks start on an unhealthy node (but on a fault every node shares).
        blocked = gate.claim_blocked(v.health, shared)
        if blocked is not None:
            self.waiting.say(blocked, since=self.entered_at, shown=v.waiting_for)
            v.waiting_for = blocked
            return to(State.WAITING)
        lighthouse = up.ranks_lighthouse
        missing = self.waiting.missing(up)
        job = up.job if spanning is not None else None  # a group across nodes
        asked: tuple[Command, ...] = ()
        if job is not None and spanning is not None:
            # Asked at once, while our failed ranks' quorum requests expire (seat_probe.py).
            member = spanning.blocker(job, up.slot, up.node_rank)
            asked = (do.AskMember(job, member),) if member is not None else ()
            if missing is None and not self.upkeep.holds_seat(job):
                return to(State.CLAIMING, *asked)  # revoked while out of touch
            missing = missing or spanning.missing(job, up.slot, up.node_rank)
        if missing is not None:
            error = self.waiting.report(missing, since=self.entered_at, shown=v.waiting_for)
            v.waiting_for = missing
            if error is not None:
                return self._fail(error, EXIT_FAILED).preceded_by(*asked)
            return to(State.WAITING, *asked)
        assert lighthouse is not None and (job or not spanning)  # missing() asks for both
        part = None
        if job is not None and spanning is not None:
            seat = (up.slot, up.node_rank)
            part = next_part(spanning, job, seat, self.cfg, self.group, self.upkeep)
            if part is None:
                return to(State.WAITING, *asked)  # etcd away or another moved first
            spanning.started(job, up.slot, part.generation)
            v.generation = part.generation
        restart, self.restart_reason = self.restart_reason, None  # said by its event
        start = do.StartRanks(up.slot, lighthouse, part, self.upkeep.ranks_started(), restart)
        job_state = up.job.state if up.job else None
        if job_state and job_state.get("state") in ("running", "completed"):
            return to(State.RUNNING, *asked, start)
        return to(State.RUNNING, *asked, start, do.SetJobState("running", self.progress.step))

    def _running(self) -> Decision:
        v, up, p = self.view, self.upkept, self.progress
        if up.must_pause:  # nothing may commit here now (the fence judge's)
            return to(State.FENCED, do.PauseRanks())
        told: tuple[Command, ...] = ()  # the group's hang, announced before anything else
        if self.spanning is not None and up.job is not None and up.slot is not None:
            w = asides.watch(self.spanning, up, self.ranked, self.aside, v.generation, self.parts)
            self.aside = w.aside  # a member's host answers nothing: step aside (aside.py)
            # Ranks already leaving (the job's end, an agreed drain) finish by themselves.
            if w.moved is not None and not self.group.finishing():
                return self._stop(stops.GroupRestart(w.moved))
            if w.why is not None:
                return to(State.FENCED, do.AnnounceFailure(w.word), do.PauseRanks(w.why))
            told = (do.AnnounceFailure(w.word),) if w.word is not None else ()
        if gate.running_group_leaves(v.health, up.job, up.slot, self.cfg):
            assert v.health is not None
            return self._stop(stops.Unhealthy(v.health.summary())).preceded_by(*told)
        if p.started_over and self.cfg.job.on_no_state == "stop":
            return self._stop(stops.NoState(p.started_over_from)).preceded_by(*told)
        outcome = self.group.poll()
        if outcome is None:
            # Completed elsewhere: drain_grace_s to finish too, unless too far behind.
            waited = v.completed_for(time.monotonic(), up.job_completed)
            if waited >= self.cfg.node.drain_grace_s or up.behind_the_end(p.step):
                return self._stop(stops.JobEnded("the job completed elsewhere")).preceded_by(*told)
            return to(State.RUNNING, *told)
        if outcome.kind == ExitKind.COMPLETED:  # with the replication `phalanx status` shows
            p = self.progress = self.group.progress()  # with the ranks' last steps
            extra = {"largest_quorum": p.largest_quorum, "groups": up.most_groups}
            recorded = do.SetJobState("completed", p.step, extra)
            return self._done("training completed").preceded_by(*told, recorded)
        fields = {"kind": outcome.kind.value, "reason": outcome.reason, "codes": outcome.codes}
        word = self.group.failure_word(outcome.kind, up.job.lighthouse if up.job else None)
        failed = (do.warning("group_failed", **fields), do.AnnounceFailure(word))
        return self._stop(outcome).preceded_by(*told, *failed)

    def _fenced(self) -> Decision:
        """Ranks paused until etcd answers, or while a silent member is asked about
        (aside.py); then resume them, or discard their state (a seat revoked: restart)."""
        outcome = self.group.poll()
        if outcome is not None:  # a paused rank was killed from outside
            fields = {"kind": outcome.kind.value, "reason": outcome.reason}
            return self._stop(outcome).preceded_by(do.warning("group_failed", **fields))
        if self.aside.active and not self.upkept.must_pause:
            since, up = self.entered_at, self.upkept
            verdict, why = asides.held(self.spanning, up, self.aside, self.upkeep, since)
        else:
            self.aside = replace(self.aside, active=False)  # the fence's pause from here on
            verdict, why = self.upkeep.fence_verdict(upkeep_input(self.view, self.progress))
        if verdict == Fence.KEEP:
            return to(State.RUNNING, do.ResumeRanks(why))
        if verdict == Fence.HOLD:
            self.view.waiting_for = why  # shown on /status while the ranks stay paused
            return to(State.FENCED)
        return self._stop(stops.GroupRestart(why) if self.aside.active else stops.FENCED_OUT)

    def _stopping(self) -> Decision:
        if not self.group.stopped(STOP_GRACE_S):
            return to(State.STOPPING)
        now = time.monotonic()
        self.waiting.after_exit(self.group.last_codes, now)
        v = after_stop(
            self.group.take_cause(),
            slot_held=self.upkept.slot is not None,
            missing_groups=self.upkept.missing_groups(self.cfg.job.min_replicas),
            budget=self.budget,
            now=now,
            last_error=self.view.failure or self.progress.rank_error,
            spanning=self.spanning is not None,
        )
        if v.state == State.FAILED:
            return self._fail(v.error, v.code)
        if v.state == State.DONE:
            return self._done(v.reason)
        self.restart_reason = v.reason or self.restart_reason  # for the next start's event
        if v.reason == "peers":
            return to(v.state, do.info("group_waiting_for_peers", detail=v.detail))
        if v.reason:  # a restart: after a backoff (RESTARTING), or at once after a fence
            self.view.restarts[v.reason] = self.view.restarts.get(v.reason, 0) + 1
            self.restart_at, self.note = now + v.delay_s, v.note()
        return to(v.state)

    def _restarting(self) -> Decision:
        if self.upkept.job_completed:
            return self._done("job completed")
        if self.upkept.slot is None:
            return to(State.CLAIMING)
        return to(State.RESTARTING if time.monotonic() < self.restart_at else State.WAITING)

    def _draining(self) -> Decision:
        was_running = self.group.running
        if not self.group.stopped(self.cfg.node.drain_grace_s):
            return to(State.DRAINING)
        said = (do.info("group_drained", codes=self.group.last_codes),) if was_running else ()
        return self._done("drained").preceded_by(*said)

    # ------------------------------------------------------ what handlers share

    def _stop(self, cause: stops.StopCause) -> Decision:
        """Begin stopping the group (STOPPING decides what next); a spanning group's
        generation moves on (unless another did), so its other nodes stop theirs at once."""
        ended = self.spanning.stopped() if self.spanning is not None else None
        if ended is None or self.upkept.slot is None:
            return to(State.STOPPING, do.StopRanks(cause))
        self.view.generation = None  # published: in our record at once (the first node waits)
        ending = (do.Publish(), do.EndGeneration(self.upkept.slot, ended), do.StopRanks(cause))
        return to(State.STOPPING, *ending)

    # ------------------------------------------------------------------ endings

    def _drain(self) -> Decision:
        # A spanning group's generation is left as it is: its ranks agree to stop after the
        # same step (the writer group saves it); a node takes this one's seat, given back.
        grace = {"grace_s": self.cfg.node.drain_grace_s}
        stopping = do.Notify("stopping", f"draining group={self.upkept.slot_label}")
        return to(State.DRAINING, do.info("draining", **grace), stopping, do.DrainRanks())

    def _done(self, reason: str) -> Decision:
        said = do.info("node_done", reason=reason, step=self.progress.step)
        return to(State.DONE, do.Release(), said)

    def _fail(self, message: str, code: int) -> Decision:
        self.view.failure, self.exit_code = message, code
        failed = (do.FailJob(message, self.progress.step),) if code == EXIT_FAILED else ()
        said = do.error("node_failed", error=message, code=code)
        return to(State.FAILED, do.KillRanks(), *failed, do.Release(), said)


# The handler of each live state: what it decides this tick, and the state it moves to.
HANDLERS: dict[State, Callable[[Supervisor], Decision]] = {
    State.JOINING: Supervisor._joining,
    State.CLAIMING: Supervisor._claiming,
    State.WAITING: Supervisor._waiting,
    State.RUNNING: Supervisor._running,
    State.FENCED: Supervisor._fenced,
    State.STOPPING: Supervisor._stopping,
    State.RESTARTING: Supervisor._restarting,
    State.DRAINING: Supervisor._draining,
}
