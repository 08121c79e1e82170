"""The supervisor's handle on this node's ranks: at most one :class:`WorkerGroup` at a time.

It numbers the attempts, remembers why the current group is being stopped, says what
its ranks look like (:meth:`NodeGroup.report`, a frozen value), and logs each start.
It holds no view of the node: a rank's event is folded into its own
:class:`~daemon.node_state.progress.ProgressFold` (read as a frozen
:meth:`NodeGroup.progress`), then `tracked` is called (the supervisor's publish). Each method does
one thing and returns at once; the waiting (STOPPING, DRAINING) is the
supervisor's, one :meth:`stopped` call per tick.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from daemon.accounting import Action, Activity, Kind
from daemon.accounting.incidents import EtcdSeen
from daemon.config import DaemonConfig
from daemon.node_state.progress import ProgressFold, RankProgress
from daemon.node_state.reports import RanksReport
from daemon.ranks.failure_notice import failure_word
from daemon.ranks.hang import HangLimits, StepTimes, timeouts
from daemon.ranks.spec import GroupPart, GroupSpec
from daemon.ranks.standby import REFILL_DELAY_S, StandbyPool
from daemon.ranks.stop_cause import GroupRestart, StopCause
from daemon.ranks.workers import ExitKind, GroupExit, WorkerGroup
from trainer import logs
from trainer.spares.scheduling import may_leave_idle

# A group's failures that are an incident of this node's (the others follow from one:
# a quorum timed out because of something that struck elsewhere).
STRUCK = {ExitKind.FAILED: Kind.RANK_EXIT, ExitKind.HUNG: Kind.HANG}


def keeps_replica_id(codes: list[int | None] | None) -> bool:
    """Whether a group's next start may join the lighthouse under the replica id of the
    start before, whose exit `codes` these are (every rank is reaped by then).

    Only rank 0 counts: its torchft manager server is the group's one lighthouse client.
    Killed by a signal (SIGKILL, the OOM killer, a crash, or the daemon ending a failed or
    hung group), it is replaced under its id: the lighthouse counts the replacement's
    heartbeats and quorum requests as the dead process's, so the others' next quorum
    forms as soon as the replacement asks, not once the dead one's heartbeat times out.
    Ended on its own (an exit code: a quorum timeout, a failed heal, a drain), it may have
    died waiting for a quorum; the replacement's heartbeats would keep that request
    alive, so the next start is a new replica (see Waiting.after_exit)."""
    first = codes[0] if codes else None
    return first is not None and first < 0


class NodeGroup:
    def __init__(
        self,
        cfg: DaemonConfig,
        rank_config: Path,
        wake: threading.Event | None = None,
        tracked: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.fold = ProgressFold(cfg.node_id)  # the ranks' events (node_state/progress.py)
        self.rank_config = rank_config
        self.wake = wake
        self.tracked = tracked  # called once a rank event is folded in (Supervisor.publish)
        self.log = logs.get()
        self.standbys = (
            StandbyPool(cfg.node.nproc, self._on_rank_event, wake) if cfg.node.standby else None
        )
        # Standbys that warm at idle priority refill at once (see tend_standbys).
        self.refill_delay_s = 0.0 if may_leave_idle() else REFILL_DELAY_S
        self._standby_spec: GroupSpec | None = None  # the last one built, for its slot
        self.current: WorkerGroup | None = None
        self.attempt = 0
        self.slot: int | None = None  # the slot of the last start
        self.cause: StopCause | None = None  # why it is being stopped
        self.last_codes: list[int | None] | None = None  # the exit codes of the last group
        # The uuid of the group's torchft replica id, drawn by the first start: a restart
        # takes its predecessor's place at the lighthouse at once (see keeps_replica_id).
        self.replica_uuid = ""
        # Hang timeouts: the settings, and the step times learned so far (kept across the
        # group's restarts: a restarted group is no slower than the one it replaces).
        self.limits = HangLimits.from_config(cfg)
        self.step_times = StepTimes()
        self.timeouts = timeouts(self.limits, self.step_times)
        self._phases: tuple[str, ...] = ()  # each rank's, as the last poll saw them
        self._quiet_since: float | None = None  # when the stillest rank last beat (poll)

    @property
    def running(self) -> bool:
        return self.current is not None

    def next_replica_uuid(self) -> str:
        """The uuid the next start joins under (see keeps_replica_id): the group's first
        node publishes it, with its store, to the group's other nodes."""
        if not keeps_replica_id(self.last_codes) or not self.replica_uuid:
            self.replica_uuid = str(uuid.uuid4())
        return self.replica_uuid

    def start(
        self,
        slot: int,
        lighthouse: str,
        part: GroupPart | None = None,
        reached: int | None = None,
        *,
        restart: str | None = None,
    ) -> None:
        """Start the ranks in `slot`: a group of this node alone, or this node's `part` of
        a group that spans nodes (its seat, the group's store port and replica uuid).
        `reached`: the job's reached step in etcd (None: unread), for a start-over;
        `restart`: why this start is a restart (``group_restarted``), None for the first."""
        self.fold.reached(reached)
        self.attempt, self.slot = self.attempt + 1, slot
        replica_uuid = part.replica_uuid if part is not None else self.next_replica_uuid()
        seat = part.seat if part is not None else None
        spec = GroupSpec.for_node(
            self.cfg, slot, lighthouse, self.rank_config, replica_uuid, seat=seat
        )
        self.current = WorkerGroup(spec, self.attempt, self._on_rank_event, self.wake)
        self.current.start(
            self.standbys.take() if self.standbys is not None else None,
            master_port=part.master_port if part is not None else None,
        )
        fields: dict[str, Any] = {"slot": slot, "attempt": self.attempt, "pids": self.current.pids}
        if part is not None:
            fields.update(node_rank=part.seat.node_rank, generation=part.generation)
        fields["standbys_used"] = self.current.standbys_used
        if restart is None:
            self.log.info("group_started", master_port=self.current.master_port, **fields)
        else:
            self.log.info("group_restarted", reason=restart, **fields)

    def progress(self) -> RankProgress:
        """What the ranks' events said, folded (safe from any thread)."""
        return self.fold.snapshot()

    def account(self, mode: Activity | None, etcd: EtcdSeen | None = None) -> None:
        """The node's time goes to `mode` from now (None: the ranks' steps say which); and
        what the round saw of etcd (ProgressFold.account)."""
        self.fold.account(mode, etcd, self.slot)

    def report(self) -> RanksReport:
        """What the ranks look like now: pids, standbys, phases and hang timeouts."""
        t, pool = self.timeouts, self.standbys
        return RanksReport(
            pids=tuple(self.current.pids) if self.current is not None else (),
            standby_pids=tuple(pool.pids) if pool is not None else (),
            phases=self._phases,
            quiet_since=self._quiet_since,
            hang_timeouts=MappingProxyType(dict(t.by_phase)),
            hang_learned=t.learned,
            step_time_quantile_s=t.step_quantile_s,
            step_time_median_s=t.step_median_s,
        )

    def tend_standbys(self, live: bool, slot: int | None) -> None:
        """Once per tick: keep a standby per local rank while the node is `live` (holds or
        seeks a slot, not draining), none otherwise. Standbys a start used are replaced at
        once where they are forked warm or warm up at idle priority (they take only CPU
        the ranks leave, as the survivors wait out the heal), else REFILL_DELAY_S after the
        start, so their imports do not slow the new group's heal."""
        pool = self.standbys
        if pool is None:
            return
        if not live:
            pool.kill()
        elif (
            self.current is not None
            and not pool.forks
            and time.monotonic() - self.current.started_at < self.refill_delay_s
        ):
            pool.reap()
        else:  # the start's own values (slot, lighthouse, store port) come on takeover
            pool.fill(self._spec_for_standbys(slot or 0))

    def _spec_for_standbys(self, slot: int) -> GroupSpec:
        """The standbys' spec for `slot`, built again only when the slot changes: a spec
        reads a dozen config fields, and this is asked every tick."""
        spec = self._standby_spec
        if spec is None or spec.slot != slot:
            spec = self._standby_spec = GroupSpec.for_node(self.cfg, slot, "", self.rank_config)
        return spec

    def poll(self) -> GroupExit | None:
        """The group's outcome, None while it runs; a completed group is reaped at once."""
        assert self.current is not None
        outcome = self.current.poll(self.timeouts)
        samples = self.current.take_samples()
        if samples:  # the timeouts learn the step times
            self.step_times = self.step_times.add(samples)
            self.timeouts = timeouts(self.limits, self.step_times)
        self._phases = tuple(r.beat.phase for r in self.current.ranks)
        beats = [r.progressed_at for r in self.current.ranks if r.progressed_at > 0]
        self._quiet_since = min(beats, default=None)
        if outcome is not None and outcome.kind == ExitKind.COMPLETED:
            self.kill()  # every rank has exited 0: this only reaps
        elif outcome is not None and outcome.kind in STRUCK:  # the incident record's
            quiet = self._quiet_since if outcome.kind == ExitKind.HUNG else None
            began = None if quiet is None else time.time() - (time.monotonic() - quiet)
            self.fold.struck(STRUCK[outcome.kind], outcome.reason, self.slot, began=began)
        return outcome

    def failure_word(self, kind: ExitKind, lighthouse: str | None) -> dict[str, Any] | None:
        """What to announce for the group that just ended with `kind` (daemon/ranks/failure_notice.py)."""
        if self.current is None:
            return None
        spec, beats = self.current.spec, [r.heartbeat for r in self.current.ranks]
        return failure_word(kind, spec.slot, spec.replica_uuid, beats, lighthouse)

    def finishing(self) -> bool:
        """The ranks have begun to leave by themselves (see WorkerGroup.finishing)."""
        return self.current is not None and self.current.finishing()

    def stop(self, cause: StopCause) -> None:
        """Begin stopping for `cause`: SIGTERM, or SIGKILL at once for a hang or a
        paused group (its state is being thrown away; it must not run another step)."""
        assert self.current is not None
        self.cause = cause
        hung = isinstance(cause, GroupExit) and cause.kind == ExitKind.HUNG
        if not isinstance(cause, GroupExit):  # the ranks' own exit was logged as it came
            self.log.info("group_stopping", reason=cause.reason)
        # A hung rank may ignore SIGTERM; a spanning group's ended generation has lost a
        # member, so its ranks could neither finish a step nor save one (a drain's save
        # is a collective): they may wait on that member in gloo for ft.timeout_s.
        if hung or self.current.paused or isinstance(cause, GroupRestart):
            self.current.kill()
            return
        self.current.request_stop()

    def drain(self) -> None:
        why = "asked to drain (SIGTERM, or node.straggler_drain)"
        self.fold.struck(Kind.DRAIN, why, self.slot, Action.DRAINED)
        if self.current is not None and self.current.paused:
            self.current.kill()  # fenced: leaving the quorum cleanly is not ours to do
        elif self.current is not None:
            self.current.request_stop()

    def pause(self, why: str) -> None:
        assert self.current is not None
        self.current.pause()
        self.log.warning("group_paused", reason=why, pids=self.current.pids)

    def resume(self, why: str) -> None:
        assert self.current is not None
        self.current.resume()
        self.log.info("group_resumed", reason=why, pids=self.current.pids)

    def stopped(self, grace_s: float) -> bool:
        """After stop or drain: True once no rank is left (SIGKILL after `grace_s`)."""
        if self.current is not None and not self.current.stopped(grace_s):
            return False
        if self.current is not None:
            outcome = self.current.poll(self.timeouts)
            self.last_codes = outcome.codes if outcome else None
        self.current, self._phases = None, ()
        return True

    def kill(self) -> None:
        """SIGKILL the ranks (and the standbys: this ends the node or its group for good)."""
        if self.standbys is not None:
            self.standbys.kill()
        if self.current is not None:
            self.current.kill()
            outcome = self.current.poll(self.timeouts)
            self.last_codes = outcome.codes if outcome else None
        self.current, self._phases = None, ()
        self.fold.left()

    def take_cause(self) -> StopCause:
        cause, self.cause = self.cause, None
        assert cause is not None, "stopped without a cause"
        return cause

    def _on_rank_event(self, rank: int, event: dict[str, Any]) -> None:
        """Called from the rank output threads: track progress, then relay the event."""
        lost_from = self.fold.track(event)
        if self.tracked is not None:
            self.tracked()
        logs.relay(event)
        if lost_from is not None:
            self.log.warning(
                "job_started_over",
                from_step=lost_from,
                detail=(
                    f"this group committed step 1 again after step {lost_from}: no peer group "
                    "had state to heal from and no checkpoint was there to load (none saved "
                    "yet, or checkpoint.dir unset), so the job trains again from step 0"
                ),
            )
