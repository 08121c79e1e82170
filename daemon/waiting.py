"""What WAITING waits for before a group may start, reported as it changes and every 30 s.

A node waits for a lighthouse address in etcd and for ``job.min_replicas``
groups holding a slot; ``node.wait_timeout_s`` (0: forever) bounds the wait.
"""

from __future__ import annotations

import time

from daemon.config import DaemonConfig
from daemon.view import NodeView
from trainer import logs

REPORT_EVERY_S = 30.0


class Waiting:
    def __init__(self, cfg: DaemonConfig, view: NodeView) -> None:
        self.cfg = cfg
        self.view = view
        self.reported_at = 0.0
        self.log = logs.get()

    def missing(self, forwarding: bool) -> str | None:
        """What is still missing (None: start the group); `forwarding`: the lighthouse
        forwarder has a target."""
        if not self.view.lighthouse or not forwarding:
            return "a lighthouse address in etcd"
        return self.view.missing_groups(self.cfg.job.min_replicas)

    def report(self, missing: str, since: float) -> str | None:
        """Log what is missing when it changes (and every 30 s); the error once the wait
        is over node.wait_timeout_s, else None."""
        now = time.monotonic()
        waited = now - since
        if missing != self.view.waiting_for or now - self.reported_at > REPORT_EVERY_S:
            self.log.info("waiting", waiting_for=missing, waited_s=round(waited, 1))
            self.view.waiting_for, self.reported_at = missing, now
        timeout = self.cfg.node.wait_timeout_s
        return f"waited {timeout:.0f}s for {missing}" if timeout and waited > timeout else None
