"""What the supervisor's parts hand it each round, as values it cannot change."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


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


@dataclass(frozen=True)
class RanksReport:
    """This node's ranks as the node group left them after its calls of a tick."""

    pids: tuple[int, ...] = ()  # the live ranks'
    standby_pids: tuple[int, ...] = ()  # waiting standbys (daemon.ranks.standby)
    phases: tuple[str, ...] = ()  # each local rank's phase (daemon.ranks.hang)
    quiet_since: float | None = None  # monotonic: when the stillest local rank last beat
    hang_timeouts: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    hang_learned: bool = False  # the step's timeout was learned from step times
    step_time_quantile_s: float | None = None  # the quantile of step times it came from
    step_time_median_s: float | None = None
