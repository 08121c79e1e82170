"""The training state one replica group can hand to another (live healing).

What a recovering group needs: parameters, optimizer state, LR schedule, the
data position and the step. :class:`TrainState` captures *references* to the
sharded parameters once, right after parallelization. FSDP2 swaps the
registered parameters between sharded and unsharded forms during forward and
backward, so calling ``model.parameters()`` from torchft's quorum thread at the
wrong moment could see the wrong tensors; the captured sharded parameters are
the ones the optimizer updates in place, and they only change in
``optimizer.step()``, after torchft has stopped serving the checkpoint.

Everything leaves this module as plain tensors (DTensors become their local
shard) and plain containers, so the receiver can load it with
``weights_only=True``. Both sides run the same layout (the job's spec hash
guarantees it), so local shards line up rank by rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def to_local_tree(obj: Any) -> Any:
    """Replace every DTensor in a nested structure with its local shard."""
    if isinstance(obj, torch.Tensor):
        return local(obj)
    if isinstance(obj, dict):
        return {k: to_local_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_local_tree(v) for v in obj)
    return obj


@dataclass
class TrainState:
    """References to the live state of one rank, plus the step counters."""

    params: dict[str, torch.nn.Parameter]
    optimizer: Optimizer
    scheduler: LRScheduler
    step: int = 0  # committed optimizer steps
    tokens: int = 0  # tokens this replica group has trained on
    on_load: list[Callable[[int, float], None]] = field(default_factory=list)

    def healing_state_dict(self) -> dict[str, Any]:
        return {
            "model": {name: local(p.detach()) for name, p in self.params.items()},
            "optimizer": to_local_tree(self.optimizer.state_dict()),
            "lr_scheduler": self.scheduler.state_dict(),
            "train": {"step": self.step, "tokens": self.tokens},
        }

    def load_healing_state_dict(self, state: dict[str, Any]) -> None:
        started = time.monotonic()
        model: dict[str, torch.Tensor] = state["model"]
        missing = set(self.params) ^ set(model)
        if missing:
            raise RuntimeError(f"healing state does not match the model: {sorted(missing)[:5]}")
        with torch.no_grad():
            for name, param in self.params.items():
                target = local(param)
                if target.shape != model[name].shape:
                    raise RuntimeError(
                        f"healing state for {name} has shape {tuple(model[name].shape)}, "
                        f"expected {tuple(target.shape)}: the peers run different layouts"
                    )
                target.copy_(model[name])
        self.optimizer.load_state_dict(self._optimizer_from_local(state["optimizer"]))
        self.scheduler.load_state_dict(state["lr_scheduler"])
        self.step = int(state["train"]["step"])
        self.tokens = int(state["train"]["tokens"])
        for callback in self.on_load:
            callback(self.step, time.monotonic() - started)

    def _optimizer_from_local(self, state: dict[str, Any]) -> dict[str, Any]:
        """Wrap received local optimizer tensors back into DTensors shaped like their params."""
        ordered = [p for group in self.optimizer.param_groups for p in group["params"]]
        rebuilt: dict[int, dict[str, Any]] = {}
        for index, values in state["state"].items():
            param = ordered[int(index)]
            entry: dict[str, Any] = {}
            for key, value in values.items():
                if (
                    isinstance(param, DTensor)
                    and isinstance(value, torch.Tensor)
                    and value.dim() > 0
                ):
                    value = DTensor.from_local(
                        value.to(param.device),
                        param.device_mesh,
                        param.placements,
                        run_check=False,
                        shape=param.shape,
                        stride=param.stride(),
                    )
                entry[key] = value
            rebuilt[int(index)] = entry
        return {"state": rebuilt, "param_groups": state["param_groups"]}
