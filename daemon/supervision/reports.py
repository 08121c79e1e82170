"""What the node reports of itself: what it hands the etcd upkeep each round, the status it
publishes each tick (for /status, /readyz, /healthz and /metrics:
``daemon.node_state.status``), and, as it exits, a group that ended a completed job
without ever sharing a quorum with another group that held a slot (``never_replicated``)."""

from __future__ import annotations

from daemon.config import DaemonConfig
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import RanksReport, UpkeepInput, UpkeepReport
from daemon.node_state.states import State
from daemon.node_state.status import NodeStatus
from daemon.node_state.view import NodeView
from daemon.supervision.health_gate import shared_fault
from trainer import logs


def node_status(
    view: NodeView,
    cfg: DaemonConfig,
    upkept: UpkeepReport | None = None,
    ranks: RanksReport | None = None,
    progress: RankProgress | None = None,
) -> NodeStatus:
    """The view as the supervisor's tick leaves it, with the upkeep's, the ranks' and their
    progress's last reports, copied into one frozen value."""
    job = upkept.job if upkept is not None else None
    return NodeStatus.of(
        view,
        cfg.node_id,
        cfg.job.name,
        cfg.job.min_replicas,
        shared_fault=shared_fault(view.health, job, cfg.node_id),
        ranks=ranks,
        upkept=upkept,
        progress=progress,
    )


def upkeep_input(view: NodeView, progress: RankProgress) -> UpkeepInput:
    """What the etcd upkeep is handed of the node: the supervisor's state and the ranks'
    progress, as values."""
    return UpkeepInput(
        registered=view.registered,
        running=view.state == State.RUNNING,
        step=progress.step,
        waiting_for=view.waiting_for,
        invalid_checkpoints=progress.invalid_checkpoints,
        latest_checkpoint=progress.latest_checkpoint,
    )


def report_unreplicated(progress: RankProgress, upkept: UpkeepReport) -> None:
    numbers = progress.unreplicated(upkept.most_groups)
    if numbers is None or not (progress.train_done or upkept.job_completed):
        return
    logs.get().warning(
        "never_replicated",
        **numbers,
        why="this group never shared a quorum with another group holding a slot",
        check="node.advertise_host of every node, the lighthouse address and the quorum "
        "(phalanx status; alert PhalanxReplicaGroupMissing)",
    )
