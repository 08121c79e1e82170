"""What the node reports of itself: what it hands the etcd upkeep each round, the status it
publishes each tick (for /status, /readyz, /healthz and /metrics:
``daemon.node_state.status``), what its time goes to in each state
(``daemon.accounting``), and, as it exits, where its time went and a group that ended a
completed job without ever sharing a quorum with another group that held a slot
(``never_replicated``)."""

from __future__ import annotations

import time
from typing import Any

from daemon.accounting import Activity
from daemon.accounting.life_file import write_life
from daemon.config import DaemonConfig
from daemon.exits import EXIT_OK
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import RanksReport, UpkeepInput, UpkeepReport
from daemon.node_state.states import TERMINAL, State
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
        nproc=cfg.node.nproc,
        ranks=ranks,
        upkept=upkept,
        progress=progress,
    )


# What a state's time is, where the node's state says it (RUNNING: the ranks' steps say).
STATE_TIME: dict[State, Activity | None] = {
    State.JOINING: Activity.WAITING,
    State.CLAIMING: Activity.WAITING,
    State.WAITING: Activity.WAITING,
    State.RUNNING: None,
    State.FENCED: Activity.FENCED,
    State.STOPPING: Activity.RESTARTING,
    State.RESTARTING: Activity.RESTARTING,
    State.DRAINING: Activity.DRAINING,
    **{s: Activity.DRAINING for s in TERMINAL},
}


def time_goes_to(state: State, spare: bool) -> Activity | None:
    """What the node's time goes to in `state` (None: its ranks' steps say); a node that
    found every seat held waits as a spare."""
    activity = STATE_TIME[state]
    return Activity.SPARE if spare and activity == Activity.WAITING else activity


def exit_report(
    cfg: DaemonConfig, view: NodeView, code: int, progress: RankProgress, upkept: UpkeepReport
) -> dict[str, Any]:
    """As the daemon exits: ``never_replicated`` where it applies (report_unreplicated),
    the run directory's life file says this life ended (not lost: life_file.py), and the
    daemon_exit event's fields: the state and exit code, the error where it failed, and
    the seconds of its life by activity (they add up to it)."""
    report_unreplicated(progress, upkept)
    write_life(cfg.run_dir, ended=True)
    fields: dict[str, Any] = {"state": view.state.value, "code": code}
    if code != EXIT_OK:  # a rank error the group got past is not why it ended
        fields["error"] = view.failure or progress.rank_error
    totals = progress.ledger.totals(time.monotonic())
    fields["seconds"] = {a.value: round(s, 3) for a, s in totals.items()}
    return fields


def upkeep_input(view: NodeView, progress: RankProgress, aside: bool = False) -> UpkeepInput:
    """What the etcd upkeep is handed of the node: the supervisor's state and the ranks'
    progress, as values (`aside`: its ranks paused while a member is asked about)."""
    return UpkeepInput(
        registered=view.registered,
        running=view.state == State.RUNNING,
        watching=view.state == State.RUNNING or aside,
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
