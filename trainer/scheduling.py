"""Idle-priority scheduling for standby ranks (Linux, sched(7)); no torch here.

A standby warms up at SCHED_IDLE when it may leave that class again once it becomes
a rank: that needs CAP_SYS_NICE or an RLIMIT_NICE that allows nice 0. The daemon asks
the same question (its children inherit its limits and capabilities) to decide when
to refill its standby pool: at once when they warm at idle priority, later when they
would compete with the ranks at normal priority.

SCHED_IDLE alone is not enough where the kernel groups processes by session
(sched_autogroup_enabled, for processes in the root cpu cgroup): the daemon starts
every rank and standby in its own session, the kernel shares the CPU fairly between
sessions first, and SCHED_IDLE only yields to threads of the same session. A standby
therefore also lowers its session's weight to nice 19 (/proc/self/autogroup) while it
warms, and puts it back when it becomes a rank. Without that, on two busy cores a
standby's imports took a third of the CPU and slowed both ranks by about 40 %.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import time
from pathlib import Path

CAP_SYS_NICE = 23
AUTOGROUP = Path("/proc/self/autogroup")  # "/autogroup-<id> nice <n>"; absent without autogroup
IDLE_AUTOGROUP_NICE = 19


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


def autogroup_nice(path: Path = AUTOGROUP) -> int | None:
    """The nice value of this process's session group (of `path`'s process), or None where
    the kernel has none."""
    try:
        return int(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(nice: int, tries: int = 20) -> bool:
    """Set this session's group nice value; False where the kernel has no autogroup or
    refuses. Without CAP_SYS_ADMIN the kernel takes one change per 100 ms system-wide
    and answers EAGAIN in between, so that is retried for up to about 0.2 s."""
    for _ in range(tries):
        try:
            AUTOGROUP.write_text(str(nice))
            return True
        except OSError as e:
            if e.errno != errno.EAGAIN:
                return False
            time.sleep(0.01)
    return False
