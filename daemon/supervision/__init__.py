"""The supervisor's state machine: the monitor loop that branches on what each round
returns, the upkeep of etcd (lease, record, leadership, preflight, the slot or seat)
each round, a group that spans nodes (when its part may start, when it must stop),
what to do after the group stops, the restart budget, waiting for peers, what an
unhealthy node does (the health gate), the node's etcd record, and the systemd
notifications the loop sends.
"""

from __future__ import annotations

from daemon.supervision.after_stop import FENCED_OUT, SLOT_LOST, StopDecision
from daemon.supervision.assembly import build_supervisor
from daemon.supervision.parts import Parts
from daemon.supervision.restarts import RestartBudget
from daemon.supervision.supervisor import TICK_S, Supervisor
from daemon.supervision.systemd import Notifier
from daemon.supervision.waiting import QUIET_MARGIN_S, Waiting

__all__ = [
    "FENCED_OUT",
    "QUIET_MARGIN_S",
    "SLOT_LOST",
    "TICK_S",
    "Notifier",
    "Parts",
    "RestartBudget",
    "StopDecision",
    "Supervisor",
    "Waiting",
    "build_supervisor",
]
