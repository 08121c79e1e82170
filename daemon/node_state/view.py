"""The supervisor's own state: its node's state machine and what it last decided."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from daemon.health import HealthReport
from daemon.node_state.states import State

__all__ = ["NodeView", "State"]


@dataclass
class NodeView:
    """The supervisor's state, written by the supervisor alone and copied each tick into the
    published status (node_state/status.py) that /status, the metrics and the node's etcd
    record read. The other parts hand the supervisor frozen values instead: the etcd
    upkeep an ``UpkeepReport`` (it is handed an ``UpkeepInput``), the node group a
    ``RanksReport`` and its ranks' ``RankProgress`` (node_state/progress.py, folded by
    the rank output threads), the health monitor a ``HealthReport``.
    """

    state: State = State.JOINING
    registered: bool = False
    restarts: dict[str, int] = field(default_factory=dict)
    failure: str | None = None  # why the daemon failed (its exit 1 or 2)
    last_tick: float = field(default_factory=time.monotonic)
    ticks: int = 0  # supervisor loop iterations: /status shows the loop is alive
    waiting_for: str | None = None  # what WAITING (or a holding FENCED) waits for
    completed_seen_at: float | None = None  # when the job was first seen completed
    generation: int | None = None  # the spanning group's generation the ranks run under
    health: HealthReport | None = None  # the health monitor's last report (daemon.health)

    @property
    def healthy(self) -> bool:
        """The last health report found nothing wrong (False before the first)."""
        return self.health is not None and self.health.ok

    def completed_for(self, now: float, completed: bool) -> float:
        """How long the job has been seen completed (by another node; 0 when it is not):
        `completed`, as the upkeep's last report shows the job."""
        if not completed:
            return 0.0
        self.completed_seen_at = self.completed_seen_at or now
        return now - self.completed_seen_at
