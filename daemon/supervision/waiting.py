"""What WAITING waits for before a group may start, reported as it changes and every 30 s.

A node waits for a lighthouse address in etcd, for ``job.min_replicas``
groups holding a slot and, after ranks that failed on their own, for their
quorum requests to expire at the lighthouse; ``node.wait_timeout_s`` (0:
forever) bounds the wait.
"""

from __future__ import annotations

import time

from daemon.config import DaemonConfig
from daemon.node_state.reports import UpkeepReport
from trainer import logs

REPORT_EVERY_S = 30.0
QUIET_MARGIN_S = 0.2  # past the heartbeat timeout: the lighthouse's tick and a clock's drift


class Waiting:
    def __init__(self, cfg: DaemonConfig) -> None:
        self.cfg = cfg
        self.reported_at = 0.0
        self.quiet_until = 0.0  # no start before this (see after_exit)
        self.log = logs.get()

    def missing(self, upkept: UpkeepReport, now: float | None = None) -> str | None:
        """What is still missing (None: start the group), as the upkeep's last report
        shows the job and the lighthouse forwarder."""
        if not upkept.lighthouse or upkept.ranks_lighthouse is None:
            return "a lighthouse address in etcd"
        now = time.monotonic() if now is None else now
        if now < self.quiet_until:
            return "the failed ranks' quorum requests to expire at the lighthouse"
        return upkept.missing_groups(self.cfg.job.min_replicas)

    def after_exit(self, codes: list[int | None] | None, now: float) -> None:
        """A rank that failed on its own (an exit code, not a signal) may have died waiting
        for a quorum: the lighthouse keeps that request, with the dead process's id, until
        its heartbeat times out, and would pair it with the group's next start (whose
        quorum then waits on a dead store). The next start waits that long. Only rank 0
        counts: its torchft manager server is the group's one client of the lighthouse."""
        first = codes[0] if codes else None
        if first is not None and 0 < first < 128:
            timeout_s = self.cfg.lighthouse.heartbeat_timeout_ms / 1000
            self.quiet_until = now + timeout_s + QUIET_MARGIN_S

    def say(self, missing: str, since: float, shown: str | None) -> float:
        """Log what is missing when it differs from `shown` (what the node shows now) and
        every 30 s, so a wait that may end by itself (a full volume, a remount) is in
        the log and not only on /status; the seconds waited."""
        now = time.monotonic()
        waited = now - since
        if missing != shown or now - self.reported_at > REPORT_EVERY_S:
            self.log.info("waiting", waiting_for=missing, waited_s=round(waited, 1))
            self.reported_at = now
        return waited

    def report(self, missing: str, since: float, shown: str | None) -> str | None:
        """:meth:`say` it; the error once the wait is over node.wait_timeout_s, else None."""
        waited = self.say(missing, since, shown)
        timeout = self.cfg.node.wait_timeout_s
        return f"waited {timeout:.0f}s for {missing}" if timeout and waited > timeout else None
