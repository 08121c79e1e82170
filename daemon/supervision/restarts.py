"""The restart budget: exponential backoff, and at most N restarts in a sliding window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.config import NodeConfig

BACKOFF_CAP_S = 30.0


@dataclass
class RestartBudget:
    max_restarts: int
    window_s: float
    backoff_s: float
    restarts: deque[float] = field(default_factory=deque)
    total: int = 0

    @classmethod
    def for_node(cls, node: NodeConfig) -> RestartBudget:
        return cls(node.max_restarts, node.restart_window_s, node.restart_backoff_s)

    def _trim(self, now: float) -> None:
        while self.restarts and now - self.restarts[0] > self.window_s:
            self.restarts.popleft()

    def allows(self, now: float) -> bool:
        """Whether one more restart fits in the window."""
        self._trim(now)
        return len(self.restarts) < self.max_restarts

    def record(self, now: float) -> float:
        """Count a restart at `now`; return the delay before starting again."""
        self._trim(now)
        self.restarts.append(now)
        self.total += 1
        recent = len(self.restarts)
        return float(min(BACKOFF_CAP_S, self.backoff_s * 2.0 ** (recent - 1)))
