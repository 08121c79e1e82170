"""The semi-synchronous loop (``ft.semi_sync_method = "diloco"``): one :meth:`RoundLoop.step`
is one round of ``ft.sync_steps`` (H) inner steps and the sync that ends it.

Every quorum is a sync. A group that has none yet (it just started, or it joins a
running job) first joins one with nothing to add: it learns the groups of the next
round, and heals there if the others are ahead (torchft, a synchronous quorum: the
peer's synced parameters, outer momentum, inner optimizer and LR schedule). Then:

1. the round's items: round ``r`` is steps ``r*H .. r*H+H-1`` and their ``H*B`` items
   (B: the global batch), split among the last sync's groups as one step's are
   (trainer/data/shares.py); a group trains the ``i``-th of ``H`` parts of its share in
   inner step ``i``: forward, backward (reduced inside the group only), clipping, the
   job's optimizer and LR schedule. Nothing crosses groups;
2. the sync: the quorum, then one summing exchange across its groups of each one's
   pseudo-gradient (trainer/ft/outer.py; int8 with ft.should_quantize,
   trainer/ft/quantize.py), its buffers' change, its part of the round's loss and which
   share it trained, each weighted by whether the group trained the round (a group
   that just joined or healed adds nothing and is not counted), then
   should_commit. Committed: the outer step, every group at its result, bitwise alike,
   and the step count moves on by H. Not: every group back at the round's start (its
   parameters and buffers; the inner optimizer's moments stay), and the round trained
   again with the same items. Each round sets the LR schedule at its first step.

A group lost during a round is not waited for: the sync's quorum goes on without it,
and its share of the round is trained by nobody. One group of the round that added its
share logs each such share (``items_lost``, trainer.contracts.rank_events; who tells:
trainer/data/sync_ledger.py) and the metric counts its items.

Streaming (``ft.num_fragments`` F > 1): a "round" is H/F steps and its sync exchanges
one fragment of the parameters in turn (every fragment at the job's last sync); a failed
sync goes back to where its steps began; shares a lost group trained at the last F-1
syncs that the fragment synced now never received are logged as ``items_partly_lost``.
"""

from __future__ import annotations

import math
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from trainer import logs
from trainer.chaos import Chaos
from trainer.config import TrainerConfig
from trainer.config.env import RankEnv
from trainer.contracts import rank_events as events
from trainer.data.shares import Quorum, group_share, rank_plan, split, step_items
from trainer.data.sources import Sampler
from trainer.data.sync_ledger import Ledger, settle, slots
from trainer.forward_backward import ForwardBackward
from trainer.ft.divergence import check_replicas
from trainer.ft.outer import OuterStep
from trainer.ft.replication import Replication
from trainer.ft.state import TrainState, as_param, local
from trainer.ft.sync_exchange import exchange
from trainer.optim import clip_grad_norm
from trainer.parallel.group_ops import group_any, group_sum
from trainer.parallel.mesh import Layout
from trainer.parallel.parallelize import autocast_dtype
from trainer.step_report import StepReport, SyncFigures
from trainer.workloads import LossFn


@dataclass(frozen=True)
class Sync:
    """What one sync came to."""

    committed: bool
    loss: float | None  # the round's mean loss over every item trained in it
    lost: tuple[range, ...]  # shares of the round no group of the sync trained
    bytes: int = 0  # of the tensors averaged across groups
    norm: float | None = None  # the averaged pseudo-gradient's (None: nothing applied)
    added: bool = False  # this group's round is in it (not when it joined, healed, resumed)
    tells: bool = False  # this group says what was lost (trainer/data/sync_ledger.py)
    partly: tuple[range, ...] = ()  # streaming: earlier shares the fragment synced never saw
    fragment: int | None = None  # the fragment synced (None: every parameter)


