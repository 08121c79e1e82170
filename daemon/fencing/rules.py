"""The partition rule: when a node must stop its ranks and lighthouse, and what it keeps after.

The rule (DESIGN.md, "Partitions"): under any network partition at most one set
of replica groups commits steps, and a group on the losing side never becomes the
state that survives (a healing source or a checkpoint).

* **Fence.** A node whose lease has not been confirmed for ``TTL - margin``
  (``daemon.coordination.lease_timing.fence_margin_s``) is *fenced*: its lighthouse is stopped and its ranks are
  paused with SIGSTOP (they neither commit, checkpoint, nor serve a heal). A new
  leader may be elected before that, once its short leader lease lapsed
  (``leader_lease``); a group that trained on under the old one meanwhile is
  restarted (``daemon.fencing.judge``: ``distrust``). An etcd outage
  shorter than ``TTL - margin`` fences nobody.
* **Unfence.** When etcd answers again: if the old lease is still alive nothing
  changed hands, and the ranks resume. If it was lost, :func:`after_fence`
  decides. The ranks resume only if nobody went on without them: no other group
  is :data:`AHEAD_BY` steps ahead (all were paused together, as in an etcd
  outage), and no group committed under a new leader *epoch* (the leader key's
  create revision; such groups may be behind steps this group committed alone
  before its fence, and its state must not be the one they heal from).
  Otherwise the ranks are restarted (outside the restart budget) and heal from
  the survivors: resumed, they would rejoin a quorum that moved on while they
  were stopped mid-collective. With no leader at all it waits up to
  :data:`HOLD_S`, then restarts them.
* **What the job recorded.** The records above are only those of nodes still
  registered: the others may have finished and left. So the judgement first reads
  what the job itself recorded (:func:`job_moved_on`): a job whose ``state`` says
  completed, or whose newest published checkpoint is of a later step than ours,
  went on without us, whatever the records say, and the ranks are never resumed
  (lease kept or not): they could only commit and save a history that is not the
  job's. The trainer adds the last line: a save never replaces a complete
  checkpoint of the same step (trainer/checkpoint/saver.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any

from daemon.coordination.lease_timing import refresh_every_s

AHEAD_BY = 2  # a paused rank may still commit the step whose vote it had finished
HOLD_S = 30.0


class Fence(StrEnum):
    HOLD = "hold"  # stay paused: no leader yet, or the new epoch's groups are not ahead yet
    KEEP = "keep"  # resume the ranks: their state cannot override a surviving commit
    DISCARD = "discard"  # restart the ranks: they heal from the survivors or a checkpoint


def epoch_doubt_s(leader_ttl_s: float, lease_ttl_s: float) -> float:
    """How long etcd may go without confirming our lease before a new leader epoch, seen
    in the first whole view after that, restarts our ranks (DESIGN.md, "Partitions",
    rule 4): the leader's TTL beyond the keepalive's own cadence (a confirmation comes
    every ``refresh_every_s``, so a gap that long is no news). 2 s by default."""
    return leader_ttl_s + refresh_every_s(lease_ttl_s)


def job_moved_on(
    step: int,
    state: Mapping[str, Any] | None,
    checkpoint: Mapping[str, Any] | None,
    invalid: Collection[str] = (),
) -> str | None:
    """Why the job went on past a group paused at `step`, from what it recorded (its
    ``state`` key, its newest published checkpoint), or None. A published checkpoint
    whose path is in `invalid` (our ranks found it corrupt and the job resumed from an
    older one) says nothing: the job went back from it, not on past us."""
    if state is not None and state.get("state") == "completed":
        return f"the job completed (at step {_int(state.get('step'))}) while we were fenced"
    if checkpoint is not None and str(checkpoint.get("path")) in invalid:
        return None
    newest = _int(checkpoint.get("step")) if checkpoint is not None else -1
    if newest >= step + AHEAD_BY:  # our reported step may trail our commits by one
        return f"the job has a checkpoint of step {newest}, past our step {step}"
    return None


def after_fence(
    *,
    node_id: str,
    step: int,
    trained_epoch: int | None,
    epoch: int | None,
    nodes: Mapping[str, Mapping[str, Any]],
    held_s: float,
) -> tuple[Fence, str]:
    """What a node whose lease was lost while fenced does with its paused ranks.

    `step`: its group's step when paused; `trained_epoch`: the leader epoch it last
    trained under; `epoch`: the current one (None: no leader right now); `nodes`:
    the nodes' records (``epoch``, ``epoch_step``, ``step``; its own is skipped);
    `held_s`: how long it has waited since etcd answered again.
    """
    if epoch is None:
        return (Fence.DISCARD, "no leader") if held_s > HOLD_S else (Fence.HOLD, "no leader")
    others = [r for name, r in nodes.items() if name != node_id]
    ahead = max((_int(r.get("step")) for r in others), default=-1)
    if ahead >= step + AHEAD_BY:
        # Resumed, the ranks would rejoin a quorum that moved on mid-collective; fresh
        # ranks heal from it cleanly.
        return Fence.DISCARD, f"the other groups went on without us (step {ahead} > {step})"
    if epoch != trained_epoch and any(
        _int(r.get("epoch")) == epoch and _int(r.get("step")) > _int(r.get("epoch_step"))
        for r in others
    ):
        # They may be behind steps this group committed alone before its fence: its
        # state must not become the one they heal from.
        return (
            Fence.DISCARD,
            f"groups committed under a new leader (epoch {trained_epoch} -> {epoch})",
        )
    return Fence.KEEP, "nobody went on without us"


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
