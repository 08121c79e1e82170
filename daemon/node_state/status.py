"""What the node shows: one frozen value, copied from the view and the parts' reports, and
swapped whole.

The supervisor builds a :class:`NodeStatus` at the end of every tick, and after every
rank event the view takes in (``Supervisor.publish``, under one lock), and publishes it
by swapping one reference; ``/status``, ``/readyz``, ``/healthz`` and ``/metrics``
(``daemon.surfaces``), served from the HTTP thread, and the node's etcd record
(``daemon.supervision.node_record``) read only that value, never the view the
supervisor and the rank threads write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from daemon.accounting import IncidentLog, Ledger
from daemon.coordination.job_view import JobView
from daemon.health import HealthReport
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import RanksReport, UpkeepReport
from daemon.node_state.states import State
from daemon.node_state.view import NodeView


def _frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class NodeStatus:
    node: str
    job_name: str
    min_replicas: int
    state: State = State.JOINING
    slot: int | None = None
    node_rank: int = 0
    generation: int | None = None
    spare: bool = False
    leader: bool = False
    lighthouse: str | None = None
    lighthouse_up: bool = False  # an address is known (and, on the leader, its process lives)
    etcd_up: bool = False
    etcd_errors: int = 0
    registered: bool = False
    step: int = 0
    reached: int = 0  # the job's reached step as etcd recorded it when our ranks started
    loss: float | None = None
    participants: int | None = None
    restarts: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    heals: int = 0
    started_over: int = 0
    pids: tuple[int, ...] = ()
    standby_pids: tuple[int, ...] = ()
    hang_timeouts: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    hang_learned: bool = False
    step_time_quantile_s: float | None = None
    step_time_median_s: float | None = None
    phases: tuple[str, ...] = ()
    stragglers: Mapping[int, float] = field(default_factory=lambda: _frozen({}))
    last_error: str | None = None
    waiting_for: str | None = None
    health: HealthReport | None = None
    healthy: bool = True
    shared_fault: bool = False  # failing only a check every node fails (health_gate)
    ticks: int = 0
    last_tick: float = 0.0  # monotonic: when the supervisor's loop last went round
    job: JobView | None = None
    ledger: Ledger | None = None  # where the node's time went (daemon.accounting)
    incidents: IncidentLog | None = None  # the failures it lived through (accounting)
    nproc: int = 1  # the ranks this node runs (node.nproc): its accelerators

    @classmethod
    def of(
        cls,
        view: NodeView,
        node: str,
        job_name: str,
        min_replicas: int,
        shared_fault: bool,
        nproc: int = 1,
        ranks: RanksReport | None = None,
        upkept: UpkeepReport | None = None,
        progress: RankProgress | None = None,
    ) -> NodeStatus:
        """The supervisor's view as it is now, copied: each field of the view's name, its
        lists as tuples and its dicts as read-only copies; and the frozen reports of the
        ranks (the node group's), of the etcd upkeep and of the ranks' progress, for the
        fields of their names. The last error: the daemon's failure, else the ranks'."""
        rank_error = progress.rank_error if progress is not None else None
        given: dict[str, Any] = {
            "node": node,
            "job_name": job_name,
            "min_replicas": min_replicas,
            "shared_fault": shared_fault,
            "nproc": nproc,
            "last_error": view.failure or rank_error,
        }
        copied = {
            name: _copy(getattr(view, name))
            for name in _names(cls)
            if name not in given and hasattr(view, name)
        }
        shown = set(_names(cls))
        reported = {
            name: getattr(report, name)
            for report in (ranks, upkept, progress)
            if report is not None
            for name in _names(type(report))
            if name in shown
        }
        return cls(**given, **copied, **reported)


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names: listed once per class (a status is built every tick)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return _frozen(value)
    return value
