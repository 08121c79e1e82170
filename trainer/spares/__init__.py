"""Hot spares: a standby warms up (imports, builds) and waits for its start; the
zygote warms up once and forks standbys; idle-priority scheduling while they wait.
"""

from __future__ import annotations

from trainer.spares.scheduling import (
    IDLE_AUTOGROUP_NICE,
    autogroup_nice,
    leave_idle,
    may_leave_idle,
)
from trainer.spares.standby import wait_for_start, warm
from trainer.spares.zygote import serve

__all__ = [
    "IDLE_AUTOGROUP_NICE",
    "autogroup_nice",
    "leave_idle",
    "may_leave_idle",
    "serve",
    "wait_for_start",
    "warm",
]
