"""Replica divergence: every ``ft.digest_every`` committed steps the groups compare parameters.

Replica groups must hold bitwise-equal parameters after every commit. A bit flip,
a bad kernel or a heal gone wrong breaks that silently: the averaged gradients
keep every group moving the same way, and the difference survives forever. So
every ``digest_every`` steps, before the step commits:

1. each rank folds its local parameter shards into one int64 on the device (the
   raw bits, weighted by position, summed with wrap-around: exact, no copy to the
   host), and turns it into a vote: a one-hot vector per 6-bit slice of it, plus
   the same again from the writer group only;
2. the votes are averaged across groups through torchft's managed all-reduce,
   like gradients (a peer lost meanwhile fails the step, it does not hang it;
   groups still healing contribute nothing);
3. each rank reads the share of participating groups that voted like it; the
   group is in the minority when any of its ranks is: fewer than half agree with
   it, or exactly half without the writer group (the one whose parameters are
   checkpointed).

Every group that sees a difference logs ``replicas_diverged`` and counts it in
``phalanx_replica_divergences_total`` (alert ``PhalanxReplicasDiverged``); a
minority group raises :class:`ReplicasDiverged`: its ranks exit, its daemon
restarts it and it heals from the majority.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer import logs
from trainer.contracts import rank_events as events
from trainer.ft.replication import Comparing

SLICES = 4  # 6-bit slices of the digest, each voted on separately
BUCKETS = 64
VOTE_SIZE = 2 * SLICES * BUCKETS  # every group's votes, then the writer's
CHUNK = 1 << 22  # elements folded at a time: at most 64 MiB of int64 scratch
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ReplicasDiverged(RuntimeError):
    """This group's parameters differ from the majority's: it must be healed."""


def local_digest(shards: list[torch.Tensor]) -> torch.Tensor:
    """One int64 (a 0-d tensor on the shards' device) that changes when any bit does."""
    total: torch.Tensor | None = None
    for shard in shards:
        flat = shard.detach().contiguous().reshape(-1)
        bits = flat.view(_SAME_SIZE_INT[flat.element_size()])
        part = torch.zeros((), dtype=torch.int64, device=bits.device)
        for start in range(0, bits.numel(), CHUNK):  # bounded scratch memory per shard
            chunk = bits[start : start + CHUNK].to(torch.int64)
            weights = torch.arange(
                start + 1, start + chunk.numel() + 1, dtype=torch.int64, device=bits.device
            )
            part += (chunk * weights).sum()
        total = part if total is None else total * 1_000_003 + part
    if total is None:
        return torch.zeros((), dtype=torch.int64)
    return total


def votes(digest: torch.Tensor, writer: bool) -> torch.Tensor:
    """The one-hot votes of a digest (float64, VOTE_SIZE), on the digest's device."""
    shifts = torch.arange(SLICES, dtype=torch.int64, device=digest.device) * 6
    buckets = torch.bitwise_and(torch.bitwise_right_shift(digest, shifts), BUCKETS - 1)
    index = buckets + torch.arange(SLICES, device=digest.device) * BUCKETS
    out = torch.zeros(VOTE_SIZE, dtype=torch.float64, device=digest.device)
    out[index] = 1.0
    if writer:
        out[index + SLICES * BUCKETS] = 1.0
    return out


@dataclass(frozen=True)
class Tally:
    share: float  # the fraction of participating groups whose parameters match this rank's
    with_writer: bool  # the writer group's parameters match this rank's

    @property
    def diverged(self) -> bool:
        return self.share < 1.0

    @property
    def minority(self) -> bool:
        return self.share < 0.5 or (self.share == 0.5 and not self.with_writer)


def verdict(mine: torch.Tensor, averaged: torch.Tensor) -> Tally:
    """What the averaged votes say about this rank's vote (one host sync)."""
    half = SLICES * BUCKETS
    voted = mine[:half] > 0
    share = averaged[:half][voted].cpu().tolist()
    writer = averaged[half:][voted].cpu().tolist()
    return Tally(share=min(share), with_writer=min(writer) > 0)


@dataclass(frozen=True)
class GroupVerdict:
    diverged: bool  # some rank of this group saw groups whose parameters differ from its own
    minority: bool  # this group must be restarted and healed
    share: float  # this rank's share of matching groups


def compare_groups(
    shards: list[torch.Tensor],
    replication: Comparing,
    group_any: Callable[[list[bool]], list[bool]],
) -> GroupVerdict | None:
    """One comparison of every group's parameters (collective across and within groups);
    None when there is nothing to compare (one group, or this group only heals now).
    `group_any`: each flag, true if it is true on any rank of this group."""
    mine = votes(local_digest(shards), replication.is_writer())
    averaged = replication.average_across_groups(mine.clone())
    if averaged is None:
        return None
    seen = verdict(mine, averaged)
    diverged, minority = group_any([seen.diverged, seen.minority])
    return GroupVerdict(diverged=diverged, minority=minority, share=seen.share)


def check_replicas(
    step: int,
    shards: list[torch.Tensor],
    replication: Comparing,
    group_any: Callable[[list[bool]], list[bool]],
    rank: int,
) -> bool:
    """One comparison at quorum step `step`: True when the groups differ and this group is
    in the majority (logged on rank 0); raises :class:`ReplicasDiverged` in the minority."""
    seen = compare_groups(shards, replication, group_any)
    if seen is None or not seen.diverged:
        return False
    if rank == 0:
        logs.get().warning(
            events.REPLICAS_DIVERGED,
            step=step,
            share=round(seen.share, 3),
            group="minority: restarting to heal" if seen.minority else "majority",
        )
    if seen.minority:
        raise ReplicasDiverged(
            f"this group's parameters at step {step} differ from the majority's "
            f"({seen.share:.0%} of the groups match rank {rank}'s shard); "
            "it restarts and heals from them."
        )
    return True
