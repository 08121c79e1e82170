"""Partition safety: when a node must stop its ranks and lighthouse, and what it keeps after.

The rule (DESIGN.md, "Partitions"): under any network partition at most one set
of replica groups commits steps, and a group on the losing side never becomes the
state that survives (a healing source or a checkpoint).

* **Fence.** A node whose lease has not been confirmed for ``TTL - margin``
  (:func:`fence_margin_s`) is *fenced*: its lighthouse is stopped (before etcd can
  expire the lease and let another node lead and start one) and its ranks are
  paused with SIGSTOP (they neither commit, checkpoint, nor serve a heal). A new
  leader is elected only after etcd expired the old lease, so two lighthouses never
  serve at once. An etcd outage shorter than ``TTL - margin`` fences nobody.
* **Unfence.** When etcd answers again: if the old lease is still alive nothing
  changed hands, and the ranks resume. If it was lost, :func:`after_fence` decides
  from the leader *epoch* (the leader key's create revision): under the same epoch
  there was only ever one lighthouse, so every group's state lies on one history
  and torchft's max-step healing is right. Under a new epoch, groups that committed
  steps under it may be behind a group that committed alone under the old one
  while cut off; this node resumes only once they are at least
  :data:`AHEAD_BY` steps ahead of it (its ranks then heal from them), and discards
  its ranks' state (a restart, not counted in the budget) if that does not happen
  within :data:`HOLD_S`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

LEASE_FILE = "lease.json"  # in run_dir: our lease and its last confirmation (trainer.lease_fence)
AHEAD_BY = 2  # a paused rank may still commit the step whose vote it had finished
HOLD_S = 30.0


class Fence(StrEnum):
    HOLD = "hold"  # stay paused: no leader yet, or the new epoch's groups are not ahead yet
    KEEP = "keep"  # resume the ranks: their state cannot override a surviving commit
    DISCARD = "discard"  # restart the ranks: they heal from the survivors or a checkpoint


def fence_margin_s(ttl_s: float) -> float:
    """How long before the lease can expire a node fences itself."""
    return max(1.0, ttl_s / 5.0)


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
    the other nodes' records (``epoch``, ``epoch_step``, ``step``); `held_s`: how
    long it has waited since etcd answered again.
    """
    if epoch is None:
        return (Fence.DISCARD, "no leader") if held_s > HOLD_S else (Fence.HOLD, "no leader")
    if epoch == trained_epoch:
        return Fence.KEEP, "the leader did not change: one history"
    progressed = [
        _int(r.get("step"))
        for name, r in nodes.items()
        if name != node_id
        and _int(r.get("epoch")) == epoch
        and _int(r.get("step")) > _int(r.get("epoch_step"))
    ]
    change = f"leader epoch {trained_epoch} -> {epoch}"
    if not progressed:
        return Fence.KEEP, f"{change}, nothing committed under it yet"
    ahead = max(progressed)
    if ahead >= step + AHEAD_BY:
        return Fence.KEEP, f"{change}, its groups are ahead (step {ahead} > {step})"
    why = f"{change}, its groups committed steps but are not ahead (step {ahead}, ours {step})"
    return (Fence.DISCARD, why) if held_s > HOLD_S else (Fence.HOLD, why)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
