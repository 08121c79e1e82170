"""The daemon's vocabulary: the supervisor's states with their transition table, its own
view (view.py), the frozen reports its parts hand it (reports.py: the etcd upkeep's and
the node group's; progress.py: what the ranks' events said) and the one status it
publishes each tick (status.py), which the status page, the metrics and the node's etcd
record read.
"""

from __future__ import annotations

from daemon.node_state.states import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    State,
    allowed,
    diagram,
)
from daemon.node_state.view import NodeView

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "IllegalTransition",
    "NodeView",
    "State",
    "allowed",
    "diagram",
]
