"""Partition safety, in one place: the rule (rules.py), the node's judge of its own ranks
(judge.py), the others' progress it asks for after a lost lease (progress_ask.py), and
the lease file the ranks' checkpoint fence reads (lease_file.py).

It sits above ``daemon.coordination``, whose lease timing (``lease_timing.py``: how
often the keepalive confirms the lease, and the margin before its expiry at which a
node fences itself) and progress keys (``progress.py``) it reads; the etcd upkeep
(``daemon.supervision.upkeep``) owns one judge and one progress ask per node. The rank
side of the lease file is ``trainer.contracts.lease_file`` and
``trainer.checkpoint.lease_fence``.
"""

from __future__ import annotations

from daemon.fencing.judge import FenceJudge
from daemon.fencing.lease_file import LeaseFile
from daemon.fencing.progress_ask import ProgressAsk
from daemon.fencing.rules import AHEAD_BY, HOLD_S, Fence, after_fence, epoch_doubt_s, job_moved_on

__all__ = [
    "AHEAD_BY",
    "HOLD_S",
    "Fence",
    "FenceJudge",
    "LeaseFile",
    "ProgressAsk",
    "after_fence",
    "epoch_doubt_s",
    "job_moved_on",
]
