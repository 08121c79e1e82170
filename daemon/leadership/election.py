"""Leader election and the leader's torchft lighthouse.

A daemon campaigns (one etcd transaction) in a round whose view of the job shows
no leader, or disagrees with what it believes about itself (it holds the key but
thinks it does not, after a fence or a restart, or the reverse), or when it leads on
a leader lease its clock gave up on. The key lives on the leader's own short lease
(``etcd.leader_ttl_s``, ``daemon.coordination.leader_lease``). The view is kept
current by the watch (``daemon.coordination.job_watch``), so a campaign follows the
event that deleted the leader key at once, after the takeover probe (:meth:`Leadership.takeover_due`: a
follower holds back while the old leader's gate still answers), and a steady leader
and its followers send nothing: no campaign on a timer. The leader keeps a
lighthouse running and its address published (it restarts one that died, and
republishes whenever etcd does not show its address), announces the quorum members
its lighthouse lost (``lighthouse_status``), and keeps a will that revokes its lease
if its daemon dies (``will``). A daemon that is no longer leader stops its
lighthouse; the ranks follow the new address through their daemon's forwarder, told
at once (``daemon.supervision.rank_notice``); one deposed while it served restarts
its ranks (``daemon.fencing.judge``).

Nothing here blocks for long: a lighthouse that is starting is waited for up to
``FIRST_PROBE_S`` in its round, then probed once per round until ``START_TIMEOUT_S``.
A leader whose node lease may expire unrenewed stops its lighthouse first
(:meth:`Leadership.fence`, ``daemon.fencing``). A leader whose lighthouse
cannot start (its port is taken, the binary is missing, it dies or never listens) says
why, resigns so that another node can lead, and does not campaign again for
``COOLDOWN_S``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from daemon.config import DaemonConfig
from daemon.coordination.coordinator import Coordinator, JobView
from daemon.coordination.lease_timing import fence_margin_s
from daemon.host_probe import HostProbe
from daemon.leadership.gate import alive as gate_alive
from daemon.leadership.lighthouse import LighthouseError, LighthouseProcess, parse_address
from daemon.leadership.lighthouse_status import Lost, lost_members
from daemon.leadership.unreachable import UnreachableLeader
from daemon.leadership.will import Will
from trainer import logs

START_TIMEOUT_S = 10.0
COOLDOWN_S = 15.0
FIRST_PROBE_S = 1.0  # how long a start waits for the lighthouse to listen, in its round
TAKEOVER_GRACE_S = 1.0  # at least this long a vacancy is left to a leader whose gate answers
PROBE_S = 0.2  # connecting to that lighthouse: a cut-off host never answers


def _reachable(address: str | None, secret: bytes) -> bool:
    """Whether the gate at `address` (host:port) answers within ``PROBE_S``."""
    target = parse_address(address)
    return target is not None and gate_alive(target[0], target[1], secret, PROBE_S)


class Lighthouse(StrEnum):
    NONE = "none"  # not leader, or no lighthouse yet
    STARTING = "starting"  # started, not listening yet; deadline: started_at + START_TIMEOUT_S
    SERVING = "serving"  # listening; its address is published


class Leadership:
    def __init__(
        self,
        cfg: DaemonConfig,
        coord: Coordinator,
        run_dir: Path,
        shown: Callable[[], None] = lambda: None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg = cfg
        self.coord = coord
        # Publishes the node's status (Supervisor.publish): called before leader_elected
        # and lighthouse_started are logged, so whoever reads a line sees it in /status.
        self.shown = shown
        self.log_path = run_dir / "lighthouse.log"
        self.leader = False  # we hold the leader key, as far as we know
        self.lighthouse: LighthouseProcess | None = None
        self.phase = Lighthouse.NONE
        self.started_at = 0.0
        self.cooldown_until = 0.0
        self.must_resign = False
        self.epoch: int | None = None  # the leader epoch of the lighthouse we serve
        self.deposed = False  # another node took the key while ours served (take_deposed)
        self.announced: Lost | None = None  # the quorum members last announced lost
        self.will: Will | None = None  # revokes the leader lease if this daemon dies
        self._vacant_since: float | None = None  # when we saw the leader key vacant
        self._holding_back = False  # for the last leader to take it again (takeover_due)
        self._last_leader: str | None = None  # who held the key when we last saw it held
        self._back_from_fence = False  # we were fenced, and have seen no leader since
        # A leader whose host stopped answering its watchers, deposed (unreachable.py);
        # `wake`: the daemon's loop looks at once when the probe finds it silent.
        self.unreachable = UnreachableLeader(cfg.node_id, coord, HostProbe(wake))
        ttl = cfg.etcd.lease_ttl_s
        self.grace_s = max(TAKEOVER_GRACE_S, ttl - fence_margin_s(ttl))  # see takeover_due
        self.log = logs.get()

    @property
    def lighthouse_alive(self) -> bool:
        return self.lighthouse is not None and self.lighthouse.alive

    def must_campaign(self, job: JobView | None) -> bool:
        """Nobody leads, the view and our belief disagree about whether we do, or we lead
        on a leader lease that our clock or etcd gave up on (``campaign`` keeps it, or
        takes the key again on a new one)."""
        if job is None or job.leader is None:
            return True
        if self.leader and not self.coord.leader_lease_held:
            return True
        return (job.leader == self.cfg.node_id) != self.leader

    def takeover_due(self, job: JobView | None, lighthouse: str | None) -> bool:
        """Whether to campaign now for a vacant leader key. A follower whose probe of the
        last published lighthouse's gate is answered (its daemon lives, and every group
        still trains through it) holds back, probing each round, for as long as that
        leader's node may still serve before its own fence: the leader takes its key
        again when etcd lets it (its leader lease lapsed in an etcd hiccup), and nothing
        changes for the ranks. One that is not answered campaigns at once. `lighthouse`:
        the address last published (the upkeep keeps it while the key is absent)."""
        if self.leader or job is None or job.leader is not None:
            self._vacant_since, self._holding_back = None, False
            return True
        now = time.monotonic()
        first = self._vacant_since is None
        if first:  # a host its watchers found silent is not probed again (unreachable.py)
            silent = self.unreachable.silent
            self._vacant_since, self._holding_back = now, self.lighthouse is None and not silent
        if self._holding_back:  # probed every round: a killed leader's port may close late
            answers = _reachable(lighthouse, self.coord.job_secret())
            returning = self._leader_returning(job)
            self._holding_back = answers or returning
            if first:
                self.log.info(
                    "leader_vacant",
                    gate_answers=answers,
                    leader_returning=returning,
                    hold_s=self.grace_s,
                )
        since = self._vacant_since if self._vacant_since is not None else now
        return not self._holding_back or now - since >= self.grace_s

    def _leader_returning(self, job: JobView) -> bool:
        """Back from our own fence (an etcd outage fences every node: the leader stopped
        its lighthouse, so its gate cannot answer), while the last leader's node is still
        registered: it is coming back from its fence too and takes its key again on its
        own port, so nothing changes for the ranks (a follower back first used to win the
        key in the second before it did)."""
        last = self._last_leader
        return self._back_from_fence and last not in (None, self.cfg.node_id) and last in job.nodes

    def take_deposed(self) -> bool:
        """True once after another node took the leader key while our lighthouse served."""
        deposed, self.deposed = self.deposed, False
        return deposed

    def update(self, job: JobView | None, lighthouse: str | None) -> None:
        """One round: campaign if needed, then start, probe or publish the lighthouse while
        leader. `job`: the job as etcd shows it; `lighthouse`: the address last published.

        Raises the coordinator's errors (the caller turns them into events)."""
        if self.must_resign:  # retried each round until etcd takes it
            self.coord.resign()
            self.must_resign = False
        if time.monotonic() < self.cooldown_until:
            return  # resigned after a failed start: let another node lead
        was_leader = self.leader
        if job is not None and job.leader is not None:
            self._vacant_since = None  # the next vacancy is probed afresh (takeover_due)
            self._last_leader, self._back_from_fence = job.leader, False
        self.unreachable.round(job, self.leader)
        if self.must_campaign(job):
            if not self.takeover_due(job, lighthouse):
                return
            serving = self.epoch if self.phase == Lighthouse.SERVING else None
            self.leader = self.coord.campaign(serving)
        if self.leader and not was_leader:
            self.shown()
            self.log.info("leader_elected", node=self.cfg.node_id)
        if not self.leader:
            if self.lighthouse is not None:
                self.deposed = self.phase == Lighthouse.SERVING
                self.log.info("lighthouse_stopped", reason="no longer leader")
                self.stop()
            return
        if self.phase == Lighthouse.SERVING and not self.lighthouse_alive:
            code = (
                self.lighthouse.popen.poll() if self.lighthouse and self.lighthouse.popen else None
            )
            self.log.warning("lighthouse_died", code=code)
            self.stop()
        if self.phase == Lighthouse.NONE:
            self._start()
        if self.phase == Lighthouse.STARTING:
            self._probe()
        if self.phase == Lighthouse.SERVING:
            assert self.lighthouse is not None
            if self.epoch is None and job is not None and job.leader == self.cfg.node_id:
                self.epoch = job.leader_epoch
            address = f"{self.cfg.advertise_host}:{self.lighthouse.port}"
            if (job.lighthouse if job else None) != address:
                self.coord.publish_lighthouse(address)
                self.log.info("lighthouse_published", address=address)
            self._announce_lost(address)
            self._keep_will()

    def _keep_will(self) -> None:
        """A will (``will.py``) for the leader lease we hold: revoked if this daemon dies."""
        lease = self.coord.leader_lease_id
        if lease is None or (self.will is not None and self.will.lease_id == lease):
            return  # one per lease: a will that died is not spawned again every round
        if self.will is not None:
            self.will.cancel()
        self.will = Will(self.coord.settings, lease)

    def _announce_lost(self, address: str) -> None:
        """Announce the members of the last quorum our lighthouse (at `address`) stopped
        hearing from (``lighthouse_status``), with that quorum's id: every daemon then
        tells its ranks, and those still in that quorum abandon the step that waits on
        them. Once per quorum and set of members lost."""
        lh = self.lighthouse
        page = lh.status.read() if lh and lh.status else None
        if page is None:  # not read this round: nothing learned, nothing announced again
            return
        lost = lost_members(page, self.cfg.lighthouse.heartbeat_timeout_ms / 1000.0)
        if lost is not None and lost != self.announced:
            self.coord.announce_lost(lost.quorum_id, list(lost.replicas), address)
            self.log.warning(
                "replicas_lost", replicas=list(lost.replicas), quorum_id=lost.quorum_id
            )
        self.announced = lost

    def _start(self) -> None:
        node = self.cfg.node
        lh = LighthouseProcess(
            self.cfg.lighthouse,
            self.cfg.job.min_replicas,
            self.cfg.lighthouse_host,
            node.lighthouse_port,
            self.log_path,
            self.coord.job_secret(),
        )
        try:
            lh.start()
        except (LighthouseError, FileNotFoundError) as e:
            self._cannot_serve(str(e))
            return
        self.lighthouse, self.phase, self.started_at = lh, Lighthouse.STARTING, time.monotonic()
        # Taking over is starting one and publishing it: wait for it here a little (it
        # listens in about a tenth of a second), rather than a round per probe.
        deadline = self.started_at + FIRST_PROBE_S
        while not lh.listening() and lh.alive and time.monotonic() < deadline:
            time.sleep(0.01)

    def _probe(self) -> None:
        lh = self.lighthouse
        assert lh is not None
        if lh.listening():
            self.phase = Lighthouse.SERVING
            self.shown()
            self.log.info(
                "lighthouse_started", port=lh.port, internal_port=lh.internal_port, pid=lh.pid
            )
        elif not lh.alive:
            self._cannot_serve(f"the lighthouse exited at start; see {self.log_path}")
        elif time.monotonic() - self.started_at > START_TIMEOUT_S:
            self._cannot_serve(
                f"the lighthouse did not listen within {START_TIMEOUT_S:.0f}s; see {self.log_path}",
            )

    def _cannot_serve(self, why: str) -> None:
        self.log.error("lighthouse_failed", error=why, action="resigning leadership")
        self.cooldown_until = time.monotonic() + COOLDOWN_S
        self.stop()
        self.leader, self.must_resign = False, True

    def stop(self) -> None:
        if self.will is not None:  # leading ends on our terms: nothing to revoke at death
            self.will.cancel()
            self.will = None
        if self.lighthouse is not None:
            self.lighthouse.stop()
            self.lighthouse = None
        self.phase, self.epoch = Lighthouse.NONE, None

    def close(self) -> None:
        self.stop()
        self.unreachable.close()

    def fence(self) -> None:
        """Our lease may expire before etcd hears from us again: stop serving now, so
        that this lighthouse is gone before another node can be elected and start one.
        The leader key is left to its lease (etcd cannot be told)."""
        if self.lighthouse is not None:
            self.log.warning("lighthouse_stopped", reason="fenced: lease unconfirmed")
        self.stop()
        self._vacant_since, self._back_from_fence = None, True  # see _leader_returning
        if self.leader:
            self.coord.drop_leadership()  # its key lapses with the leader lease
        self.leader = False

    def resign(self) -> None:
        """Stop the lighthouse and give up the leader key now (not after the lease TTL);
        logged before the key goes, so no other node's election comes before the line."""
        self.stop()
        if self.leader:
            self.leader = False
            self.log.info("leader_resigned")
            self.coord.resign()
