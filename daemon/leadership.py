"""Leader election and the leader's torchft lighthouse.

Every tick each daemon campaigns (a cheap etcd transaction). The leader keeps a
lighthouse running and its address published: it restarts one that died, and
republishes whenever etcd does not show its address (for example after an
outage that expired its lease and the key with it). A daemon that is no longer
leader stops its lighthouse; the ranks follow the new address through their
daemon's forwarder.
"""

from __future__ import annotations

from pathlib import Path

from daemon.config import DaemonConfig
from daemon.coordination import Coordinator
from daemon.lighthouse import LighthouseError, LighthouseProcess
from daemon.view import NodeView
from trainer import logs


class Leadership:
    def __init__(self, cfg: DaemonConfig, coord: Coordinator, run_dir: Path) -> None:
        self.cfg = cfg
        self.coord = coord
        self.log_path = run_dir / "lighthouse.log"
        self.lighthouse: LighthouseProcess | None = None
        self.log = logs.get()

    @property
    def lighthouse_alive(self) -> bool:
        return self.lighthouse is not None and self.lighthouse.alive

    def update(self, view: NodeView) -> bool:
        """Campaign, then run and publish a lighthouse while leader. False: starting one failed."""
        was_leader = view.leader
        view.leader = self.coord.campaign()
        if view.leader and not was_leader:
            self.log.info("leader_elected", node=self.cfg.node_id)
        if not view.leader:
            if self.lighthouse is not None:
                self.log.info("lighthouse_stopped", reason="no longer leader")
                self.stop()
            return True
        if not self.lighthouse_alive and not self._start():
            return False
        assert self.lighthouse is not None
        address = f"{self.cfg.advertise_host}:{self.lighthouse.port}"
        if (view.job.lighthouse if view.job else None) != address:
            self.coord.publish_lighthouse(address)
            self.log.info("lighthouse_published", address=address)
        return True

    def _start(self) -> bool:
        if self.lighthouse is not None:
            code = self.lighthouse.popen.poll() if self.lighthouse.popen else None
            self.log.warning("lighthouse_died", code=code)
            self.lighthouse = None
        node = self.cfg.node
        lh = LighthouseProcess(
            self.cfg.lighthouse,
            self.cfg.job.min_replicas,
            node.lighthouse_bind,
            node.lighthouse_port,
            self.log_path,
        )
        try:
            lh.start()
        except LighthouseError as e:
            self.log.error("lighthouse_failed", error=str(e))
            return False
        if not lh.wait_listening(10):
            self.log.error("lighthouse_failed", log=str(self.log_path))
            lh.stop()
            return False
        self.lighthouse = lh
        self.log.info("lighthouse_started", port=lh.port, pid=lh.pid)
        return True

    def stop(self) -> None:
        if self.lighthouse is not None:
            self.lighthouse.stop()
            self.lighthouse = None

    def resign(self, view: NodeView) -> None:
        """Stop the lighthouse and give up the leader key now (not after the lease TTL)."""
        self.stop()
        if view.leader:
            self.coord.resign()
            view.leader = False
