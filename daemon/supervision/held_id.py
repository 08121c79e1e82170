"""Our node id in another daemon instance's record: waited on, then refused.

A dead process's record expires with its lease, so one still there after a lease TTL
(plus the request deadline and a second) belongs to a live duplicate: the join is
refused (exit 2, naming the other's host). A restart on the same run directory is
not a duplicate: it takes its predecessor's keys at once (``coordination.identity``).
"""

from __future__ import annotations

from trainer import logs


class HeldIdWait:
    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._seen: tuple[str, float] | None = None  # (other instance, first seen)

    def refuse(self, instance: str, error: str, now: float) -> bool:
        """Whether to refuse now; the first sight of an instance is logged."""
        if self._seen is None or self._seen[0] != instance:
            self._seen = (instance, now)
            logs.get().warning("node_id_held", error=error, waiting_s=self.limit_s)
        return now - self._seen[1] > self.limit_s
