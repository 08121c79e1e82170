"""The daemon's supervisor with its real parts: the node's ranks, the etcd upkeep, the
health monitor and systemd's notifier, over one run directory (parts.py)."""

from __future__ import annotations

import threading

from daemon.accounting import Action, Kind
from daemon.accounting.life_file import last_life, write_life
from daemon.config import DaemonConfig, node_device, write_rank_config
from daemon.coordination.coordinator import Coordinator
from daemon.health import HealthMonitor, HealthSettings
from daemon.node_state.status import NodeStatus
from daemon.node_state.view import NodeView
from daemon.ranks.node_group import NodeGroup
from daemon.supervision.parts import Parts
from daemon.supervision.supervisor import Supervisor
from daemon.supervision.systemd import Notifier
from daemon.supervision.upkeep import EtcdUpkeep


def build_supervisor(
    cfg: DaemonConfig, coordinator: Coordinator, notifier: Notifier | None = None
) -> Supervisor:
    """The supervisor of this node, its parts built over `cfg.run_dir` (made here)."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    lost = last_life(run_dir)  # how the previous daemon here ended, before this one says
    write_life(run_dir)
    rank_config = write_rank_config(cfg, run_dir / "config.json")
    view = NodeView()
    wake = threading.Event()  # a rank's output ended, or the job changed: look at once
    built: list[Supervisor] = []  # the rank threads publish through the supervisor made below

    def publish() -> None:  # a rank's event, from its output thread
        for supervisor in built:
            supervisor.publish()

    def shown() -> None:  # the election, mid-round: what it is about to log is shown
        for supervisor in built:
            supervisor.publish(supervisor.upkeep.report())

    def published() -> NodeStatus:  # what the node's etcd record is read from
        return built[0].published

    settings = HealthSettings.of(cfg, coordinator.settings.endpoints, node_device(cfg))
    ranks = NodeGroup(cfg, rank_config, wake, publish)
    if lost is not None:  # it ended without leaving: the node's incident, until its next step
        kind = Kind.LEADER_LOST if lost.leading else Kind.NODE_LOST
        why = "the daemon's previous life ended without leaving (killed, crashed, host down)"
        ranks.fold.struck(kind, why, None, Action.RESTART, began=lost.last_seen)
    parts = Parts(
        ranks=ranks,
        upkeep=EtcdUpkeep(cfg, coordinator, run_dir, published, wake.set, shown),
        health=HealthMonitor(settings, cfg.health.interval_s, wake.set),
        notifier=notifier or Notifier(),
    )
    built.append(Supervisor(cfg, view, parts, wake))
    return built[0]
