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

A standby handed its start while it warms cannot be trusted to lift itself quickly:
its reader thread needs the interpreter lock, and the warm-up may hold it through a long
C call (loading libtorch) that, at that weight next to busy ranks, takes tens of seconds
(measured: 17-18 s with two busy sessions on two cores). So whoever hands it the start
lifts it from outside as well (:func:`leave_idle`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

CAP_SYS_NICE = 23
AUTOGROUP = Path("/proc/self/autogroup")  # "/autogroup-<id> nice <n>"; absent without autogroup
IDLE_AUTOGROUP_NICE = 19
NEW_SESSION_NICE = 0  # the kernel's nice value for a new session's group


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


def set_policy(policy: int, pid: int | str = "self", only_from: int | None = None) -> None:
    """Set every thread of process `pid` (this one by default) to `policy`, or only those
    at `only_from` (Linux schedules threads, not processes)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                if only_from is None or os.sched_getscheduler(int(tid)) == only_from:
                    os.sched_setscheduler(int(tid), policy, os.sched_param(0))


@dataclass(frozen=True)
class Lowered:
    """What :func:`lower_to_idle` changed: `idle`, this process's threads went to
    SCHED_IDLE; `group_nice`, its session group's nice value to put back (None: the
    group was not lowered)."""

    idle: bool = False
    group_nice: int | None = None

    def restore(self) -> bool:
        """Put this process back to normal priority; False where the kernel refused the
        session group's nice value."""
        if self.idle:
            set_policy(os.SCHED_OTHER)
        return self.group_nice is None or set_autogroup_nice(self.group_nice)


def lower_to_idle() -> Lowered:
    """Warm up at idle priority where this process may leave it again: SCHED_IDLE, and
    its session group at nice 19 when it leads a session of its own (as the daemon
    starts it; never a shell's). Elsewhere nothing changes."""
    if not may_leave_idle():
        return Lowered()
    set_policy(os.SCHED_IDLE)
    nice = autogroup_nice() if os.getsid(0) == os.getpid() else None
    if nice is not None and not set_autogroup_nice(IDLE_AUTOGROUP_NICE):
        nice = None
    return Lowered(True, nice)


def leave_idle(pid: int) -> None:
    """Lift a standby that warms at idle priority from outside: its SCHED_IDLE threads to
    SCHED_OTHER and its session group, where lowered to nice 19, back to a new session's
    nice 0. Anything else is left as it is; errors (it exited) are ignored."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    set_policy(os.SCHED_OTHER, pid, only_from=os.SCHED_IDLE)
    path = Path(f"/proc/{pid}/autogroup")
    if autogroup_nice(path) == IDLE_AUTOGROUP_NICE:
        set_autogroup_nice(NEW_SESSION_NICE, path=path)


def autogroup_nice(path: Path = AUTOGROUP) -> int | None:
    """The nice value of this process's session group (of `path`'s process), or None where
    the kernel has none."""
    try:
        return int(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(nice: int, tries: int = 20, path: Path = AUTOGROUP) -> bool:
    """Set this session's group nice value (that of `path`'s process); False where the
    kernel has no autogroup or refuses. Without CAP_SYS_ADMIN the kernel takes one change
    per 100 ms system-wide and answers EAGAIN in between, so that is retried for up to
    about 0.2 s."""
    for _ in range(tries):
        try:
            path.write_text(str(nice))
            return True
        except OSError as e:
            if e.errno != errno.EAGAIN:
                return False
            time.sleep(0.01)
    return False
