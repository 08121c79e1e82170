"""etcd upkeep for one node: session, record, slot, rejoin, leadership, checkpoints, job state.

:class:`EtcdUpkeep` is the only caller of the :class:`~daemon.coordination.coordinator.Coordinator`
in the daemon, and no coordination error leaves it as an exception. Each one
becomes what the state machine needs to know:

* etcd unreachable (or a lost lease): ``view.etcd_up`` goes false, the round is
  retried with backoff; only once the lease is in doubt does :attr:`fenced`
  go true (``daemon.coordination.fencing``: the lighthouse stops, the supervisor pauses the ranks);
* a conflict (a compare-and-swap that lost a race, ``NotLeader``, a key that
  "keeps changing"): logged as ``etcd_retry`` and tried again next round;
* a refusal that is the user's to fix (another job file, wrong credentials, a
  node id that another live daemon holds, an address another machine's node
  advertises): only while joining, returned as
  :data:`Join.REFUSED` with its message;
* a lost slot after a new session: ``slot_lost`` in the round's :class:`UpkeepReport`.

Each round (:meth:`EtcdUpkeep.tick`) returns an :class:`UpkeepReport`, the values the
supervisor acts on; the fence is asked through :meth:`EtcdUpkeep.ranks_must_pause` and
:meth:`EtcdUpkeep.fence_verdict`, and :meth:`EtcdUpkeep.ranks_started` ends the judging
of a lost lease, each owned here.

A node id held by another live daemon is waited on, then refused (held_id.py).

A new session (the old lease was lost by our clock) re-registers and re-claims
first, and only then revokes the old lease, so the node's keys never vanish
all at once for a standby to grab.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from daemon.config import DaemonConfig
from daemon.config.preflight import node_device
from daemon.coordination import (
    LEASE_FILE,
    AddressHeld,
    CoordinationError,
    Coordinator,
    EtcdAccessDenied,
    EtcdUnavailable,
    Fence,
    JobWatch,
    NodeIdHeld,
    SpecMismatch,
    address_clash,
    fence_margin_s,
    refresh_every_s,
)
from daemon.leadership import Forwarder, Leadership, parse_address
from daemon.node_state import NodeView, State
from daemon.supervision.fence_judge import FenceJudge
from daemon.supervision.held_id import HeldIdWait
from daemon.supervision.lease_file import LeaseFile
from daemon.supervision.node_record import NodeRecord
from trainer import logs

T = TypeVar("T")
BACKOFF_FIRST_S, BACKOFF_CAP_S = 0.5, 5.0


class Join(StrEnum):
    JOINED = "joined"
    NOT_YET = "not_yet"  # etcd unreachable or a conflict: try again next tick
    REFUSED = "refused"  # bad input: another job file, wrong credentials


@dataclass(frozen=True)
class UpkeepReport:
    """What one round of upkeep leaves the supervisor to act on."""

    slot_lost: bool = False  # a new session could not keep this node's slot
    lighthouse: str | None = None  # the ranks' TORCHFT_LIGHTHOUSE once the forwarder has a target
    lighthouse_up: bool = False  # that target, and our lighthouse process while we lead


class EtcdUpkeep:
    def __init__(
        self,
        cfg: DaemonConfig,
        coord: Coordinator,
        view: NodeView,
        run_dir: Path,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.coord = coord
        self.view = view
        self.log = logs.get()
        self.leadership = Leadership(cfg, coord, run_dir)
        self.forwarder = Forwarder(port=cfg.node.lighthouse_proxy_port)
        self.watch = JobWatch(f"{coord.prefix}nodes/{cfg.node_id}", wake)
        self.refusal = ""
        self._slot_lost = False  # since the last report
        self._published: dict[str, Any] | None = None  # the checkpoint record last published
        self.record = NodeRecord(cfg, coord, view)
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST_S
        self._outage_reported = False  # etcd_unavailable logged for the outage under way
        self._bad_lighthouse: object = None
        self.held_id = HeldIdWait(cfg.etcd.lease_ttl_s + cfg.etcd.timeout_s + 1.0)
        self.judge = FenceJudge(cfg.node_id)  # partition safety (fence_judge.py)
        self.snapshot_at = 0.0  # when view.job was last read
        self.lease_file = LeaseFile(run_dir / LEASE_FILE)
        self.slot_file = run_dir / "slot"

    # ------------------------------------------------------------ error handling

    def _attempt(
        self, what: str, fn: Callable[[], T], refusals: tuple[type[Exception], ...] = ()
    ) -> tuple[bool, T | None]:
        """Run one coordination step; every error becomes state, never an exception
        (but `refusals`, which the caller turns into a refusal to join)."""
        try:
            value = fn()
        except refusals:
            raise
        except EtcdUnavailable as e:  # includes a lost lease (SessionExpired)
            self.view.etcd_errors += 1
            if self.view.etcd_up or not self._outage_reported:  # also when never reached
                self._outage_reported = True
                self.log.warning(
                    "etcd_unavailable",
                    error=str(e),
                    during=what,
                    endpoints=self.coord.settings.endpoints,
                    ranks="untouched",
                    retrying=True,
                )
            self.view.etcd_up = False
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(BACKOFF_CAP_S, self._backoff * 2)
            return False, None
        except CoordinationError as e:  # NotLeader, a lost compare-and-swap, "keeps changing"
            self.view.etcd_errors += 1
            self.log.warning("etcd_retry", error=str(e), kind=type(e).__name__, during=what)
            return False, None
        if not self.view.etcd_up:
            self.log.info("etcd_up", endpoints=self.coord.settings.endpoints)
        self.view.etcd_up = True
        self._outage_reported = False
        self._backoff = BACKOFF_FIRST_S
        return True, value

    def _due(self) -> bool:
        return time.monotonic() >= self._retry_at

    # ------------------------------------------------------------------ joining

    def join(self) -> Join:
        """Connect, open a session, check the job spec, register."""
        if not self._due():
            return Join.NOT_YET

        def steps() -> None:
            self.coord.connect()
            self.coord.ensure_session()
            # The device type joins the spec: groups on cuda and on cpu (so also on other
            # dtypes) must never meet in one quorum; a node that differs is refused at join.
            self.coord.check_spec({**self.cfg.spec(), "device": node_device(self.cfg)})
            self.coord.job_secret()  # read (or made) before anything dials the lighthouse
            self._register()
            self._check_address()

        refusals = (SpecMismatch, EtcdAccessDenied, NodeIdHeld, AddressHeld)
        try:
            ok, _ = self._attempt("join", steps, refusals=refusals)
        except NodeIdHeld as e:
            return self._held(e)
        except (SpecMismatch, EtcdAccessDenied, AddressHeld) as e:
            self.refusal = str(e)
            return Join.REFUSED
        return Join.JOINED if ok else Join.NOT_YET

    def _check_address(self) -> None:
        """After registering: refuse an address that a node on another machine advertises
        (both ends of a race see each other, so neither trains on an address it shares)."""
        host, nodes = self.cfg.advertise_host, self.coord.snapshot().nodes
        other = address_clash(self.cfg.node_id, host, self.record.machine, nodes)
        if other is not None:
            raise AddressHeld(self.cfg.node_id, other, host)

    def _held(self, e: NodeIdHeld) -> Join:
        """Our node id is in another instance's record (held_id.py)."""
        now = time.monotonic()
        if self.held_id.refuse(e.instance, str(e), now):
            self.refusal = str(e)
            return Join.REFUSED
        self._retry_at = now + 1.0
        return Join.NOT_YET

    def claim(self) -> int | None:
        """Claim a slot (None: all taken, or etcd away), the one held last asked for first,
        even from a previous life (``run_dir/slot``): the group keeps its data shard."""
        if not self._due():
            return None
        remembered = self.slot_file.read_text().strip() if self.slot_file.exists() else ""
        preferred = self.view.slot if self.view.slot is not None else None
        if preferred is None and remembered.isdigit():
            preferred = int(remembered)
        _, slot = self._attempt(
            "claim", lambda: self.coord.claim_slot(self.cfg.job.max_replicas, preferred=preferred)
        )
        if slot is not None:
            self.view.slot = slot
            self.slot_file.write_text(f"{slot}\n")
            logs.bind(replica_group=slot)
            self.log.info("slot_claimed", slot=slot)
        return slot

    # -------------------------------------------------------------------- rounds

    def tick(self) -> UpkeepReport:
        """One round of upkeep: fence, session, leadership, the job view, forwarder, record,
        checkpoint; returns what the supervisor acts on."""
        self._round()
        lighthouse_up = self.forwarder.target is not None and (
            not self.view.leader or self.leadership.lighthouse_alive
        )
        report = UpkeepReport(
            slot_lost=self._slot_lost,
            lighthouse=self.forwarder.url if self.forwarder.target is not None else None,
            lighthouse_up=lighthouse_up,
        )
        self._slot_lost = False
        return report

    def serving_http(self, port: int) -> None:
        """The status server's bound port, published in the node's record."""
        self.record.http_port = port

    @property
    def fenced(self) -> bool:
        return self.judge.fenced

    def ranks_must_pause(self) -> bool:
        """Nothing may commit here now: the lease is unconfirmed, or a new session replaced
        it and the ranks' state is not judged yet (see fence_verdict)."""
        return self.judge.must_pause()

    def ranks_started(self) -> None:
        """Fresh ranks: nothing of theirs is left to judge after a lost lease."""
        self.judge.ranks_started()

    def fence_verdict(self) -> tuple[Fence, str]:
        """What paused ranks may do: see FenceJudge.verdict."""
        view = self.view
        return self.judge.verdict(view.job, view.step, self.snapshot_at, view.waiting_for)

    def _round(self) -> None:
        if not self.view.registered:
            return
        margin = fence_margin_s(self.cfg.etcd.lease_ttl_s)
        if not self.judge.fenced and self.coord.session_unconfirmed(margin):
            self.judge.fence(self.view.step)
            self.leadership.fence(self.view)
        if not self._due():
            return
        renewed: bool | None = False
        if not self._lease_fresh():
            ok, renewed = self._attempt("session", self.coord.ensure_session)
            if not ok:
                return
        if renewed:
            self.judge.renewed()
        if renewed and not self._rejoin():
            return
        self.lease_file.write(self.coord.lease_confirmation())
        if self.judge.fenced:
            self.judge.answered()
            self.watch.disarm(self.coord)  # the stream may have gone quiet while fenced
        if not self._read_job():  # etcd away: one request's timeout per round
            return
        self._attempt("leadership", lambda: self.leadership.update(self.view))
        job = self.view.job
        if not self.view.etcd_up or job is None:
            return
        self.judge.follow_epoch(job.leader_epoch, self.view.state == State.RUNNING, self.view.step)
        self._follow_lighthouse(job.lighthouse)
        self._publish_checkpoint()
        self._attempt("record", self._update_record)

    def _read_job(self) -> bool:
        """Read the job when the watch says so (``daemon.coordination.job_watch``); False if the read
        failed (True also when the view was current without one)."""
        if not self.watch.due(time.monotonic() - self.snapshot_at):
            return True
        self.watch.reading()
        ok, job = self._attempt("snapshot", self.coord.snapshot)
        if not ok or job is None:  # an unreachable etcd took the stream with the connection
            self.watch.disarm(self.coord if self.view.etcd_up else None)
            return False
        self.view.job, self.snapshot_at = job, time.monotonic()
        self.view.most_groups = max(self.view.most_groups, len(job.groups))
        self.watch.arm(self.coord, job.revision + 1)
        return True

    def _lease_fresh(self) -> bool:
        """The session lives and etcd confirmed it within ``refresh_every_s``: this round
        need not refresh it (the leadership and snapshot reads still find etcd away)."""
        ttl = self.cfg.etcd.lease_ttl_s
        return self.coord.session_alive and not self.coord.session_unconfirmed(
            ttl - refresh_every_s(ttl)
        )

    def _rejoin(self) -> bool:
        """A new lease (etcd expired the old one, and our keys with it): register and
        claim a slot again, the one we held if it is still free."""
        self.log.info("etcd_session_renewed", slot=self.view.slot)
        self.watch.invalidate()
        ok, _ = self._attempt("register", self._register)
        if not ok:
            return False
        held = self.view.slot
        if held is not None:
            ok, slot = self._attempt(
                "reclaim", lambda: self.coord.claim_slot(self.cfg.job.max_replicas, preferred=held)
            )
            if not ok:
                return False
            if slot == held:
                self.log.info("slot_reclaimed", slot=slot)
            else:
                self.log.warning("slot_lost", previous=held, now=slot)
                self.view.slot = slot
                self._slot_lost = True
        return True

    def _follow_lighthouse(self, address: str | None) -> None:
        """Point the forwarder at the published address; a key briefly absent during a
        leader change keeps the old target, and a malformed value is reported and ignored."""
        if not address:
            return
        if parse_address(address) is None:
            if address != self._bad_lighthouse:
                self.log.error("lighthouse_address_invalid", value=str(address)[:200])
                self._bad_lighthouse = address
            return
        self.view.lighthouse = address
        self.forwarder.set_target(address, self.coord.job_secret())

    def _register(self) -> None:
        self.record.forget()
        self._update_record(force=True)

    def _update_record(self, force: bool = False) -> None:
        self.record.update(self.judge.trained_epoch, self.judge.epoch_step, force=force)

    def _publish_checkpoint(self) -> None:
        """checkpoints/latest in etcd, from the main loop (rank threads only record it);
        a failed publication is tried again next round, unless a newer one came."""
        record = self.view.latest_checkpoint
        if record is None or record is self._published:
            return
        ok, _ = self._attempt("checkpoint", lambda: self.coord.publish_checkpoint(record))
        if ok:
            self._published = record
            self.log.info("checkpoint_published", step=record["step"], path=record["path"])

    # ----------------------------------------------------------------- the job

    def set_state(self, state: str, **extra: object) -> None:
        """The job's persistent state (running, completed, failed); best effort."""
        ok, _ = self._attempt(
            "state",
            lambda: self.coord.set_state(state, self.view.step, node=self.cfg.node_id, **extra),
        )
        if not ok:
            self.log.warning("state_not_written", state=state)

    def fail_job(self, message: str) -> None:
        """Mark the job failed, but only when no other node's group carries it on."""
        job = self.view.job
        if job is not None and set(job.groups.values()) <= {self.cfg.node_id}:
            self.set_state("failed", error=message)

    def release(self) -> None:
        """Give back the slot and leadership now, rather than after the lease TTL."""
        self._retry_at = 0.0

        def give_back() -> None:
            self.leadership.resign(self.view)
            if self.view.slot is not None:
                self.coord.release_slot(self.view.slot)

        ok, _ = self._attempt("release", give_back)
        if not ok:
            self.log.warning("release_deferred", note="the lease TTL frees them")

    def close(self) -> None:
        self.watch.disarm()
        self.leadership.stop()
        self.forwarder.close()
        try:
            self.coord.close(revoke=True)
        except Exception as e:
            self.log.warning("etcd_close_failed", error=str(e))
