"""What the supervisor's parts hand it each round, as values it cannot change."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Join(StrEnum):
    """What one try at joining the job came to (the upkeep's join)."""

    JOINED = "joined"
    NOT_YET = "not_yet"  # etcd unreachable or a conflict: try again next tick
    REFUSED = "refused"  # bad input: another job file, wrong credentials


@dataclass(frozen=True)
class UpkeepReport:
    """What one round of upkeep leaves the supervisor to act on."""

    slot_lost: bool = False  # a new session could not keep this node's slot
    lighthouse: str | None = None  # the ranks' TORCHFT_LIGHTHOUSE once the forwarder has a target
    lighthouse_up: bool = False  # that target, and our lighthouse process while we lead
