"""What each quorum the lighthouse hands this rank says beyond its members.

* Its id goes into the rank's heartbeat (:meth:`~trainer.contracts.heartbeat.Heartbeat.note_quorum`):
  when the rank dies, its daemon reads it there and announces the failure, with that
  id, to every other group's ranks (``daemon.ranks.failure_notice``), so those
  blocked in a collective of that quorum give the step up at once instead of waiting
  for a ring neighbour that already gave up.
* A quorum that came only after the lighthouse's join timeout (``lighthouse.join_timeout_ms``,
  passed as ``PHALANX_JOIN_TIMEOUT_MS``) and left out members of this rank's last quorum
  waited out that timeout for them: alive but late (blocked in a step that could no
  longer finish) or dead but not yet silent for ``heartbeat_timeout_ms``. That is a
  stall the whole job paid, so it is said: a ``quorum_join_timeout`` event naming the
  groups left out, and ``phalanx_ft_quorum_join_timeouts_total``.

The rank's first quorum is never counted: a new job's lighthouse waits its join timeout
for groups still starting, by design.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from trainer import logs
from trainer.contracts.heartbeat import Heartbeat

# A member's own wait is the lighthouse's join timeout less how long after the first
# joiner it asked; the survivors of a failed step ask within milliseconds of each other,
# while a quorum that forms as it should takes a few. 0.8 tells the two apart.
JOIN_SLACK = 0.8


def group_of(replica: str) -> str:
    """A replica id without the process's ``:<uuid>``: the replica group it names."""
    return replica.partition(":")[0]


def left_out(
    last: Sequence[str] | None, members: Sequence[str], waited_s: float, join_timeout_s: float
) -> list[str]:
    """The groups of the `last` quorum missing from `members`, when the quorum call that
    returned `members` took `waited_s`, about the join timeout or more; else none."""
    if last is None or waited_s < JOIN_SLACK * join_timeout_s:
        return []
    present = {group_of(m) for m in members}
    return sorted({group_of(m) for m in last} - present)


class QuorumWatch:
    """Fed every quorum this rank gets (torchft's quorum thread); read by the step loop."""

    def __init__(self, beat: Heartbeat, join_timeout_ms: int | None) -> None:
        self.beat = beat
        self.join_timeout_s = None if join_timeout_ms is None else join_timeout_ms / 1000.0
        self.log = logs.get()
        self._lock = threading.Lock()
        self._join_timeouts = 0  # see take_join_timeouts

    def observe(self, last: Any, result: Any, waited_s: float) -> None:
        """`result` (torchft's QuorumResult) came `waited_s` after it was asked for; `last`
        is this rank's quorum before it (None for its first)."""
        self.beat.note_quorum(int(result.quorum_id))
        if self.join_timeout_s is None:
            return
        previous = None if last is None else [str(r) for r in last.replica_ids]
        missing = left_out(
            previous, [str(r) for r in result.replica_ids], waited_s, self.join_timeout_s
        )
        if not missing:
            return
        with self._lock:
            self._join_timeouts += 1
        self.log.warning(
            "quorum_join_timeout",
            quorum_id=int(result.quorum_id),
            waited_s=round(waited_s, 3),
            join_timeout_s=self.join_timeout_s,
            left_out=missing,
        )

    def take_join_timeouts(self) -> int:
        """Quorums since the last call that waited out the join timeout."""
        with self._lock:
            count, self._join_timeouts = self._join_timeouts, 0
        return count
