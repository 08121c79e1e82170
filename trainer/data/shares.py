"""Which items of a step each replica group and rank trains on (the data contract).

Step ``s`` of a job with global batch ``B`` trains on items ``[s*B, (s+1)*B)`` of the
workload's dataset, whoever is alive. The groups that participate in the step's quorum
split them: participating rank ``r`` of ``G`` takes the ``r``-th of ``G`` contiguous,
nearly equal shares. A group behind the quorum (healing) takes nothing that step.
Inside a group, the ranks that hold different data (``dp_shard``) split the group's
share the same way, and each runs the same number of micro-batches of at most
``micro`` items; one with fewer items runs empty micro-batches as a zero-weight
forward and backward, so the group's collectives still match.

A pipelined group splits in whole units of the schedule's batch (``unit`` items), because
its schedule cuts a fixed number of microbatches from each batch.

Each rank's loss is scaled by ``items_on_micro_batch * dp * G / B`` before its backward:
the data-parallel reduce inside the group and the all-reduce across groups both
average, so the update is the mean gradient over the step's ``B`` items, whichever
groups computed them.

A micro-batch never crosses a boundary between the shares of a full quorum (the job's
``max_replicas`` groups, ``fixed_cuts``): a group that trains more than its usual share
(its peers gone or healing) computes each of the others' shares in passes of its own,
so every item meets the same parameters in a pass over the same items whoever computes
it. With two groups of one rank that makes the update bitwise the same whichever groups
took part: each share's gradient is the same bits scaled by a power of two, and a sum of
two terms does not depend on their order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class Quorum:
    """This group's place in a step's quorum."""

    participants: int  # groups contributing gradients (>= 1)
    rank: int | None  # this group's participating rank; None: healing, contributes nothing


def step_items(step: int, global_batch: int) -> range:
    """Every item of `step`."""
    return range(step * global_batch, (step + 1) * global_batch)


def split(items: range, parts: int, index: int, unit: int = 1) -> range:
    """Part `index` of `parts` contiguous, nearly equal parts of `items`, cut in whole
    `unit`s (len(items) must be a multiple of `unit`)."""
    units = len(items) // unit
    lo, hi = index * units // parts, (index + 1) * units // parts
    return range(items.start + lo * unit, items.start + hi * unit)


def group_share(step: int, global_batch: int, quorum: Quorum, unit: int = 1) -> range:
    """The items this group trains on in `step` (empty while it heals)."""
    if quorum.rank is None:
        return range(0)
    return split(step_items(step, global_batch), quorum.participants, quorum.rank, unit)


@dataclass(frozen=True)
class RankPlan:
    """One rank's micro-batches of a step and the loss weight of each."""

    micro_batches: list[range]  # item indices; an empty range is a zero-weight pass
    weights: list[float]  # multiply the micro-batch's mean loss by this before backward


def fixed_cuts(step: int, global_batch: int, groups: int, unit: int = 1) -> tuple[int, ...]:
    """Where the shares of a full quorum of `groups` begin in `step`, but the first: the
    items at which a micro-batch must begin (see the module's docstring)."""
    items = step_items(step, global_batch)
    return tuple(split(items, groups, k, unit).start for k in range(1, groups))


def _pieces(mine: range, micro: int, cuts: tuple[int, ...]) -> list[range]:
    """`mine` in micro-batches of at most `micro` items that begin at every cut."""
    edges = [mine.start, *(c for c in cuts if mine.start < c < mine.stop), mine.stop]
    return [
        range(lo, min(lo + micro, hi))
        for a, hi in itertools.pairwise(edges)
        for lo in range(a, hi, micro)
    ]


def rank_plan(
    share: range, dp: int, dp_rank: int, micro: int, participants: int, global_batch: int,
    unit: int = 1, cuts: tuple[int, ...] = (),
) -> RankPlan:  # fmt: skip
    """Split a group's share among its `dp` data ranks and into micro-batches of at most
    `micro` items, each beginning at every one of `cuts` it spans (``fixed_cuts``).
    Every rank of the group gets the same number of micro-batches: one with fewer runs
    empty ones (zero-weight passes) after its own."""
    count = max(1, *(len(_pieces(split(share, dp, k, unit), micro, cuts)) for k in range(dp)))
    mine = _pieces(split(share, dp, dp_rank, unit), micro, cuts)
    batches = mine + [range(share.stop, share.stop)] * (count - len(mine))
    scale = dp * participants / global_batch
    return RankPlan(batches, [len(b) * scale for b in batches])
