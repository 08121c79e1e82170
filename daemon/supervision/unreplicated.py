"""A group that ends a completed job without ever sharing a quorum with another group that
held a slot ran unreplicated: the daemon says so as it exits (``never_replicated``;
issue 34: it used to end quietly)."""

from __future__ import annotations

from daemon.node_state.view import NodeView
from trainer import logs


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
