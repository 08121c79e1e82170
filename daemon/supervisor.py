"""The per-node supervisor: an explicit state machine driven by one loop.

::

    JOINING -> CLAIMING -> WAITING -> RUNNING -> DONE
                               ^         |
                               |         v
                           RESTARTING <--+--> FAILED
    (any state) --SIGTERM--> DRAINING -> DONE

* JOINING: reach etcd, open a session, check the job spec, register the node.
* CLAIMING: claim a replica-group slot (the previous one first); stand by if none.
* WAITING: wait for a lighthouse address (and min_replicas claimed groups).
* RUNNING: the ranks run; watch for exit, hang and job completion.
* RESTARTING: back off within the restart budget, then start a fresh group.
* DRAINING: SIGTERM the ranks (they leave the quorum after the step), release
  the slot and leadership, exit 0.

Alongside the states, every tick maintains the etcd session, runs the leader's
lighthouse, and points the local lighthouse forwarder at the published address.
etcd being unreachable never touches the ranks: they do not need etcd to train.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from daemon import __version__
from daemon.config import DaemonConfig, write_rank_config
from daemon.coordination import Coordinator, EtcdAccessDenied, EtcdUnavailable, SpecMismatch
from daemon.leadership import Leadership
from daemon.lighthouse import Forwarder
from daemon.restarts import RestartBudget
from daemon.systemd import Notifier
from daemon.view import NodeView, State
from daemon.workers import ExitKind, GroupExit, GroupSpec, WorkerGroup
from trainer import logs

TICK_S = 0.25
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Supervisor:
    def __init__(
        self, cfg: DaemonConfig, coordinator: Coordinator, notifier: Notifier | None = None
    ) -> None:
        self.cfg = cfg
        self.coord = coordinator
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
        self.forwarder = Forwarder(port=cfg.node.lighthouse_proxy_port)
        self.leadership = Leadership(cfg, coordinator, self.run_dir)
        self.group: WorkerGroup | None = None
        self.attempt = 0
        self.budget = RestartBudget(
            cfg.node.max_restarts, cfg.node.restart_window_s, cfg.node.restart_backoff_s
        )
        self.restart_at = 0.0
        self.restart_reason = ""
        self.exit_code = EXIT_OK
        self.drain_requested = threading.Event()
        self.completed_seen_at: float | None = None
        self._etcd_retry_at = 0.0
        self._etcd_backoff = 0.5
        self._record_at = 0.0
        self._last_record: dict[str, Any] = {}
        self.http_port = cfg.node.http_port  # the bound port, set by the CLI

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        self.log.info(
            "daemon_started", version=__version__, pid=os.getpid(), run_dir=str(self.run_dir)
        )
        try:
            while self.view.state not in (State.DONE, State.FAILED):
                started = time.monotonic()
                self.tick()
                self.view.last_tick = time.monotonic()
                time.sleep(max(0.0, TICK_S - (time.monotonic() - started)))
        finally:
            self._shutdown()
        self.log.info(
            "daemon_exit",
            state=self.view.state.value,
            code=self.exit_code,
            error=self.view.last_error,
        )
        return self.exit_code

    def tick(self) -> None:
        if self.drain_requested.is_set() and self.view.state not in (
            State.DRAINING,
            State.DONE,
            State.FAILED,
        ):
            self._drain()
        self._etcd()
        handler = {
            State.JOINING: self._joining,
            State.CLAIMING: self._claiming,
            State.WAITING: self._waiting,
            State.RUNNING: self._running,
            State.RESTARTING: self._restarting,
            State.DRAINING: self._draining,
        }.get(self.view.state)
        if handler:
            handler()
        self.notifier.watchdog()

    def request_drain(self) -> None:
        """Called from the SIGTERM handler: only sets a flag, the loop does the work."""
        self.drain_requested.set()

    def transition(self, to: State, **fields: Any) -> None:
        if to == self.view.state:
            return
        self.log.info("state_changed", **{"from": self.view.state.value, "to": to.value}, **fields)
        self.view.state = to
        self.notifier.status(self._status_line())

    def _status_line(self) -> str:
        slot = "-" if self.view.slot is None else self.view.slot
        return f"{self.view.state.value} group={slot} step={self.view.step}"

    # ------------------------------------------------------------------ etcd

    def _etcd(self) -> None:
        """Session, leadership, lighthouse and the job view; any etcd error just defers the work."""
        if (
            self.view.state in (State.JOINING, State.DONE, State.FAILED)
            or time.monotonic() < self._etcd_retry_at
        ):
            return
        try:
            if self.coord.ensure_session():
                self._rejoin()
            if not self.leadership.update(self.view):
                self._etcd_retry_at = time.monotonic() + 2.0  # a lighthouse would not start
            job = self.coord.snapshot()
            self._etcd_ok()
        except EtcdUnavailable as e:
            self._etcd_failed(e)
            return
        self.view.job = job
        self._publish_checkpoint()
        if job.lighthouse:  # a key briefly absent during a leader change keeps the old target
            self.view.lighthouse = job.lighthouse
            self.forwarder.set_target(job.lighthouse)
        self._update_record()

    def _etcd_ok(self) -> None:
        if not self.view.etcd_up:
            self.log.info("etcd_up", endpoints=self.coord.settings.endpoints)
        self.view.etcd_up = True
        self._etcd_backoff = 0.5

    def _etcd_failed(self, error: Exception) -> None:
        self.view.etcd_errors += 1
        if self.view.etcd_up:
            self.log.warning("etcd_unavailable", error=str(error), ranks="untouched")
        self.view.etcd_up = False
        self._etcd_retry_at = time.monotonic() + self._etcd_backoff
        self._etcd_backoff = min(5.0, self._etcd_backoff * 2)

    def _rejoin(self) -> None:
        """A new lease (first session, or the old one expired while etcd was away)."""
        if not self.view.registered:
            return
        self.log.info("etcd_session_renewed", slot=self.view.slot)
        self._register()
        if self.view.slot is not None:
            slot = self.coord.claim_slot(self.cfg.job.max_replicas, preferred=self.view.slot)
            if slot != self.view.slot:
                self.log.warning("slot_lost", previous=self.view.slot, now=slot)
                self._stop_group("slot lost while etcd was away")
                self.view.slot = slot
                logs.bind(replica_group=slot)
                self.transition(State.CLAIMING if slot is None else State.RESTARTING)
                self.restart_at = time.monotonic()
            else:
                self.log.info("slot_reclaimed", slot=slot)

    def _register(self) -> None:
        self._last_record = {}
        self._update_record(force=True)

    def _update_record(self, force: bool = False) -> None:
        record = {
            "host": self.cfg.advertise_host,
            "http_port": self.http_port,
            "pid": os.getpid(),
            "version": __version__,
            "group": self.view.slot,
            "state": self.view.state.value,
            "step": self.view.step,
            "pids": self.view.pids,
        }
        now = time.monotonic()
        changed = {k: v for k, v in record.items() if k != "step"} != {
            k: v for k, v in self._last_record.items() if k != "step"
        }
        if force or changed or (record != self._last_record and now - self._record_at > 2.0):
            self.coord.register(record)
            self._last_record, self._record_at = record, now

    # ---------------------------------------------------------------- states

    def _joining(self) -> None:
        if time.monotonic() < self._etcd_retry_at:
            return
        try:
            self.coord.connect()
            self.coord.ensure_session()
            self.coord.check_spec(self.cfg.spec())
            self._register()
            self._etcd_ok()
        except SpecMismatch as e:
            self._fail(str(e), EXIT_BAD_INPUT)
            return
        except EtcdAccessDenied as e:
            self._fail(str(e), EXIT_BAD_INPUT)
            return
        except EtcdUnavailable as e:
            self._etcd_failed(e)
            return
        self.view.registered = True
        self.log.info("node_registered", node=self.cfg.node_id, host=self.cfg.advertise_host)
        self.notifier.ready(self._status_line())
        self.transition(State.CLAIMING)

    def _claiming(self) -> None:
        if self._job_finished():
            return
        try:
            preferred = self.view.slot if self.view.slot is not None else self.previous_slot
            slot = self.coord.claim_slot(self.cfg.job.max_replicas, preferred=preferred)
        except EtcdUnavailable as e:
            self._etcd_failed(e)
            return
        if slot is None:
            return  # every slot is taken: stand by, try again next tick
        self.view.slot = slot
        self.slot_file.write_text(f"{slot}\n")
        logs.bind(replica_group=slot)
        self.log.info("slot_claimed", slot=slot)
        self.transition(State.WAITING, slot=slot)

    def _waiting(self) -> None:
        if self._job_finished():
            return
        job = self.view.job
        if job is None or not job.lighthouse or self.forwarder.target is None:
            return
        if len(job.groups) < self.cfg.job.min_replicas:
            return
        self._start_group()
        self.transition(State.RUNNING, slot=self.view.slot, attempt=self.attempt)

    def _running(self) -> None:
        assert self.group is not None
        self.view.pids = self.group.pids
        outcome = self.group.poll()
        if outcome is None:
            self._job_finished(grace_for_group=True)
            return
        self._group_exited(outcome)

    def _restarting(self) -> None:
        if self._job_finished():
            return
        if time.monotonic() < self.restart_at:
            return
        if self.view.slot is None:
            self.transition(State.CLAIMING)
            return
        job = self.view.job
        if job is None or not job.lighthouse or self.forwarder.target is None:
            return
        self._start_group(reason=self.restart_reason)
        self.transition(State.RUNNING, slot=self.view.slot, attempt=self.attempt)

    def _draining(self) -> None:
        grace = self.cfg.node.drain_grace_s
        if self.group is not None and not self.group.stopped(grace):
            return
        if self.group is not None:
            outcome = self.group.poll()
            self.log.info("group_drained", codes=outcome.codes if outcome else None)
            self.group = None
        self.view.pids = []
        self._release()
        self.transition(State.DONE, reason="drained")

    # -------------------------------------------------------------- the group

    def _start_group(self, reason: str | None = None) -> None:
        assert self.view.slot is not None
        self.attempt += 1
        spec = GroupSpec(
            nproc=self.cfg.node.nproc,
            slot=self.view.slot,
            num_slots=self.cfg.job.max_replicas,
            lighthouse=self.forwarder.url,
            config_path=self.rank_config,
            run_dir=self.run_dir,
            min_replicas=self.cfg.job.min_replicas,
            job=self.cfg.job.name,
            node=self.cfg.node_id,
            advertise_host=self.cfg.advertise_host,
            extra_env=self.cfg.node.env,
            hang_timeout_s=self.cfg.node.hang_timeout_s,
            metrics_dir=self.cfg.metrics_dir if self.cfg.metrics.enabled else None,
        )
        self.group = WorkerGroup(spec, self.attempt, self._on_rank_event)
        self.group.start()
        self.view.pids = self.group.pids
        fields = {
            "slot": self.view.slot,
            "attempt": self.attempt,
            "pids": self.group.pids,
            "master_port": self.group.master_port,
        }
        if reason is None:
            self.log.info("group_started", **fields)
        else:
            self.log.info("group_restarted", reason=reason, **fields)

    def _group_exited(self, outcome: GroupExit) -> None:
        assert self.group is not None
        if outcome.kind in (ExitKind.FAILED, ExitKind.HUNG, ExitKind.BAD_INPUT):
            self.log.warning(
                "group_failed", kind=outcome.kind.value, reason=outcome.reason, codes=outcome.codes
            )
        if outcome.kind == ExitKind.HUNG:
            self.group.kill()  # a hung rank may ignore SIGTERM
        else:
            self.group.stop(grace_s=5.0)  # stops the rest, reaps everyone
        self.group = None
        self.view.pids = []
        if outcome.kind == ExitKind.COMPLETED:
            self._complete()
            return
        if outcome.kind == ExitKind.DRAINED:  # a rank was told to stop by someone else
            self._fail("ranks were stopped from outside the daemon", EXIT_FAILED)
            return
        if outcome.kind == ExitKind.BAD_INPUT:
            self._fail(self.view.last_error or outcome.reason, EXIT_BAD_INPUT)
            return
        reason = "hang" if outcome.kind == ExitKind.HUNG else "rank_exit"
        now = time.monotonic()
        if not self.budget.allows(now):
            message = (
                f"gave up after {self.cfg.node.max_restarts} restarts in {self.cfg.node.restart_window_s:.0f}s; "
                f"last error: {self.view.last_error or outcome.reason}"
            )
            self._fail(message, EXIT_FAILED)
            return
        delay = self.budget.record(now)
        self.view.restarts[reason] = self.view.restarts.get(reason, 0) + 1
        self.restart_reason = reason
        self.restart_at = now + delay
        self.transition(
            State.RESTARTING, reason=reason, detail=outcome.reason, delay_s=round(delay, 2)
        )

    def _stop_group(self, why: str) -> None:
        if self.group is not None:
            self.log.info("group_stopping", reason=why)
            self.group.stop(grace_s=self.cfg.node.drain_grace_s)
            self.group = None
            self.view.pids = []

    def _on_rank_event(self, rank: int, event: dict[str, Any]) -> None:
        """Called from the rank output threads: track progress, then relay the event."""
        self.view.track(event, self.cfg.node_id)
        logs.relay(event)

    def _publish_checkpoint(self) -> None:
        """checkpoints/latest in etcd, from the main loop (rank threads only record it)."""
        record = self.view.take_checkpoint()
        if record is None:
            return
        try:
            self.coord.publish_checkpoint(record)
            self.log.info("checkpoint_published", step=record["step"], path=record["path"])
        except EtcdUnavailable:
            self.view.return_checkpoint(record)

    # ------------------------------------------------------------ completion

    def _job_finished(self, grace_for_group: bool = False) -> bool:
        """True (and DONE) once the job's state key says completed; a running group gets a grace to finish."""
        job = self.view.job
        if job is None or not job.state or job.state.get("state") != "completed":
            return False
        if grace_for_group and self.group is not None:
            now = time.monotonic()
            self.completed_seen_at = self.completed_seen_at or now
            if now - self.completed_seen_at < self.cfg.node.drain_grace_s:
                return False
            self._stop_group("the job completed elsewhere")
        self._release()
        self.transition(State.DONE, reason="job completed", step=job.state.get("step"))
        return True

    def _complete(self) -> None:
        try:
            self.coord.set_state("completed", self.view.step, node=self.cfg.node_id)
        except EtcdUnavailable as e:
            self.log.warning("state_not_written", error=str(e))
        self._release()
        self.transition(State.DONE, reason="training completed", step=self.view.step)

    def _fail(self, message: str, code: int) -> None:
        self.view.last_error = message
        self.exit_code = code
        if self.group is not None:
            self.group.kill()
            self.group = None
        self._release()
        self.log.error("node_failed", error=message, code=code)
        self.transition(State.FAILED, error=message)

    def _drain(self) -> None:
        self.log.info("draining", grace_s=self.cfg.node.drain_grace_s)
        self.notifier.stopping(f"draining group={self.view.slot}")
        if self.group is not None:
            self.group.request_stop()
        self.transition(State.DRAINING)

    def _release(self) -> None:
        """Give back the slot and leadership now, rather than after the lease TTL."""
        try:
            self.leadership.resign(self.view)
            if self.view.slot is not None:
                self.coord.release_slot(self.view.slot)
        except EtcdUnavailable as e:
            self.log.warning("release_deferred", error=str(e), note="the lease TTL frees them")

    def _shutdown(self) -> None:
        if self.group is not None:
            self.group.kill()
            self.group = None
        self.leadership.stop()
        self.forwarder.close()
        try:
            self.coord.close(revoke=True)
        except Exception as e:
            self.log.warning("etcd_close_failed", error=str(e))
