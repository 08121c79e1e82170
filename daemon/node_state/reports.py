"""What the supervisor's parts hand it each round, as values it cannot change."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from daemon.accounting.incidents import EtcdSeen
from daemon.coordination.job_view import JobView


class Join(StrEnum):
    """What one try at joining the job came to (the upkeep's join)."""

    JOINED = "joined"
    NOT_YET = "not_yet"  # etcd unreachable or a conflict: try again next tick
    REFUSED = "refused"  # bad input: another job file, wrong credentials


@dataclass(frozen=True)
class UpkeepInput:
    """What the upkeep is handed of the node each round (the supervisor's and the ranks'):
    it keeps no reference to the node's view."""

    registered: bool = False
    running: bool = False  # the node is RUNNING: a deposed lighthouse or epoch counts
    watching: bool = False  # RUNNING, or its ranks paused while a member is asked about:
    # a spanning group's members' status ports are watched (seats.py, aside.py)
    step: int = 0
    waiting_for: str | None = None  # shown while FENCED holds (the fence judge's reason)
    invalid_checkpoints: frozenset[str] = frozenset()  # paths our ranks refused to load
    latest_checkpoint: Mapping[str, Any] | None = None  # from a rank's checkpoint_saved


@dataclass(frozen=True)
class UpkeepReport:
    """What the upkeep knows after a round, or after a verb (:meth:`EtcdUpkeep.report`):
    the job as etcd shows it, this node's slot and seat, etcd's health and leadership."""

    slot_lost: bool = False  # a new session could not keep this node's slot (tick only)
    ranks_lighthouse: str | None = None  # the ranks' TORCHFT_LIGHTHOUSE: the forwarder's
    lighthouse_up: bool = False  # that target, and our lighthouse process while we lead
    lighthouse: str | None = None  # the address etcd publishes, as last followed
    job: JobView | None = None
    slot: int | None = None
    node_rank: int = 0  # this node's seat in a group that spans nodes (GROUP_RANK)
    nodes_per_group: int = 1
    spare: bool = False  # the last claim found every slot (seat) held: a spare node
    etcd_up: bool = False
    # etcd's raft term as its last keepalive answer said, and when that was (epoch s).
    etcd_told: tuple[int | None, float | None] = (None, None)
    etcd_errors: int = 0
    leader: bool = False
    most_groups: int = 0  # the most replica-group slots held at once, as read from etcd
    # Nothing may commit here now: the lease is unconfirmed, or a new session replaced it
    # and the ranks' state is not judged yet (the fence judge's; daemon.fencing).
    must_pause: bool = False
    # Members of this node's spanning group, by node id, whose daemon's status port
    # refused (no daemon: gone) or answered nothing (silent) while our ranks ran
    # (daemon.supervision.seats.Seats.watch).
    members_gone: tuple[str, ...] = ()
    members_silent: tuple[str, ...] = ()

    @property
    def etcd_seen(self) -> EtcdSeen:
        """etcd as this round saw it (the incident record's: an outage or a cut)."""
        return EtcdSeen(self.etcd_up, *self.etcd_told)

    @property
    def seat(self) -> int | None:
        """The seat's number (the slot's where a group is one node), None without one."""
        return None if self.slot is None else self.slot * self.nodes_per_group + self.node_rank

    @property
    def slot_label(self) -> str:
        return "-" if self.slot is None else str(self.slot)

    @property
    def job_completed(self) -> bool:
        return bool(self.job and self.job.state and self.job.state.get("state") == "completed")

    def behind_the_end(self, step: int) -> bool:
        """The job completed elsewhere at a step more than one past `step` (this group's):
        the groups that finished it have left, so this one could only train alone what is
        done (no grace to finish: docs/failure-modes.md)."""
        state = self.job.state if self.job_completed and self.job else None
        end = state.get("step") if state else None
        return isinstance(end, int) and step < end - 1

    def missing_groups(self, need: int) -> str | None:
        """Whether fewer than `need` replica groups hold a slot (every seat, where groups
        span nodes) and what is missing, or None."""
        have = len(self.job.whole_groups(self.nodes_per_group)) if self.job is not None else 0
        return None if have >= need else f"replica groups: {have} of job.min_replicas={need}"


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