@dataclass
class RoundLoop:
    cfg: TrainerConfig
    env: RankEnv
    layout: Layout
    models: list[nn.Module]
    state: TrainState
    replication: Replication
    sampler: Sampler
    chaos: Chaos
    loss_fn: LossFn
    outer: OuterStep
    tokens_per_item: int = 1
    stop_requested: Callable[[], bool] = lambda: False  # SIGTERM: drain after this round
    cold_start: Callable[[], None] | None = None  # while no group has committed a round
    last_loss: float | None = None
    drained: bool = False

    def __post_init__(self) -> None:
        self.fragments = self.cfg.ft.num_fragments
        self.every = self.cfg.ft.sync_steps // self.fragments  # steps per sync
        self.ledger = Ledger(self.fragments - 1)  # the last committed syncs' adders
        self.mark = _draw()  # this group's, until its parameters start over
        self.params = list(self.state.params.values())
        self.global_batch = self.cfg.train.global_batch
        per_rank = self.cfg.train.batch_size // self.layout.dp_shard
        start = self.layout.dp_rank * per_rank
        self.rows = range(start, start + per_rank)  # of an evaluation batch
        self.micro = per_rank // self.cfg.train.grad_accum
        self.members: Quorum | None = None  # the round's groups (None: join a sync first)
        self.compute_s: float | None = None  # groups do not wait on each other: no stragglers
        self.stragglers = _NoStragglers()
        self.log = logs.get()
        self.passes = ForwardBackward(
            models=self.models,
            sampler=self.sampler,
            loss_fn=self.loss_fn,
            device=self.layout.device,
            sharded=self.layout.fsdp is not None,
            autocast=autocast_dtype(self.cfg.parallel, self.layout),
            cp=None,
            global_batch=self.global_batch,
            unit=1,
        )

    def done(self) -> bool:
        return self.replication.current_step() >= self.cfg.train.steps or self.drained

    def step(self) -> StepReport | None:
        """One round and its sync; None when resumed at the final step."""
        started = time.monotonic()
        while self.members is None:  # the job's first sync, or this group's
            self._join()
        first = self.replication.current_step()
        if first >= self.cfg.train.steps:
            return None
        members = self.members
        self.outer.mark()
        self._schedule_at(first)
        share = group_share(first // self.every, self.every * self.global_batch, members)
        total = torch.zeros((), dtype=torch.float64, device=self.layout.device)
        grad_norm, finite = 0.0, True
        for i in range(self.every):
            self.chaos.begin_step(first + i)
            self.chaos.at("forward")
            total = total + self._inner_step(first + i, split(share, self.every, i))
            grad_norm = clip_grad_norm(
                self.params, self.cfg.train.max_grad_norm, self.layout.group("pp")
            )
            finite = finite and math.isfinite(grad_norm)
            self.state.before_mutation()
            self.state.optimizer.step()
            self.state.scheduler.step()
        loss_sum, self.drained = self._group_total(total)
        syncing = time.monotonic()
        sync = self._sync(first, members, loss_sum, share, finite)
        writer = sync.tells and self.env.rank == 0
        figures = SyncFigures(
            every=self.every,
            seconds=time.monotonic() - syncing,
            bytes=sync.bytes,
            pseudo_norm=sync.norm,
            items_lost=sum(len(r) for r in sync.lost) if writer else 0,
            items_partly_lost=sum(len(r) for r in sync.partly) if writer else 0,
        )
        if writer:
            for lost in sync.lost:
                self.log.warning(
                    events.ITEMS_LOST, step=first + self.every, items=[lost.start, lost.stop]
                )
            for part in sync.partly:  # streaming: the fragment synced now never saw them
                self.log.warning(
                    events.ITEMS_PARTLY_LOST, step=first + self.every,
                    items=[part.start, part.stop], fragment=sync.fragment,
                )  # fmt: skip
        items = share if sync.committed and sync.added else range(0)
        diverged = False
        if sync.committed:
            self.state.tokens += len(items) * self.tokens_per_item
            self.last_loss = sync.loss
            if self.chaos.at("optimizer"):  # perturb: this group's parameters drift
                local(self.params[0]).data.add_(1e-3)
            diverged = self._compare_replicas()
        return StepReport(
            step=self.replication.current_step(),
            committed=sync.committed,
            loss=sync.loss,
            lr=float(self.state.scheduler.get_last_lr()[0]),
            grad_norm=grad_norm,
            participants=self.replication.participants(),
            quorum_id=self.replication.quorum_id(),
            seconds=time.monotonic() - started,
            tokens=len(items) * self.tokens_per_item,
            items=items,
            finite=finite,
            diverged=diverged,
            quorum_s=self.replication.take_quorum_wait(),
            sync=figures,
        )

    def _schedule_at(self, step: int) -> None:
        """The LR schedule at `step` whatever this group's own past: a group that joined at
        a sync without healing (its peers at the same step count, as in a job's first
        round), or a round trained again after its sync failed."""
        self.state.scheduler.last_epoch = step - 1
        with warnings.catch_warnings():  # positioned, not stepped before the optimizer
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            self.state.scheduler.step()

    def _join(self) -> None:
        """Join a sync with nothing to add: this group learns the next round's groups,
        resumes from a checkpoint where no group has committed a round, or heals."""
        first = self.replication.current_step()
        self._sync(first, None, None, range(0), True)

    def _inner_step(self, step: int, items: range) -> torch.Tensor:
        """Forward and backward of this rank's part of `items`, averaged inside the group;
        the sum of its per-item losses (a device scalar)."""
        for p in self.params:
            p.grad = None
        plan = rank_plan(
            items, self.layout.dp_shard, self.layout.dp_rank, self.micro, 1, max(1, len(items))
        )
        return self.passes.run(step, plan)

    def _sync(
        self,
        first: int,
        members: Quorum | None,
        total: float | None,
        share: range,
        finite: bool,
    ) -> Sync:
        """The quorum, the exchange across its groups and the commit (see the module's
        docstring); `members` and `total`: the round's groups and its group's loss sum
        (None: this group joins with nothing to add)."""
        heals = self.state.heals
        self.replication.start_step()
        if first == 0 and self.cold_start is not None:  # every group, while none committed
            self.cold_start()
        resumed = self.replication.current_step() != first and self.state.heals == heals
        # Healed or resumed: at the round's start now, with nothing to add; its parameters
        # started over (a new mark: sync_ledger.py).
        healed = resumed or self.state.heals != heals
        if healed:  # and where a failed sync would go back to is where it is now
            self.mark, self.ledger = _draw(), Ledger(self.fragments - 1)
            self.outer.mark()
        first = self.replication.current_step()  # a checkpoint's, or the peer's it healed from
        trained = 0.0 if members is None or healed or total is None else 1.0
        groups = max(1, self.env.num_replica_groups)
        fragment = self._fragment(first)
        moved = self.outer.pseudo_gradients(fragment)
        which = torch.zeros(slots(groups), dtype=torch.float64, device=self.layout.device)
        if trained and total is not None and members is not None and members.rank is not None:
            which[members.rank] = self.mark
            which[groups + members.rank] = float(len(self.ledger.added))
            which[2 * groups] = total
            which[2 * groups + 1] = float(len(share))
        which[2 * groups + 2] = trained
        self.chaos.at("gradients")  # in the sync's quorum, nothing sent yet
        deltas = [d.mul_(trained) for d in self.state.buffers.deltas(self.layout.fsdp_group())]
        moved = [m.mul_(trained) for m in moved]
        summed, size = exchange(
            self.replication.sync_gradients, self.cfg.ft, self.env.num_replica_groups,
            [*deltas, which], moved,
        )  # fmt: skip
        quorum = self.replication.quorum()
        self.state.before_mutation()
        committed = self.replication.should_commit(finite and summed)
        self.members = quorum if committed else None  # after a failed sync: join again
        if not committed:
            self.outer.roll_back()
            self.state.buffers.restore()
            return Sync(False, None, (), size)
        weight = float(which[2 * groups + 2])  # how many of the sync's groups trained
        norm = None
        if weight > 0:
            for t in (*deltas, *moved):
                t.div_(weight)
            norm = self._norm(moved, fragment)
            self.outer.apply(moved, fragment)
            self.state.buffers.commit(deltas)
        else:  # nobody trained (every group joined): nothing moves
            self.outer.roll_back()
            self.state.buffers.restore()
        advanced = first + (self.every if weight > 0 else 0)
        self.replication.restore(advanced, self.replication.ft_state())
        if members is None or weight <= 0:
            if weight > 0:  # others' round, whose groups this group does not know
                self.ledger = Ledger(self.fragments - 1)
            return Sync(True, None, (), size, norm)
        items = float(which[2 * groups + 1])
        loss = float(which[2 * groups]) / items if items > 0 else None
        round_items = step_items(first // self.every, self.every * self.global_batch)
        settled = settle(which.tolist(), groups, members, round_items, self.ledger)
        self.ledger = self.ledger.after(settled.added)
        # The groups that added their round share its membership: one of them says what
        # the others did not add (a group that healed here knows another round's).
        tells = bool(trained) and settled.tells
        return Sync(
            True, loss, settled.lost, size, norm, bool(trained), tells, settled.partly, fragment
        )

    def _fragment(self, first: int) -> int | None:
        """The fragment the sync after steps `first`.. exchanges (None: every parameter,
        without fragments and at the job's last sync)."""
        if self.fragments == 1 or first + self.every >= self.cfg.train.steps:
            return None
        return (first // self.every) % self.fragments

    def _norm(self, moved: list[torch.Tensor], fragment: int | None) -> float:
        """The L2 norm of the averaged pseudo-gradient over the fragment synced (every
        shard), as the gradient norm is taken (it stands in for the gradients a moment)."""
        params = [self.state.params[name] for name in self.outer.fragment(fragment)]
        if not params:
            return 0.0
        for p, d in zip(params, moved, strict=True):
            p.grad = as_param(p, d)
        norm = clip_grad_norm(params, 0.0, self.layout.group("pp"))
        for p in params:
            p.grad = None
        return norm

    def _compare_replicas(self) -> bool:
        """Every ft.digest_every steps, right after a committed sync, where every group's
        parameters and buffers must be bitwise alike: do they match? True when they do
        not and this group is in the majority; raises in the minority (it restarts and
        heals), as in every-step mode (trainer/ft/divergence.py)."""
        every, step = self.cfg.ft.digest_every, self.replication.current_step()
        if not (self.env.fault_tolerant and every) or step % every:
            return False
        # Streaming: the live parameters of fragments not synced here are each group's own.
        held = self.outer.synced.values() if self.fragments > 1 else map(local, self.params)
        shards = [*held, *self.state.buffers.committed.values()]
        return check_replicas(
            step, shards, self.replication, lambda f: group_any(self.layout, f), self.env.rank
        )

    def _group_total(self, mine: torch.Tensor) -> tuple[float, bool]:
        """The group's sum of per-item losses in the round and its drain vote (every rank
        leaves after the same round), from one all-reduce inside the group."""
        if self.layout.mesh is None:
            return float(mine), self.stop_requested()
        total, (drain,) = group_sum(self.layout, True, float(mine), [self.stop_requested()])
        return total, drain


def _draw() -> float:
    """A group's mark: a random whole number, exact in float64."""
    return float(secrets.randbelow(2**52 - 1) + 1)


class _NoStragglers:
    """The loop's straggler watch, for the step's metrics: groups do not wait on each
    other between syncs, so there is nothing to flag."""

    flagged = False
    last_ratio: float | None = None
