"""The checkpoint fence: a save counts only if the node's etcd lease outlived its step.

Under a network partition a node that is cut off may still commit a few steps
before its daemon fences it (pauses its ranks); those steps are on the losing
side and must not become a checkpoint (DESIGN.md, "Partitions"). The daemon
writes its lease and when it was last confirmed (the send time of the last
keepalive etcd answered, on CLOCK_MONOTONIC, which every process on the host
shares) to ``PHALANX_LEASE_FILE``. The writer stamps each save with the lease
at commit time; the completion marker is written only once the same lease is
confirmed after the commit. A new lease means the old one may have expired
while the node was cut off: the save is left unmarked (invalid). Without a
daemon (no ``PHALANX_LEASE_FILE``) there is no fence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from trainer.contracts import lease_file


class Confirmation(StrEnum):
    """Whether the lease was confirmed after a step, so its checkpoint may be marked."""

    OK = "ok"
    WAIT = "wait"  # not confirmed since the commit yet
    LOST = "lost"  # the lease changed: the step may lie on a partition's losing side


@dataclass(frozen=True)
class Stamp:
    lease: str | None
    commit_ns: int


@dataclass(frozen=True)
class LeaseFence:
    path: Path
    wait_s: float = 30.0  # how long a blocking finish waits for a confirmation

    def read(self) -> tuple[str, int] | None:
        return lease_file.read(self.path)

    def stamp(self) -> Stamp:
        now = self.read()
        return Stamp(now[0] if now else None, time.monotonic_ns())

    def verdict(self, stamp: Stamp) -> Confirmation:
        now = self.read()
        if now is None or stamp.lease is None:
            return Confirmation.WAIT
        lease, confirmed_ns = now
        if lease != stamp.lease:
            return Confirmation.LOST
        return Confirmation.OK if confirmed_ns > stamp.commit_ns else Confirmation.WAIT

    def wait(self, stamp: Stamp) -> Confirmation:
        deadline = time.monotonic() + self.wait_s
        verdict = self.verdict(stamp)
        while verdict == Confirmation.WAIT and time.monotonic() < deadline:
            time.sleep(0.1)
            verdict = self.verdict(stamp)
        return verdict
