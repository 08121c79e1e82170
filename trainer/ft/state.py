"""The training state one replica group hands to another (healing) or writes to disk (checkpoints).

What a group needs to continue: parameters, persistent buffers (their committed
values, see trainer/ft/buffers.py), optimizer state, LR schedule, the data position
and the step. :class:`TrainState` captures *references* to the
sharded parameters once, right after parallelization. FSDP2 swaps the
registered parameters between sharded and unsharded forms during forward and
backward, so calling ``model.parameters()`` from torchft's quorum thread at the
wrong moment could see the wrong tensors; the captured sharded parameters are
the ones the optimizer updates in place, and they only change in
``optimizer.step()``, after torchft has stopped serving the checkpoint.

The optimizer's state exists from the start (``optim.init_optimizer_state``),
so loading is always a copy into existing tensors, whatever their layout.

For healing everything travels as plain tensors (DTensors become their local
shard) and plain containers, so the receiver loads it with
``weights_only=True``. Both sides run the same layout (the job's spec hash
guarantees it), so local shards line up rank by rank. Checkpoints keep the
DTensors instead (see trainer/checkpoint/saver.py), which is what lets DCP reshard.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from trainer.ft.buffers import Buffers


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def as_param(p: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """`shard` (a local tensor shaped as `p`'s local shard) laid out as `p` is."""
    if not isinstance(p, DTensor):
        return shard
    return DTensor.from_local(shard, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())


class Synced(Protocol):
    """State kept beside the parameters that a healing group takes too (DiLoCo's outer
    step, trainer/ft/outer.py)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps of it, by parameter name (loaded in place)."""
        ...

    def synced_tensors(self) -> dict[str, torch.Tensor]:
        """The synced parameters where a checkpoint must keep them beside the live ones
        (empty where they are the live ones at every sync), loaded in place."""
        ...

    def rebase(self) -> None:
        """A checkpoint without synced parameters was loaded: they are the live ones."""
        ...


@dataclass
class TrainState:
    """References to the live state of one rank, plus the step counters."""

    params: dict[str, torch.nn.Parameter]
    optimizer: Optimizer
    scheduler: LRScheduler
    step: int = 0  # committed optimizer steps
    tokens: int = 0  # tokens this replica group has trained on
    heals: int = 0  # peer states loaded into this one (a step that sees it change healed)
    # Called before anything mutates the parameters or optimizer state: build() sets the
    # checkpointer's wait for its background copy here (None: nothing to wait for).
    guard: Callable[[], None] | None = None
    # The model's persistent buffers: live, and as of the last commit (what is handed on).
    buffers: Buffers = field(default_factory=lambda: Buffers({}))
    # ft.semi_sync_method = "diloco": the synced parameters and the outer momentum.
    outer: Synced | None = None

    def before_mutation(self) -> None:
        if self.guard is not None:
            self.guard()

    def optimizer_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """The optimizer's per-parameter state keyed by parameter name (live tensors)."""
        by_param = self.optimizer.state
        return {name: dict(by_param[p]) for name, p in self.params.items()}

    def scalars(self) -> dict[str, Any]:
        """Everything that is not a tensor: JSON- and weights_only-safe."""
        return {
            "step": self.step,
            "tokens": self.tokens,
            "lr_scheduler": self.scheduler.state_dict(),
        }

    def load_scalars(self, scalars: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(scalars["lr_scheduler"])
        for group, lr in zip(
            self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True
        ):
            group["lr"] = lr
        self.step = int(scalars["step"])
        self.tokens = int(scalars["tokens"])

    def healing_state_dict(self) -> dict[str, Any]:
        state = {
            "model": {name: local(p.detach()) for name, p in self.params.items()},
            "buffers": dict(self.buffers.committed),
            "optimizer": {
                name: {k: local(v) for k, v in entry.items()}
                for name, entry in self.optimizer_tensors().items()
            },
            "scalars": self.scalars(),
        }
        if self.outer is not None:
            state["outer"] = self.outer.state_dict()
        return state

    def load_healing_state_dict(self, state: dict[str, Any]) -> float:
        """Apply a peer's state; returns the seconds the copy took."""
        self.before_mutation()
        started = time.monotonic()
        targets = {name: local(p) for name, p in self.params.items()}
        optimizer = self.optimizer_tensors()
        for name, entry in optimizer.items():
            for key, value in entry.items():
                targets[f"{name}#{key}"] = local(value)
        received = dict(state["model"])
        for name, entry in state["optimizer"].items():
            for key, value in entry.items():
                received[f"{name}#{key}"] = value
        copy_into(targets, received, "healing state")
        copy_into(self.buffers.committed, state["buffers"], "healing state's buffers")
        self.buffers.restore()  # the live buffers are the committed ones again
        self.load_scalars(state["scalars"])
        if self.outer is not None:  # the round's start, where the sync goes on from
            self.outer.load_state_dict(state["outer"])
        self.heals += 1
        return time.monotonic() - started


def copy_into(
    targets: dict[str, torch.Tensor], received: dict[str, torch.Tensor], what: str
) -> None:
    """Copy every received tensor into its live target; both sides must name and shape them alike."""
    missing = set(targets) ^ set(received)
    if missing:
        raise RuntimeError(f"{what} does not match this model: {sorted(missing)[:5]}")
    with torch.no_grad():
        for name, target in targets.items():
            value = received[name]
            if target.shape != value.shape:
                raise RuntimeError(
                    f"{what} for {name} has shape {tuple(value.shape)}, expected {tuple(target.shape)}: "
                    "the peers run different layouts"
                )
            target.copy_(value)
