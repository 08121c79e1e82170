"""The node's health before it claims a seat and while it holds one: pure checks (the
checkpoint directory writable with room for the next save, the devices the layout needs,
the clock against etcd's, free memory), each judging figures into a :class:`CheckResult`;
the probes that read those figures from this machine and from etcd's clock (no torch);
and the monitor thread that runs them every ``health.interval_s`` and publishes each run
as one immutable :class:`HealthReport`. What the node does about a report is the
supervisor's (``daemon.supervision.health_gate``).
"""

from __future__ import annotations

from daemon.health.checks import CHECKS, CheckResult, HealthReport
from daemon.health.monitor import CHAOS_CLOCK, HealthMonitor, HealthSettings, run_checks

__all__ = [
    "CHAOS_CLOCK",
    "CHECKS",
    "CheckResult",
    "HealthMonitor",
    "HealthReport",
    "HealthSettings",
    "run_checks",
]
