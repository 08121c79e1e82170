"""Fault tolerance across replica groups: the replication protocol a training loop
sees, its torchft implementation (the Manager, the reconfigurable process group,
gradient buckets, the healing transport), every reach into torchft's private parts
(the adapter and its check), divergence detection, the training state one group
hands another, and the report of a step attempt.
"""

from __future__ import annotations

from trainer.ft.divergence import (
    ReplicasDiverged,
    Tally,
    compare_groups,
    local_digest,
    verdict,
    votes,
)
from trainer.ft.grad_buckets import buckets
from trainer.ft.replication import (
    DRAIN_QUORUM_WAIT_S,
    Checkpointing,
    Comparing,
    CrossGroup,
    QuorumView,
    Replication,
    ResumableState,
    SingleGroup,
    StepAbandoned,
    StepLifecycle,
    leave_unless_formed,
)
from trainer.ft.state import TrainState, local
from trainer.ft.step_report import Attempt
from trainer.ft.torchft_adapter import SafeHTTPTransport, scoped_process_group
from trainer.ft.torchft_group import TorchFTGroup, membership_token
from trainer.ft.transport import SnapshotTransport, checkpoint_transport

__all__ = [
    "DRAIN_QUORUM_WAIT_S",
    "Attempt",
    "Checkpointing",
    "Comparing",
    "CrossGroup",
    "QuorumView",
    "ReplicasDiverged",
    "Replication",
    "ResumableState",
    "SafeHTTPTransport",
    "SingleGroup",
    "SnapshotTransport",
    "StepAbandoned",
    "StepLifecycle",
    "StepReport",
    "Tally",
    "TorchFTGroup",
    "TrainState",
    "buckets",
    "checkpoint_transport",
    "compare_groups",
    "leave_unless_formed",
    "local",
    "local_digest",
    "membership_token",
    "scoped_process_group",
    "verdict",
    "votes",
]
