"""What the node reports of itself: the status it publishes each tick (for /status,
/readyz, /healthz and /metrics: ``daemon.node_state.status``), and, as it exits, a group
that ended a completed job without ever sharing a quorum with another group that held a
slot (``never_replicated``; issue 34: it used to end quietly)."""

from __future__ import annotations

from daemon.config import DaemonConfig
from daemon.node_state.reports import RanksReport
from daemon.node_state.status import NodeStatus
from daemon.node_state.view import NodeView
from daemon.supervision.health_gate import shared_fault
from trainer import logs


def node_status(
    view: NodeView, cfg: DaemonConfig, lighthouse_up: bool, ranks: RanksReport | None = None
) -> NodeStatus:
    """The view as the supervisor's tick leaves it, with the ranks' last report, copied
    into one frozen value."""
    return NodeStatus.of(
        view,
        cfg.node_id,
        cfg.job.name,
        cfg.job.min_replicas,
        lighthouse_up=lighthouse_up,
        shared_fault=shared_fault(view.health, view.job, cfg.node_id),
        ranks=ranks,
    )


def report_unreplicated(view: NodeView) -> None:
    numbers = view.unreplicated()
    if numbers is None or not (view.train_done or view.job_completed):
        return
    logs.get().warning(
        "never_replicated",
        **numbers,
        why="this group never shared a quorum with another group holding a slot",
        check="node.advertise_host of every node, the lighthouse address and the quorum "
        "(phalanx status; alert PhalanxReplicaGroupMissing)",
    )
