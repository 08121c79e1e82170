"""What this node is and knows: the supervisor's states with their transition table,
and the node's view (its slot, leadership, group progress) that the status page, the
metrics and the node's etcd record are read from.
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
