"""The per-node supervisor: one loop, one handler per state, one table of transitions.

Each tick: honour a pending SIGTERM, do one round of etcd upkeep, run the
current state's handler, which returns the next state (or the same one). The
moves allowed are :data:`daemon.states.TRANSITIONS`; any other is a bug and
raises. The table (a test keeps this copy equal to it)::

    JOINING    -> CLAIMING | DRAINING | FAILED
    CLAIMING   -> WAITING | DRAINING | DONE
    WAITING    -> CLAIMING | RUNNING | DRAINING | DONE | FAILED
    RUNNING    -> STOPPING | DRAINING | DONE
    STOPPING   -> CLAIMING | WAITING | RESTARTING | DRAINING | DONE | FAILED
    RESTARTING -> CLAIMING | WAITING | DRAINING | DONE
    DRAINING   -> DONE
    DONE       -> (exit)
    FAILED     -> (exit)

No handler blocks: stopping ranks (STOPPING, DRAINING) and starting the leader's
lighthouse (see ``daemon.leadership``) have deadlines checked once per tick.
etcd errors never reach a handler as exceptions (``daemon.upkeep``), and etcd
being away never touches the ranks: they do not need etcd to train. Exit codes
are ``daemon.exits``: 2 only for bad input, found while joining or by the ranks.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from daemon import __version__
from daemon.config import DaemonConfig, write_rank_config
from daemon.coordination import Coordinator
from daemon.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from daemon.restarts import RestartBudget
from daemon.states import TERMINAL, IllegalTransition, State, allowed
from daemon.systemd import Notifier
from daemon.upkeep import EtcdUpkeep, Event, Join
from daemon.view import NodeView
from daemon.workers import ExitKind, GroupExit, GroupSpec, WorkerGroup
from trainer import logs

TICK_S = 0.25
STOP_GRACE_S = 5.0  # ranks of a failed group get this long after SIGTERM before SIGKILL
WAIT_REPORT_S = 30.0


class Supervisor:
    def __init__(
        self, cfg: DaemonConfig, coordinator: Coordinator, notifier: Notifier | None = None
    ) -> None:
        self.cfg = cfg
        self.notifier = notifier or Notifier()
        self.log = logs.get()
        self.view = NodeView()
        self.run_dir = cfg.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rank_config = write_rank_config(cfg, self.run_dir / "config.json")
        # The slot this node held last time: a restarted node asks for it first, so its
        # group keeps its data shard (and its losses stay comparable across restarts).
        self.slot_file = self.run_dir / "slot"
        remembered = self.slot_file.read_text().strip() if self.slot_file.exists() else ""
        self.previous_slot = int(remembered) if remembered.isdigit() else None
        self.upkeep = EtcdUpkeep(cfg, coordinator, self.view, self.run_dir)
        self.group: WorkerGroup | None = None
        self.attempt = 0
        self.budget = RestartBudget(
            cfg.node.max_restarts, cfg.node.restart_window_s, cfg.node.restart_backoff_s
        )
        self.exit_code = EXIT_OK
        self.drain_requested = threading.Event()
        self.entered_at = time.monotonic()  # when the current state began
        self.reported_at = 0.0
        self.restart_at = 0.0
        self.restart_reason: str | None = None
        self.stop_cause: GroupExit | str | None = None  # why STOPPING: an exit or a reason
        self.completed_seen_at: float | None = None
        self.note: dict[str, Any] = {}  # fields for the next state_changed event
        self.handlers: dict[State, Callable[[], State]] = {
            State.JOINING: self._joining,
            State.CLAIMING: self._claiming,
            State.WAITING: self._waiting,
            State.RUNNING: self._running,
            State.STOPPING: self._stopping,
            State.RESTARTING: self._restarting,
            State.DRAINING: self._draining,
        }

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        self.log.info(
            "daemon_started", version=__version__, pid=os.getpid(), run_dir=str(self.run_dir)
        )
        try:
            while self.view.state not in TERMINAL:
                started = time.monotonic()
                self.tick()
                time.sleep(max(0.0, TICK_S - (time.monotonic() - started)))
        finally:
            if self.group is not None:
                self.group.kill()
            self.upkeep.close()
        self.log.info(
            "daemon_exit",
            state=self.view.state.value,
            code=self.exit_code,
            error=self.view.last_error,
        )
        return self.exit_code

    def tick(self) -> None:
        state = self.view.state
        if self.drain_requested.is_set() and state not in (*TERMINAL, State.DRAINING):
            self.move(self._drain())
        self.upkeep.tick()
        if Event.SLOT_LOST in self.upkeep.take_events() and self.view.state == State.RUNNING:
            self.move(self._stop("slot lost while etcd was away"))
        handler = self.handlers.get(self.view.state)
        if handler is not None:
            self.move(handler())
        self.view.ticks += 1
        self.view.last_tick = time.monotonic()
        self.notifier.watchdog()

    def move(self, to: State) -> None:
        frm = self.view.state
        if to == frm:
            return
        if not allowed(frm, to):
            raise IllegalTransition(f"{frm.name} -> {to.name} is not in daemon.states.TRANSITIONS")
        note, self.note = self.note, {}
        self.log.info("state_changed", **{"from": frm.value, "to": to.value}, **note)
        self.view.state, self.entered_at = to, time.monotonic()
        self.view.waiting_for = None
        self.notifier.status(f"{to.value} group={self._slot_label()} step={self.view.step}")

    def request_drain(self) -> None:
        """Called from the SIGTERM handler: only sets a flag, the loop does the work."""
        self.drain_requested.set()

    def _slot_label(self) -> str:
        return "-" if self.view.slot is None else str(self.view.slot)

    # ------------------------------------------------------------------ handlers

    def _joining(self) -> State:
        joined = self.upkeep.join()
        if joined == Join.REFUSED:
            return self._fail(self.upkeep.refusal, EXIT_BAD_INPUT)
        if joined == Join.NOT_YET:
            return State.JOINING
        self.view.registered = True
        self.log.info("node_registered", node=self.cfg.node_id, host=self.cfg.advertise_host)
        self.notifier.ready(f"claiming group=- step={self.view.step}")
        return State.CLAIMING

    def _claiming(self) -> State:
        if self._job_completed():
            return self._done("job completed")
        preferred = self.view.slot if self.view.slot is not None else self.previous_slot
        slot = self.upkeep.claim(preferred)
        if slot is None:
            return State.CLAIMING  # every slot is taken (stand by) or etcd is away
        self.view.slot = slot
        self.slot_file.write_text(f"{slot}\n")
        logs.bind(replica_group=slot)
        self.log.info("slot_claimed", slot=slot)
        return State.WAITING

    def _waiting(self) -> State:
        if self._job_completed():
            return self._done("job completed")
        if self.view.slot is None:
            return State.CLAIMING
        missing = self._missing()
        if missing is None:
            self._start_group()
            return State.RUNNING
        now, waited = time.monotonic(), time.monotonic() - self.entered_at
        if missing != self.view.waiting_for or now - self.reported_at > WAIT_REPORT_S:
            self.log.info("waiting", waiting_for=missing, waited_s=round(waited, 1))
            self.view.waiting_for, self.reported_at = missing, now
        timeout = self.cfg.node.wait_timeout_s
        if timeout and waited > timeout:
            return self._fail(f"waited {timeout:.0f}s for {missing}", EXIT_FAILED)
        return State.WAITING

    def _running(self) -> State:
        assert self.group is not None
        self.view.pids = self.group.pids
        outcome = self.group.poll()
        if outcome is None:
            if self._job_completed() and self._completion_grace_over():
                return self._stop("the job completed elsewhere")
            return State.RUNNING
        if outcome.kind == ExitKind.COMPLETED:
            self.group.kill()  # every rank has exited 0: this only reaps
            self.group, self.view.pids = None, []
            self.upkeep.set_state("completed")
            return self._done("training completed")
        self.log.warning(
            "group_failed", kind=outcome.kind.value, reason=outcome.reason, codes=outcome.codes
        )
        return self._stop(outcome)

    def _stopping(self) -> State:
        assert self.group is not None
        if not self.group.stopped(STOP_GRACE_S):
            return State.STOPPING
        self.group, self.view.pids = None, []
        cause, self.stop_cause = self.stop_cause, None
        if cause == "slot lost while etcd was away":
            return State.CLAIMING if self.view.slot is None else State.WAITING
        if not isinstance(cause, GroupExit):
            return self._done(str(cause))
        if cause.kind == ExitKind.DRAINED:  # a rank was told to stop by someone else
            return self._fail("ranks were stopped from outside the daemon", EXIT_FAILED)
        if cause.kind == ExitKind.BAD_INPUT:
            return self._fail(self.view.last_error or cause.reason, EXIT_BAD_INPUT)
        if self._missing_groups():
            # Not a crash: the ranks timed out waiting for peers that are gone.
            self.log.info("group_waiting_for_peers", detail=cause.reason)
            self.restart_reason = "peers"
            return State.WAITING
        reason = "hang" if cause.kind == ExitKind.HUNG else "rank_exit"
        now = time.monotonic()
        if not self.budget.allows(now):
            error = self.view.last_error or cause.reason
            window = self.cfg.node.restart_window_s
            message = f"gave up after {self.cfg.node.max_restarts} restarts in {window:.0f}s; last error: {error}"
            return self._fail(message, EXIT_FAILED)
        delay = self.budget.record(now)
        self.view.restarts[reason] = self.view.restarts.get(reason, 0) + 1
        self.restart_reason, self.restart_at = reason, now + delay
        self.note = {"reason": reason, "detail": cause.reason, "delay_s": round(delay, 2)}
        return State.RESTARTING

    def _restarting(self) -> State:
        if self._job_completed():
            return self._done("job completed")
        if self.view.slot is None:
            return State.CLAIMING
        return State.RESTARTING if time.monotonic() < self.restart_at else State.WAITING

    def _draining(self) -> State:
        if self.group is not None and not self.group.stopped(self.cfg.node.drain_grace_s):
            return State.DRAINING
        if self.group is not None:
            outcome = self.group.poll()
            self.log.info("group_drained", codes=outcome.codes if outcome else None)
            self.group, self.view.pids = None, []
        return self._done("drained")

    # ------------------------------------------------------ what handlers share

    def _missing(self) -> str | None:
        """What WAITING still needs before starting the group; None when nothing."""
        if not self.view.lighthouse or self.upkeep.forwarder.target is None:
            return "a lighthouse address in etcd"
        return self._missing_groups()

    def _missing_groups(self) -> str | None:
        job, need = self.view.job, self.cfg.job.min_replicas
        have = len(job.groups) if job is not None else 0
        return None if have >= need else f"replica groups: {have} of job.min_replicas={need}"

    def _start_group(self) -> None:
        assert self.view.slot is not None
        self.attempt += 1
        node = self.cfg.node
        spec = GroupSpec(
            nproc=node.nproc,
            slot=self.view.slot,
            num_slots=self.cfg.job.max_replicas,
            lighthouse=self.upkeep.forwarder.url,
            config_path=self.rank_config,
            run_dir=self.run_dir,
            min_replicas=self.cfg.job.min_replicas,
            job=self.cfg.job.name,
            node=self.cfg.node_id,
            advertise_host=self.cfg.advertise_host,
            extra_env=node.env,
            hang_timeout_s=node.hang_timeout_s,
            metrics_dir=self.cfg.metrics_dir if self.cfg.metrics.enabled else None,
        )
        self.group = WorkerGroup(spec, self.attempt, self._on_rank_event)
        self.group.start()
        self.view.pids = self.group.pids
        fields = {"slot": self.view.slot, "attempt": self.attempt, "pids": self.group.pids}
        if self.restart_reason is None:
            self.log.info("group_started", master_port=self.group.master_port, **fields)
        else:
            self.log.info("group_restarted", reason=self.restart_reason, **fields)
        self.restart_reason = None
        state = self.view.job.state if self.view.job else None
        if not state or state.get("state") not in ("running", "completed"):
            self.upkeep.set_state("running")

    def _stop(self, cause: GroupExit | str) -> State:
        """Begin stopping the group (SIGKILL at once if hung); STOPPING decides what next."""
        assert self.group is not None
        self.stop_cause = cause
        if isinstance(cause, GroupExit) and cause.kind == ExitKind.HUNG:
            self.group.kill()  # a hung rank may ignore SIGTERM
        else:
            if isinstance(cause, str):
                self.log.info("group_stopping", reason=cause)
            self.group.request_stop()
        return State.STOPPING

    def _on_rank_event(self, rank: int, event: dict[str, Any]) -> None:
        """Called from the rank output threads: track progress, then relay the event."""
        self.view.track(event, self.cfg.node_id)
        logs.relay(event)

    def _job_completed(self) -> bool:
        state = self.view.job.state if self.view.job else None
        return bool(state) and state.get("state") == "completed"  # type: ignore[union-attr]

    def _completion_grace_over(self) -> bool:
        """Another node completed the job: our running group gets drain_grace_s to finish too."""
        now = time.monotonic()
        self.completed_seen_at = self.completed_seen_at or now
        return now - self.completed_seen_at >= self.cfg.node.drain_grace_s

    # ------------------------------------------------------------------ endings

    def _drain(self) -> State:
        self.log.info("draining", grace_s=self.cfg.node.drain_grace_s)
        self.notifier.stopping(f"draining group={self._slot_label()}")
        if self.group is not None:
            self.group.request_stop()
        return State.DRAINING

    def _done(self, reason: str) -> State:
        self.upkeep.release()
        self.log.info("node_done", reason=reason, step=self.view.step)
        return State.DONE

    def _fail(self, message: str, code: int) -> State:
        self.view.last_error, self.exit_code = message, code
        if self.group is not None:
            self.group.kill()
            self.group, self.view.pids = None, []
        job = self.view.job
        if (
            code == EXIT_FAILED
            and job is not None
            and set(job.groups.values()) <= {self.cfg.node_id}
        ):
            self.upkeep.set_state("failed", error=message)  # no other group carries the job on
        self.upkeep.release()
        self.log.error("node_failed", error=message, code=code)
        return State.FAILED
