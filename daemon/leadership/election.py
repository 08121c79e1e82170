"""Leader election and the leader's torchft lighthouse.

A daemon campaigns (one etcd transaction) in a round whose view of the job shows
no leader, or disagrees with what it believes about itself (it holds the key but
thinks it does not, after a fence or a restart, or the reverse). The view is kept
current by the watch (``daemon.coordination.job_watch``), so a campaign follows the
event that deleted the leader key (a revoke, a resignation, an expired lease) at once,
and a steady leader and its followers send nothing: no campaign on a timer. The leader
keeps a lighthouse running and its address published: it restarts one that
died, and republishes whenever etcd does not show its address (for example after
an outage that expired its lease and the key with it). A daemon that is no
longer leader stops its lighthouse; the ranks follow the new address through
their daemon's forwarder.

Nothing here blocks: a lighthouse that is starting is probed once per round
until ``START_TIMEOUT_S``. A leader whose lease may expire unrenewed stops its lighthouse first
(:meth:`Leadership.fence`, ``daemon.coordination.fencing``). A leader whose lighthouse cannot start (its port is
taken, the binary is missing, it dies or never listens) says why, resigns so
that another node can lead, and does not campaign again for ``COOLDOWN_S``.
"""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path

from daemon.config import DaemonConfig
from daemon.coordination.coordinator import Coordinator
from daemon.leadership.lighthouse import LighthouseError, LighthouseProcess
from daemon.node_state.view import NodeView
from trainer import logs

START_TIMEOUT_S = 10.0
COOLDOWN_S = 15.0


class Lighthouse(StrEnum):
    NONE = "none"  # not leader, or no lighthouse yet
    STARTING = "starting"  # started, not listening yet; deadline: started_at + START_TIMEOUT_S
    SERVING = "serving"  # listening; its address is published


class Leadership:
    def __init__(self, cfg: DaemonConfig, coord: Coordinator, run_dir: Path) -> None:
        self.cfg = cfg
        self.coord = coord
        self.log_path = run_dir / "lighthouse.log"
        self.lighthouse: LighthouseProcess | None = None
        self.phase = Lighthouse.NONE
        self.started_at = 0.0
        self.cooldown_until = 0.0
        self.must_resign = False
        self.log = logs.get()

    @property
    def lighthouse_alive(self) -> bool:
        return self.lighthouse is not None and self.lighthouse.alive

    def must_campaign(self, view: NodeView) -> bool:
        """Nobody leads, or the view and our belief disagree about whether we do."""
        job = view.job
        if job is None or job.leader is None:
            return True
        return (job.leader == self.cfg.node_id) != view.leader

    def update(self, view: NodeView) -> None:
        """One round: campaign if needed, then start, probe or publish the lighthouse while
        leader.

        Raises the coordinator's errors (the caller turns them into events)."""
        if self.must_resign:  # retried each round until etcd takes it
            self.coord.resign()
            self.must_resign = False
        if time.monotonic() < self.cooldown_until:
            return  # resigned after a failed start: let another node lead
        was_leader = view.leader
        if self.must_campaign(view):
            view.leader = self.coord.campaign()
        if view.leader and not was_leader:
            self.log.info("leader_elected", node=self.cfg.node_id)
        if not view.leader:
            if self.lighthouse is not None:
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
            self._start(view)
        if self.phase == Lighthouse.STARTING:
            self._probe(view)
        if self.phase == Lighthouse.SERVING:
            assert self.lighthouse is not None
            address = f"{self.cfg.advertise_host}:{self.lighthouse.port}"
            if (view.job.lighthouse if view.job else None) != address:
                self.coord.publish_lighthouse(address)
                self.log.info("lighthouse_published", address=address)

    def _start(self, view: NodeView) -> None:
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
            self._cannot_serve(view, str(e))
            return
        self.lighthouse, self.phase, self.started_at = lh, Lighthouse.STARTING, time.monotonic()

    def _probe(self, view: NodeView) -> None:
        lh = self.lighthouse
        assert lh is not None
        if lh.listening():
            self.phase = Lighthouse.SERVING
            self.log.info(
                "lighthouse_started", port=lh.port, internal_port=lh.internal_port, pid=lh.pid
            )
        elif not lh.alive:
            self._cannot_serve(view, f"the lighthouse exited at start; see {self.log_path}")
        elif time.monotonic() - self.started_at > START_TIMEOUT_S:
            self._cannot_serve(
                view,
                f"the lighthouse did not listen within {START_TIMEOUT_S:.0f}s; see {self.log_path}",
            )

    def _cannot_serve(self, view: NodeView, why: str) -> None:
        self.log.error("lighthouse_failed", error=why, action="resigning leadership")
        self.cooldown_until = time.monotonic() + COOLDOWN_S
        self.stop()
        view.leader, self.must_resign = False, True

    def stop(self) -> None:
        if self.lighthouse is not None:
            self.lighthouse.stop()
            self.lighthouse = None
        self.phase = Lighthouse.NONE

    def fence(self, view: NodeView) -> None:
        """Our lease may expire before etcd hears from us again: stop serving now, so
        that this lighthouse is gone before another node can be elected and start one.
        The leader key is left to its lease (etcd cannot be told)."""
        if self.lighthouse is not None:
            self.log.warning("lighthouse_stopped", reason="fenced: lease unconfirmed")
        self.stop()
        view.leader = False

    def resign(self, view: NodeView) -> None:
        """Stop the lighthouse and give up the leader key now (not after the lease TTL)."""
        self.stop()
        if view.leader:
            view.leader = False
            self.coord.resign()
