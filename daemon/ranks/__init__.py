"""This node's replica group as processes: the group's spec and the ranks'
environment, one start of the ranks (the worker group), the node group that restarts
it, each rank's process and output, and the warm standbys and the zygote that forks
them.
"""

from __future__ import annotations

from daemon.ranks.node_group import NodeGroup, keeps_replica_id
from daemon.ranks.spec import GroupSpec, rank_env
from daemon.ranks.standby import REFILL_DELAY_S, Standby
from daemon.ranks.workers import ExitKind, GroupExit
from daemon.ranks.zygote import parent_of

__all__ = [
    "REFILL_DELAY_S",
    "ExitKind",
    "GroupExit",
    "GroupSpec",
    "NodeGroup",
    "Standby",
    "keeps_replica_id",
    "parent_of",
    "rank_env",
]
