"""Why a node stops its group: the ranks' own exit, or a reason of the node's.

:data:`StopCause` is a closed union: the supervisor hands one to the node group when it
begins stopping, and ``daemon.supervision.after_stop`` matches on its type, never on text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from daemon.ranks.workers import GroupExit


@dataclass(frozen=True)
class SlotLost:
    """etcd gave our slot to another node while it was away."""

    reason: ClassVar[str] = "slot lost while etcd was away"


@dataclass(frozen=True)
class FencedOut:
    """A fence ended with the ranks' state discarded (it may lie on a partition's losing side)."""

    reason: ClassVar[str] = "fenced: the ranks' state may lie on a partition's losing side"


@dataclass(frozen=True)
class JobEnded:
    """The job ended without this node's ranks finishing it (completed elsewhere)."""

    reason: str


@dataclass(frozen=True)
class GroupRestart:
    """A group that spans nodes ended the generation these ranks ran under: another node's
    ranks failed, or a member was lost (``daemon.supervision.spanning``)."""

    reason: str


@dataclass(frozen=True)
class Unhealthy:
    """This node failed its health checks health.leave_after times in a row while other
    groups carry the job (``daemon.supervision.health_gate``): it gives its seat back."""

    reason: str


@dataclass(frozen=True)
class NoState:
    """The group committed step 1 again after the job had reached `from_step` (no group
    with state, no checkpoint), and ``job.on_no_state = "stop"`` says not to retrain."""

    from_step: int

    @property
    def reason(self) -> str:
        return (
            f"the job started over from step 0 after reaching step {self.from_step} (no group "
            "with state, no checkpoint to load) and job.on_no_state is 'stop'; set "
            "checkpoint.dir to keep state, or job.on_no_state = 'restart' to train again"
        )


StopCause = GroupExit | SlotLost | FencedOut | JobEnded | GroupRestart | Unhealthy | NoState

SLOT_LOST = SlotLost()
FENCED_OUT = FencedOut()
