"""The training loop: one optimizer step at a time, committed only when the quorum agrees.

A step:

1. ``start_step`` (torchft: compute the quorum; a lagging group is healed here or
   in ``should_commit``);
2. wait for the quorum (the groups in it split the step's items, trainer/data/shares.py),
   then forward and backward over this rank's micro-batches of its group's share
   (gradient accumulation, or one pipeline schedule run per micro-batch), each loss
   weighted so that the update is the mean over the step's items;
3. gradients averaged across replica groups (FSDP hook during backward, or the
   bucketed all-reduce, whose last bucket also carries the group's part of the
   step's mean loss);
4. the total gradient norm (and clipping), then ``should_commit``: a rank whose
   loss or norm is NaN or infinite votes the step down; if every rank of every
   participating group succeeded, step the optimizer and the LR schedule;
   otherwise the step is retried with the same data (the data position is the
   committed step);
5. the buffers' changes (BatchNorm statistics), averaged across groups in step 3,
   are added to their committed values at a commit, or dropped when the step does
   not commit (trainer/ft/buffers.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainer import logs
from trainer.chaos import Chaos
from trainer.config import TrainerConfig
from trainer.config.env import RankEnv
from trainer.contracts import rank_events as events
from trainer.data.shares import Quorum, fixed_cuts, group_share, rank_plan
from trainer.data.sources import Sampler
from trainer.forward_backward import ForwardBackward
from trainer.ft.buffers import joined, split
from trainer.ft.divergence import check_replicas
from trainer.ft.non_finite import NonFiniteStreak
from trainer.ft.replication import (
    DRAIN_QUORUM_WAIT_S,
    Replication,
    StepAbandoned,
    leave_unless_formed,
)
from trainer.ft.state import TrainState, local
from trainer.ft.step_report import Attempt
from trainer.ft.straggler import ComputeClock, StragglerWatch
from trainer.optim import clip_grad_norm
from trainer.parallel.context import ContextParallel
from trainer.parallel.group_ops import group_any, group_sum
from trainer.parallel.mesh import Layout
from trainer.parallel.parallelize import autocast_dtype
from trainer.step_report import StepReport
from trainer.workloads import LossFn

if TYPE_CHECKING:  # torch.distributed.pipelining is imported only by pipelined runs
    from trainer.parallel.pipeline import Schedule, WeightedLoss


ALONE = Quorum(1, 0)  # this group trains the whole step


@dataclass
class Loop:
    cfg: TrainerConfig
    env: RankEnv
    layout: Layout
    models: list[nn.Module]  # the model, or this rank's pipeline stages
    state: TrainState
    replication: Replication
    sampler: Sampler
    chaos: Chaos
    loss_fn: LossFn
    tokens_per_item: int = 1
    schedule: Schedule | None = None
    pipeline_loss: WeightedLoss | None = None  # the schedule's loss function
    first: bool = True  # this rank holds the first pipeline stage (feeds the inputs)
    last: bool = True  # ... the last stage (computes the loss)
    stop_requested: Callable[[], bool] = lambda: False  # SIGTERM: drain after this step
    # Run in every step attempt until one commits, before its forward: while no group
    # of the quorum has committed, every group takes part in a cold start's resume.
    cold_start: Callable[[], None] | None = None
    cp: ContextParallel | None = None  # parallel.cp > 1: this rank's slice of each sequence
    last_loss: float | None = None  # of the last committed step (None: no step ran here)
    drained: bool = False  # the group agreed to stop early (SIGTERM)

    def __post_init__(self) -> None:
        self.params = list(self.state.params.values())
        self.sharded = self.layout.fsdp is not None
        self.autocast = autocast_dtype(self.cfg.parallel, self.layout)
        per_rank = self.cfg.train.batch_size // self.layout.dp_shard
        start = self.layout.dp_rank * per_rank
        self.rows = range(start, start + per_rank)  # of an evaluation batch
        self.global_batch = self.cfg.train.global_batch
        # Items per forward on this rank; a pipelined share is cut in whole schedule batches.
        self.unit = per_rank if self.schedule is not None else 1
        self.micro = (
            per_rank if self.schedule is not None else per_rank // self.cfg.train.grad_accum
        )
        # Whether a step may start on the previous step's quorum (see _forward_backward).
        self.may_guess = not self.sharded and self.schedule is None
        # Whether a failed attempt's gradients may be reused (see _reuse): one rank per
        # group, so no collective inside the group depends on how many items it computes.
        self.may_reuse = self.may_guess and self.layout.mesh is None
        self._heals_seen = self.state.heals  # TrainState.heals when this step began
        # This rank's gradients of the last attempt, if its exchange failed (see _reuse).
        self._failed: Attempt | None = None
        self.log = logs.get()
        self.non_finite = NonFiniteStreak(self.cfg.train.max_skipped_steps, self.env.rank == 0)
        self.clock = ComputeClock(self.layout.device)
        self.stragglers = StragglerWatch(self.cfg.ft, self.env.rank)
        self.compute_s: float | None = None  # this rank's compute in the last step
        self.passes = ForwardBackward(
            models=self.models,
            sampler=self.sampler,
            loss_fn=self.loss_fn,
            device=self.layout.device,
            sharded=self.sharded,
            autocast=self.autocast,
            cp=self.cp,
            global_batch=self.global_batch,
            unit=self.unit,
            schedule=self.schedule,
            pipeline_loss=self.pipeline_loss,
            microbatches=self.cfg.parallel.microbatches,
            first=self.first,
            last=self.last,
        )

    def done(self) -> bool:
        """Whether training is over: every step committed, or the group drained."""
        return self.replication.current_step() >= self.cfg.train.steps or self.drained

    def step(self) -> StepReport | None:
        """One step attempt; None when there is nothing to report (resumed at the final
        step, or a drain left the step)."""
        started = time.monotonic()
        self.replication.start_step()
        if self.state.heals != self._heals_seen:  # healed in start_step (a synchronous quorum)
            self._failed = None  # the parameters changed
        # A heal from here on (torchft's async quorum applies it in should_commit) comes
        # after this step's forward, which then ran on stale parameters.
        self._heals_seen = self.state.heals
        if self.replication.current_step() == 0 and self.cold_start is not None:
            self.cold_start()
        step = self.replication.current_step()
        if step >= self.cfg.train.steps:
            return None
        self.chaos.begin_step(step)
        if self._failed is None or self._failed.step != step:
            self._failed = None
            self._drop_grads()
        self.replication.take_waited()
        self.clock.start()
        self.chaos.at("forward")
        try:
            loss, deltas, share, self.drained = self._gradients(step)
        except StepAbandoned as e:
            self.drained = True
            if self.env.rank == 0:
                self.log.info(events.STEP_ABANDONED, step=step + 1, reason=str(e))
            return None
        diverged = self._compare_replicas()
        self.state.before_mutation()  # healing (in should_commit) and the optimizer write next
        # The averaged gradients are the same on every group, so every group sees a
        # non-finite norm if any group's gradients were: all vote the step down.
        # A failed exchange leaves this rank's own gradients, kept unclipped for the retry.
        clip = self.cfg.train.max_grad_norm if self._failed is None else 0.0
        grad_norm = clip_grad_norm(self.params, clip, self.layout.group("pp"))
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        committed = self.replication.should_commit(finite)
        if not finite:
            self.non_finite.voted_down(step, loss, grad_norm)
        healed = self.state.heals != self._heals_seen
        if committed or not finite or healed or step == 0:
            self._failed = None  # step 0 may load a checkpoint before its next attempt
        reported: float | None = None if healed else loss
        lr = float(self.state.scheduler.get_last_lr()[0])
        items = share if committed else range(0)
        tokens = len(items) * self.tokens_per_item
        if committed:
            self.non_finite.committed()
            if self.chaos.at("optimizer"):  # perturb: this group's parameters drift
                local(self.params[0]).data.add_(1e-3)
            self.state.optimizer.step()
            self.state.buffers.commit(deltas)
            if self.chaos.at("buffers"):  # perturb: this group's buffers drift
                self.state.buffers.perturb(1e-3)
            self.state.scheduler.step()
            self.state.tokens += tokens
            if reported is not None:
                self.last_loss = reported
        else:
            self.state.buffers.restore()  # the forward's changes go with the step
        return StepReport(
            step=self.replication.current_step(),
            committed=committed,
            loss=reported,
            lr=lr,
            grad_norm=grad_norm,
            participants=self.replication.participants(),
            quorum_id=self.replication.quorum_id(),
            seconds=time.monotonic() - started,
            tokens=tokens,
            items=items,
            finite=finite,
            diverged=diverged,
            quorum_s=self.replication.take_quorum_wait(),
        )

    def _gradients(self, step: int) -> tuple[float, list[torch.Tensor], range, bool]:
        """Forward and backward, gradients averaged across groups; return the step's mean
        loss over all its items (every participating group's), the buffers' changes
        averaged across groups (see trainer/ft/buffers.py), this group's items and its
        drain vote (every rank leaves after this step). Raises StepAbandoned when a drain
        leaves a step whose quorum does not form."""
        mine, quorum, own = self._forward_backward(step)
        self.compute_s = self.clock.stop(self.replication.take_waited())
        total, drain = self._group_total(mine)
        deltas = self.state.buffers.deltas(self.layout.fsdp_group())
        if drain:
            leave_unless_formed(self._quorum_settles())
        if self.chaos.at("gradients"):
            for p in self.params:
                if p.grad is not None:
                    local(p.grad).fill_(float("nan"))
        # The group's part of the step's mean loss, averaged across groups like the
        # gradients (the mean over the step's items), then this rank's compute time,
        # whose mean across groups finds stragglers (trainer/ft/straggler.py); both are
        # filled on the device.
        part = torch.cat([
            (total * (quorum.participants / self.global_batch)).reshape(1),
            torch.full((1,), self.compute_s or 0.0, dtype=total.dtype, device=total.device),
        ])  # fmt: skip
        if self.sharded:  # the gradients crossed groups in FSDP's hook, during backward
            # The buffers' changes ride with the loss. A healing group's tensor holds the
            # average too (it sent zeros), though it keeps its own loss (None).
            both = joined(part, deltas)
            across = self.replication.average_across_groups(both)
            split(both, deltas, head=len(part))
            loss, mean = (part if across is None else across[: len(part)]).tolist()
            self._watch(quorum, mean if across is not None else None)
            return loss, deltas, own, drain
        # The part rides at the end of the gradients' last bucket: no all-reduce of its
        # own, and nothing is read from the device before the gradients are sent. The
        # buffers' changes go first, in the same exchange (a healing group's hold the
        # average too: it sent zeros).
        grads = [local(p.grad) for p in self.params if p.grad is not None]
        part = part.to(grads[-1].dtype if grads else part.dtype)
        kept = part.clone()  # a failed or healing exchange leaves this group's own part
        averaged = self.replication.sync_gradients([*deltas, *grads, part])
        if not averaged and quorum.rank is not None and self.may_reuse:
            self._failed = Attempt(step, quorum, own, mine)  # the exchange failed
        loss, mean = (part if averaged else kept).tolist()  # one read of the device
        self._watch(quorum, mean if averaged else None)
        return loss, deltas, own, drain

    def _watch(self, quorum: Quorum, mean_s: float | None) -> None:
        """Compare this rank's compute with the other groups' (a failed exchange, a healing
        group or no time yet on CUDA: nothing to compare)."""
        if mean_s is not None and self.compute_s is not None and quorum.rank is not None:
            step = self.replication.current_step() + 1  # numbered as train_step numbers it
            self.stragglers.check(step, self.compute_s, mean_s, quorum.participants)

    def _compare_replicas(self) -> bool:
        """Every ft.digest_every steps, before the commit: do the groups' parameters and
        committed buffers match? True when they do not and this group is in the majority;
        raises in the minority."""
        every = self.cfg.ft.digest_every
        if not (self.env.fault_tolerant and every):
            return False
        step = self.replication.quorum_step()  # equal on every group of the quorum
        if step == 0 or step % every:
            return False
        shards = [*(local(p) for p in self.params), *self.state.buffers.committed.values()]
        return check_replicas(step, shards, self.replication, self._group_any, self.env.rank)

    def _group_any(self, flags: list[bool]) -> list[bool]:
        return group_any(self.layout, flags)

    def _forward_backward(self, step: int) -> tuple[torch.Tensor, Quorum, range]:
        """Run this rank's part of its group's share of the step; return the sum of this
        rank's per-item losses (a device scalar), the step's quorum and the group's share.

        The share needs the step's quorum. Where no collective across groups runs inside
        the backward (no FSDP hook, no pipeline), the likely quorum is assumed (the
        previous step's, or this group alone after its one peer failed) so the forward
        overlaps torchft's quorum; if the quorum turns out different, the share is
        computed again, or, where this group is left alone, only the rest of it."""
        guess = self.replication.last_quorum() if self.may_guess else None
        quorum = guess or self.replication.quorum()
        failed, self._failed = self._failed, None
        if failed is not None:
            mine, share = self._reuse(step, quorum, failed)
        else:
            mine, share = self._run_share(step, quorum)
        if guess is not None:
            actual = self.replication.quorum()
            if actual != guess and failed is None and self.may_reuse:
                # Left alone (its peer died between steps), what was computed for the
                # guess stands; _reuse computes any other quorum's share from scratch.
                kept = Attempt(step, guess, share, mine)
                (mine, share), quorum = self._reuse(step, actual, kept, "quorum_shrank"), actual
            elif actual != guess:
                self._drop_grads()
                (mine, share), quorum = self._run_share(step, actual), actual
        return mine, quorum, share

    def _reuse(
        self, step: int, quorum: Quorum, failed: Attempt, why: str = "exchange_failed"
    ) -> tuple[torch.Tensor, range]:
        """This group alone after its peer failed the exchange (or died before the step's
        quorum, `why` = "quorum_shrank"): the earlier attempt's gradients (same
        parameters; step() keeps them for the same step only) cover its old share, so
        only the rest of the step's items are computed. Its micro-batches were weighted
        for its old quorum, so they are rescaled to this one's (1 / old participants).
        Any other quorum computes the whole share again. Returns the losses' sum and the
        group's share."""
        if quorum != ALONE:
            self._drop_grads()
            return self._run_share(step, quorum)
        for p in self.params:
            if p.grad is not None:
                local(p.grad).div_(failed.quorum.participants)
        whole = group_share(step, self.global_batch, quorum, self.unit)
        total = failed.losses
        for rest in (range(whole.start, failed.share.start), range(failed.share.stop, whole.stop)):
            if rest:
                plan = rank_plan(
                    rest, 1, 0, self.micro, 1, self.global_batch, self.unit, self._cuts(step)
                )
                total = total + self.passes.accumulate(step, plan)
        self.log.info(
            "gradients_reused",
            step=step + 1,  # numbered as train_step numbers it
            items=[failed.share.start, failed.share.stop],
            computed=len(whole) - len(failed.share),
            why=why,
        )
        return total, whole

    def _drop_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def _run_share(self, step: int, quorum: Quorum) -> tuple[torch.Tensor, range]:
        """Forward and backward of this rank's micro-batches of the group's share under
        `quorum`; the sum of this rank's per-item losses, and the share."""
        share = group_share(step, self.global_batch, quorum, self.unit)
        plan = rank_plan(
            share,
            self.layout.dp_shard,
            self.layout.dp_rank,
            self.micro,
            quorum.participants,
            self.global_batch,
            self.unit,
            self._cuts(step),
        )
        return self.passes.run(step, plan), share

    def _cuts(self, step: int) -> tuple[int, ...]:
        """Where a full quorum's shares of `step` begin: no micro-batch crosses one."""
        return fixed_cuts(step, self.global_batch, self.env.num_replica_groups, self.unit)

    def _quorum_settles(self) -> bool:
        """Whether every rank of the group saw this step's quorum form (the group leaves
        together, without the step, otherwise)."""
        pending = not self.replication.quorum_settles(DRAIN_QUORUM_WAIT_S)
        return not self._group_any([pending])[0]

    def _group_total(self, mine: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The group's sum of per-item losses, from each rank's, and its drain vote: one
        all-reduce inside the group that also agrees on the stop flag, so every rank
        leaves after the same step. A one-rank group reads nothing from the device here."""
        if self.layout.mesh is None:
            return mine, self.stop_requested()
        total, (drain,) = group_sum(self.layout, self.last, float(mine), [self.stop_requested()])
        return torch.tensor(total, dtype=torch.float64, device=self.layout.device), drain
