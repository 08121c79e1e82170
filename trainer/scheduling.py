"""Idle-priority scheduling for standby ranks (Linux, sched(7)); no torch here.

A standby warms up at SCHED_IDLE when it may leave that class again once it becomes
a rank: that needs CAP_SYS_NICE or an RLIMIT_NICE that allows nice 0. The daemon asks
the same question (its children inherit its limits and capabilities) to decide when
to refill its standby pool: at once when they warm at idle priority, later when they
would compete with the ranks at normal priority.
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

CAP_SYS_NICE = 23


def may_leave_idle() -> bool:
    """Whether a process started from here may go back from SCHED_IDLE to normal
    scheduling."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    if soft == resource.RLIM_INFINITY or soft >= 20:
        return True
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    return False


def set_policy(policy: int) -> None:
    """Set every thread of this process to `policy` (Linux schedules threads, not processes)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
