"""What the node does about its health (``daemon.health``): pure decisions the supervisor
acts on, each unit tested.

* Before claiming a seat: claim only on a healthy report (:func:`claim_blocked`); until
  then the node stays in CLAIMING and its ``waiting_for`` names the failing checks.
* Holding a seat, ranks not running (WAITING): start no ranks while unhealthy, and give
  the seat back after ``health.leave_after`` failed runs in a row (:func:`must_leave`).
* Running: give the seat back after ``health.leave_after`` failed runs in a row, but only
  while at least ``job.min_replicas`` other groups run on nodes whose records say they are
  healthy (:func:`healthy_groups_besides`). A fault every node shares (a full shared
  checkpoint volume, a clock the whole site lost) then makes no node leave, so it never
  stops the job; a fault of this node alone moves its group out of the way (a full local
  disk under the writer group would fail every save) and the node claims again once
  healthy, healing from the others like any returning group.

* A shared fault (:func:`shared_fault`): when every failing check of this node is one that
  several nodes may share (the checkpoint volume) and no other live node of the job
  passes it, no healthy node could take the seat, so the node claims and trains anyway:
  its saves are refused (each a ``checkpoint_failed``), its health stays failing on every
  surface, and ``PhalanxTrainingOnSharedFault`` fires. Without this a full shared volume
  left every restarted node waiting for ever.

A node's record carries its failing checks (``health``: name -> reason; empty when
healthy), which is how the others read its health.
"""

from __future__ import annotations

from typing import Any

from daemon.config import DaemonConfig
from daemon.coordination.job_view import JobView
from daemon.health import HealthReport

FIRST_CHECK = "the first health check"


# Checks about something several nodes may use at once: failed by every node, the fault
# is the job's, not this node's (the other checks are each node's own).
SHAREABLE = frozenset({"checkpoint_dir"})
SHARED = (
    "every node of the job fails these checks, so none could take this seat: the node "
    "trains, its checkpoint saves refused until fixed"
)


def claim_blocked(report: HealthReport | None, shared: bool = False) -> str | None:
    """Why the node may not claim a seat (or start ranks) now; None when it may: healthy,
    or failing only a fault every node shares (`shared`, :func:`shared_fault`)."""
    if report is None:
        return FIRST_CHECK
    if report.ok or shared:
        return None
    names = ", ".join(c.name for c in report.failing)
    return f"the node to be healthy (failing: {names}; see /status)"


def failing(report: HealthReport | None) -> dict[str, str]:
    """The failing checks by name with their reasons: the record's ``health``."""
    return {c.name: c.reason for c in report.failing} if report is not None else {}


def must_leave(
    report: HealthReport | None,
    leave_after: int,
    running: bool,
    healthy_others: int,
    min_replicas: int,
) -> bool:
    """Whether a node holding a seat gives it back: `leave_after` (0: never) failed runs in
    a row, and, when its ranks run, `healthy_others` (other groups running on healthy
    nodes) at least job.min_replicas, so the job trains on without it."""
    if report is None or report.ok or leave_after <= 0:
        return False
    if report.failed_in_a_row < leave_after:
        return False
    return not running or healthy_others >= max(1, min_replicas)


def healthy_groups_besides(job: JobView | None, node_id: str, slot: int | None) -> int:
    """The groups other than `slot` that run on healthy nodes, as the nodes' records say:
    a group counts when a node of it runs and none of its running nodes reports a failing
    check. Records are read without trusting them (a malformed one counts as unhealthy)."""
    if job is None:
        return 0
    running: dict[int, bool] = {}  # gid -> all of its running nodes healthy
    for node, record in job.nodes.items():
        if node == node_id or not isinstance(record, dict) or record.get("state") != "running":
            continue
        gid = record.get("group")
        if not isinstance(gid, int) or isinstance(gid, bool) or gid == slot:
            continue
        running[gid] = running.get(gid, True) and _healthy(record)
    return sum(1 for ok in running.values() if ok)


def _healthy(record: dict[str, Any]) -> bool:
    health = record.get("health", {})
    return isinstance(health, dict) and not health


def shared_fault(report: HealthReport | None, job: JobView | None, node_id: str) -> bool:
    """Whether this node fails only SHAREABLE checks that every other live node of the job
    fails too, as their records say (alone, it is the only candidate): then no healthy
    node could take its seat. A record without its first report yet (no ``health``) or a
    malformed one counts as passing, so the node waits until the others have checked."""
    if report is None or report.ok or job is None:
        return False
    names = {c.name for c in report.failing}
    if not names <= SHAREABLE:
        return False
    for node, record in job.nodes.items():
        if node == node_id:
            continue
        health = record.get("health") if isinstance(record, dict) else None
        if not isinstance(health, dict) or not names <= set(health):
            return False
    return True


def running_group_leaves(
    health: HealthReport | None, job: JobView | None, slot: int | None, cfg: DaemonConfig
) -> bool:
    """health.leave_after failed checks in a row, with job.min_replicas other groups
    training on healthy nodes: this node's running group (in `slot`) makes way."""
    others = healthy_groups_besides(job, cfg.node_id, slot)
    return must_leave(health, cfg.health.leave_after, True, others, cfg.job.min_replicas)
