"""etcd upkeep for one node: session, record, slot, rejoin, leadership, checkpoints, job state.

:class:`EtcdUpkeep` is the only caller of the :class:`~daemon.coordination.coordinator.Coordinator`
in the daemon, and no coordination error leaves it as an exception. Each one
becomes what the state machine needs to know:

* etcd unreachable (or a lost lease): ``etcd_up`` goes false, the round is
  retried with backoff (attempts.py, which turns every error into state); only once
  the lease is in doubt does :attr:`fenced` go true (``daemon.fencing``:
  the lighthouse stops, the supervisor pauses the ranks);
* a conflict (a compare-and-swap that lost a race, ``NotLeader``, a key that
  "keeps changing"): logged as ``etcd_retry`` and tried again next round;
* a refusal that is the user's to fix (another job file, wrong credentials, a
  node id that another live daemon holds, an address another machine's node
  advertises): only while joining, returned as
  :data:`Join.REFUSED` with its message;
* a lost slot after a new session: ``slot_lost`` in the round's :class:`UpkeepReport`.

Each round (:meth:`EtcdUpkeep.tick`) is handed an :class:`UpkeepInput` (the node's step,
state and checkpoints, as values) and returns an :class:`UpkeepReport`: the job, the
slot and seat, etcd's health, leadership and whether the ranks must pause, the values
the supervisor acts on (and, after a verb, :meth:`EtcdUpkeep.report`). The upkeep's
parts each keep their own (seats.py the seat, attempts.py etcd's health, the election
leadership); nothing of theirs is shared with the supervisor's other parts. Its
handlers ask the rest through the verbs ``parts.Upkeep`` lists (claim, give back,
start or end a generation, the fence's verdict, the job's state), never this object's
parts. A node id held by another live daemon is waited on, then refused (held_id.py). A
new session (the old lease lost by our clock) re-registers and re-claims before it
revokes the old lease: the node's keys never all vanish at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from daemon.config import DaemonConfig
from daemon.config.preflight import node_device
from daemon.coordination import (
    AddressHeld,
    Coordinator,
    EtcdAccessDenied,
    JobView,
    NodeIdHeld,
    SpecMismatch,
    address_clash,
    fence_margin_s,
    refresh_every_s,
)
from daemon.fencing import Fence, FenceJudge, LeaseFile, ProgressAsk, epoch_doubt_s
from daemon.leadership import Leadership
from daemon.node_state.reports import Join, UpkeepInput, UpkeepReport
from daemon.node_state.status import NodeStatus
from daemon.supervision.attempts import Attempts, backoff_cap
from daemon.supervision.held_id import HeldIdWait
from daemon.supervision.job_follow import JobFollower
from daemon.supervision.lighthouse_follow import LighthouseFollow
from daemon.supervision.node_record import NodeRecord
from daemon.supervision.seats import Asking, Seats
from trainer import logs
from trainer.contracts import lease_file


class EtcdUpkeep:
    def __init__(
        self,
        cfg: DaemonConfig,
        coord: Coordinator,
        run_dir: Path,
        status: Callable[[], NodeStatus],
        wake: Callable[[], None] | None = None,
        publish: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg, self.coord, self.log = cfg, coord, logs.get()
        self.node = UpkeepInput()  # as the last round was handed it
        self.job: JobView | None = None  # as etcd shows it (the watch, or a whole read)
        self.most_groups = 0  # the most slots held at once, as read
        self.leadership = Leadership(cfg, coord, run_dir, publish, wake or (lambda: None))
        proxy = cfg.node.lighthouse_proxy_port  # the ranks' lighthouse: our forwarder
        self.follow = LighthouseFollow(proxy, run_dir, coord.job_secret)
        self.follower = JobFollower(coord, cfg.node_id, wake)
        self.refusal = ""
        self._slot_lost = False  # since the last report
        self._published: Mapping[str, Any] | None = None  # the checkpoint record last published
        self.record = NodeRecord(cfg, coord, status)  # read from the published status
        cap_s = backoff_cap(cfg.etcd.lease_ttl_s)
        self._attempt = Attempts(coord.settings.endpoints, cap_s)  # errors become state
        self.held_id = HeldIdWait(cfg.etcd.lease_ttl_s + cfg.etcd.timeout_s + 1.0)
        self.judge = FenceJudge(cfg.node_id)  # partition safety (daemon.fencing)
        self._epoch_doubt_s = epoch_doubt_s(cfg.etcd.leader_ttl_s, cfg.etcd.lease_ttl_s)
        self.progress_ask = ProgressAsk(coord, self._attempt)
        self.snapshot_at = 0.0  # when the job was last read whole
        self.lease_file = LeaseFile(run_dir / lease_file.NAME)
        self._confirmed_at: float | None = None  # the lease's last confirmation seen
        self._seats = Seats(cfg, coord, self._attempt, run_dir, wake or (lambda: None))

    # ------------------------------------------------------------------ joining

    def join(self) -> Join:
        """Connect, open a session, check the job spec, register."""
        if not self._attempt.due():
            return Join.NOT_YET

        def steps() -> None:
            self.coord.connect()
            self.coord.ensure_session()
            # The device type joins the spec: groups on cuda and on cpu (so also on other
            # dtypes) must never meet in one quorum; a node that differs is refused at join.
            self.coord.check_spec({**self.cfg.spec(), "device": node_device(self.cfg)})
            self.coord.job_secret()  # read (or made) before anything dials the lighthouse
            self._register()
            # Refuse an address a node on another machine advertises (both ends of a race
            # see each other, so neither trains on an address it shares).
            host = self.cfg.advertise_host
            other = address_clash(
                self.cfg.node_id, host, self.record.machine, self._load_job().nodes
            )
            if other is not None:
                raise AddressHeld(self.cfg.node_id, other, host)

        refusals = (SpecMismatch, EtcdAccessDenied, NodeIdHeld, AddressHeld)
        try:
            ok, _ = self._attempt("join", steps, refusals=refusals)
        except NodeIdHeld as e:
            return self._held(e)
        except (SpecMismatch, EtcdAccessDenied, AddressHeld) as e:
            self.refusal = str(e)
            return Join.REFUSED
        return Join.JOINED if ok else Join.NOT_YET

    def _held(self, e: NodeIdHeld) -> Join:
        """Our node id is in another instance's record (held_id.py)."""
        now = time.monotonic()
        if self.held_id.refuse(e.instance, str(e), now):
            self.refusal = str(e)
            return Join.REFUSED
        self._attempt.retry_at = now + 1.0
        return Join.NOT_YET

    def write_record(self) -> None:
        """Write this node's record now, not after RECORD_GAP_S (best effort)."""
        self._attempt("record", lambda: self.record.update(force=True))

    # ------------------------------------------------- seats (seats.py, seat_probe.py)

    def claim(self) -> int | None:
        """Claim a slot (a seat); None: every one is held (a spare) or etcd is away."""
        return self._seats.claim(self.job)

    def give_back(self) -> bool:
        """Give the seat back now (an unhealthy node); False while etcd is away."""
        return self._seats.give_back()

    def holds_seat(self, job: JobView) -> bool:
        """Whether this node still holds its seat (True while etcd cannot say)."""
        return self._seats.holds(job)

    def ask_member(self, job: JobView, member: tuple[int, str]) -> None:
        """Ask the member (node rank, node id) our group waits on for a sign of life."""
        self._seats.probe(job, member)

    def ask_members(self, job: JobView, silence: float, gone: tuple[str, ...] = ()) -> Asking:
        """Ask every other member for a sign of life (what came of it: seat_probe.Asking).
        Those `gone` (their status port refused: no daemon) lose theirs without the wait."""
        return self._seats.probe_members(job, silence, gone)

    def start_generation(self, gid: int, seen: int, store: dict[str, Any]) -> bool:
        """Move a spanning group's generation on from `seen` and publish its store: False
        when etcd is away or another node moved it first (look again next round)."""
        if self._seats.bump_generation(gid, seen) != seen + 1:
            return False
        return self._seats.publish_store(gid, store)

    def end_generation(self, gid: int, ended: int) -> None:
        """Move the generation on from `ended` (unless another node did), and write our
        record at once: the group's first node waits on it."""
        self._seats.bump_generation(gid, ended)
        self.write_record()

    # -------------------------------------------------------------------- rounds

    def tick(self, node: UpkeepInput) -> UpkeepReport:
        """One round: fence, session, leadership, job view, forwarder, record, checkpoint."""
        self.node = node
        self._round()
        report = self.report(slot_lost=self._slot_lost)
        self._slot_lost = False
        return report

    def report(self, slot_lost: bool = False) -> UpkeepReport:
        """What the upkeep knows now, as one frozen value."""
        url, leader, seats = self.follow.ranks_url, self.leadership.leader, self._seats
        return UpkeepReport(
            slot_lost=slot_lost,
            ranks_lighthouse=url,  # and our lighthouse's process lives, while we lead
            lighthouse_up=url is not None and (not leader or self.leadership.lighthouse_alive),
            lighthouse=self.follow.address,
            job=self.job,
            slot=seats.slot,
            node_rank=seats.node_rank,
            nodes_per_group=seats.nodes,
            spare=seats.spare,
            etcd_up=self._attempt.up,
            etcd_told=self.coord.keepalive.raft_told,
            etcd_errors=self._attempt.errors,
            leader=leader,
            most_groups=self.most_groups,
            must_pause=self.judge.must_pause(),
            members_gone=seats.gone(),
            members_silent=seats.silent(),
        )

    def serving_http(self, port: int) -> None:
        """The status server's bound port, published in the node's record."""
        self.record.http_port = port

    @property
    def fenced(self) -> bool:
        return self.judge.fenced

    def ranks_started(self) -> int | None:
        """Fresh ranks: nothing of theirs is left to judge after a lost lease. Returns the
        job's reached step as etcd recorded it (None while etcd is away), for their steps
        to be compared with (a start-over)."""
        self.judge.ranks_started()
        ok, reached = self._attempt("reached", self.coord.read_reached)
        return reached if ok else None

    def fence_verdict(self, node: UpkeepInput) -> tuple[Fence, str]:
        """What paused ranks may do: KEEP, DISCARD, or HOLD while etcd is away (the judge's
        verdict; after a lost lease, against the others' steps: daemon.fencing.progress_ask)."""
        n = node
        return self.progress_ask.verdict(
            self.judge, self.job, n.step, self.snapshot_at, n.waiting_for, n.invalid_checkpoints
        )

    def _round(self) -> None:
        if not self.node.registered:
            return
        margin = fence_margin_s(self.cfg.etcd.lease_ttl_s)
        if not self.judge.fenced and self.coord.session_unconfirmed(margin):
            self.judge.fence(self.node.step)
            self.leadership.fence()
        if not self._attempt.due():
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
        confirmation = self.coord.lease_confirmation()
        self.lease_file.write(confirmation)
        self._note_gap(confirmation)
        if self.judge.fenced:
            self.judge.answered()
            self.follower.refence()  # the stream may have gone quiet while fenced
        if not self._read_job():  # etcd away: one request's timeout per round
            return
        self._attempt("leadership", lambda: self.leadership.update(self.job, self.follow.address))
        running, step = self.node.running, self.node.step
        if self.leadership.take_deposed() and running:
            self.judge.distrust("another node took over while our lighthouse served", step)
        job = self.job
        if not self._attempt.up or job is None:
            return
        self.judge.follow_epoch(job.leader_epoch, running, step, self._epoch_doubt_s)
        self.follow.follow(job)
        self._seats.watch(job if self.node.watching and self.cfg.job.nodes_per_group > 1 else None)
        self._publish_checkpoint()
        self._attempt("record", self._update_record)

    def _note_gap(self, confirmation: tuple[str, float] | None) -> None:
        """How long etcd went without confirming our lease, once it confirms it again."""
        sent = confirmation[1] if confirmation is not None else None
        last, self._confirmed_at = self._confirmed_at, sent
        if sent is not None and last is not None and sent > last:
            self.judge.out_of_touch(sent - last)
            if sent - last > self._epoch_doubt_s:  # judge the epoch on a whole read
                self.follower.invalidate()

    def _read_job(self) -> bool:
        """Bring the job view up to date: the watch's events applied to the cached copy,
        or one read of the whole job when the watch says so (job_follow.py). False if
        that read failed."""
        if not self.follower.due():
            job = self.follower.changed()
            if job is not None:
                self._show(job)
            return True
        ok, _ = self._attempt("snapshot", self._load_job)
        if not ok:  # an unreachable etcd took the stream with the connection
            self.follower.distrust(self._attempt.up)
        return ok

    def _load_job(self) -> JobView:
        job = self.follower.load()
        self._show(job)
        self.snapshot_at = self.follower.loaded_at
        return job

    def _show(self, job: JobView) -> None:
        self.job = job
        self.most_groups = max(self.most_groups, len(job.groups))

    def _lease_fresh(self) -> bool:
        """The session lives and etcd confirmed it within ``refresh_every_s``: this round
        need not ask about it (the keepalive thread refreshes it; the leadership and
        snapshot reads still find etcd away)."""
        ttl = self.cfg.etcd.lease_ttl_s
        return self.coord.session_alive and not self.coord.session_unconfirmed(
            ttl - refresh_every_s(ttl)
        )

    def _rejoin(self) -> bool:
        """A new lease (etcd expired the old one, and our keys with it): register and
        claim a slot again, the one we held if it is still free."""
        self.log.info("etcd_session_renewed", slot=self._seats.slot)
        self.follower.invalidate()
        ok, _ = self._attempt("register", self._register)
        if not ok:
            return False
        kept = self._seats.reclaim()
        if kept is None:
            return False
        self._slot_lost = not kept
        return True

    def _register(self) -> None:
        self.record.forget()
        self._update_record(force=True)

    def _update_record(self, force: bool = False) -> None:
        self.record.update(force=force)
        job, judge = self.job, self.judge
        asked = job.progress_asked if job else None
        self.record.update_progress(asked, judge.trained_epoch, judge.epoch_step)

    def _publish_checkpoint(self) -> None:
        """checkpoints/latest in etcd, from the main loop (rank threads only record it);
        a failed publication is tried again next round, unless a newer one came."""
        record = self.node.latest_checkpoint
        if record is None or record == self._published:
            return
        ok, _ = self._attempt("checkpoint", lambda: self.coord.publish_checkpoint(dict(record)))
        if ok:
            self._published = record
            self.log.info("checkpoint_published", step=record["step"], path=record["path"])

    # ----------------------------------------------------------------- the job

    def announce_failure(self, word: dict[str, Any] | None) -> None:
        """Tell every daemon that this node's group failed (daemon/ranks/failure_notice.py)."""
        gid = self._seats.slot
        if word is None or gid is None or not self.cfg.node.announce_failures:
            return
        self._attempt("failed", lambda: self.coord.announce_failed(gid, word))
        self.log.info("failure_announced", quorum_id=word["quorum_id"], slot=gid)

    def set_state(self, state: str, step: int, **extra: object) -> None:
        """The job's persistent state (running, completed, failed) at `step`; best effort."""
        ok, _ = self._attempt(
            "state", lambda: self.coord.set_state(state, step, node=self.cfg.node_id, **extra)
        )
        if not ok:
            self.log.warning("state_not_written", state=state)

    def fail_job(self, message: str, step: int) -> None:
        """Mark the job failed, but only when no other node's group carries it on."""
        job = self.job
        if job is not None and job.holders() <= {self.cfg.node_id}:
            self.set_state("failed", step, error=message)

    def release(self) -> None:
        """Give back the slot and leadership now, rather than after the lease TTL."""
        self._attempt.retry_at = 0.0

        def give_back() -> None:
            self.record.update(last=True)  # and the incident that ends as the node leaves
            self.leadership.resign()
            self._seats.release()

        ok, _ = self._attempt("release", give_back)
        if not ok:
            self.log.warning("release_deferred", note="the lease TTL frees them")

    def close(self) -> None:
        self.follower.close()
        self.leadership.close()
        self._seats.close()
        self.follow.close()
        try:
            self.coord.close(revoke=True)
        except Exception as e:
            self.log.warning("etcd_close_failed", error=str(e))
