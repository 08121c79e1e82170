"""A model's buffers across replica groups: changed only when a step commits, like parameters.

A forward in training mode changes some buffers in place (BatchNorm's
``running_mean``, ``running_var`` and ``num_batches_tracked``). Each group's forward
sees other items, so left alone the groups' buffers drift apart while their
parameters stay bitwise equal. :class:`Buffers` keeps two values per buffer:

* ``live``: the module's own tensor, which the forward changes;
* ``committed``: a copy as of the last committed step. It is what heals a peer,
  what a checkpoint saves, what the digests and the divergence check read; only
  the training thread changes it, and only at a commit (after the state's guard),
  so torchft's quorum thread and DCP's background copy never see a forward's
  half-updated values.

Each step, after backward, the change of every buffer since the last commit
(``live - committed``; integer buffers as float64) is averaged within the group's
data-parallel ranks and then across groups in the step's gradient exchange (the
same all-reduce, or the same averaged tensor as the loss of a sharded group). At the
commit every group adds the same averaged change to the same committed value
(integers rounded), so the buffers are bitwise equal on every group and the forward
of a constant buffer (a change of exactly 0) leaves it exactly as it was. A step
that does not commit puts the live buffers back to the committed ones. A healing
group contributes zeros, as with gradients, receives the committed buffers of its
peer, and adds the same average.

Only persistent buffers are state: a non-persistent one (a rotary cache) is not in
the module's ``state_dict``, is filled by the workload's ``init`` on every rank and
must not change in training. Floating and integer (not bool) buffers are reconciled;
others are left out.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn


def persistent_buffers(models: Iterable[nn.Module]) -> dict[str, torch.Tensor]:
    """The persistent floating and integer buffers of `models` (a model, or this rank's
    pipeline stages, whose names are distinct), by name."""
    out: dict[str, torch.Tensor] = {}
    for model in models:
        for module_name, module in model.named_modules():
            for name, buf in module.named_buffers(recurse=False):
                if buf is None or name in module._non_persistent_buffers_set:
                    continue
                if buf.dtype == torch.bool or buf.is_complex():
                    continue
                out[f"{module_name}.{name}" if module_name else name] = buf
    return out


class Buffers:
    """The live and committed values of a rank's buffers (see the module docstring)."""

    def __init__(self, live: dict[str, torch.Tensor]) -> None:
        self.live = live
        self.committed = {name: t.detach().clone() for name, t in live.items()}

    def __bool__(self) -> bool:
        return bool(self.live)

    def deltas(self, dp_group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
        """Each buffer's change since the last commit, averaged over the ranks of
        `dp_group` (the group's data shards): floating ones in their dtype, integer ones as
        float64. The exchange across groups averages these tensors in place."""
        with torch.no_grad():
            out = [
                (t - self.committed[n]) if t.is_floating_point() else (t.double() - self.committed[n].double())
                for n, t in self.live.items()
            ]  # fmt: skip
            if dp_group is not None and out:
                for same in _by_dtype(out):
                    flat = torch.cat([d.reshape(-1) for d in same])
                    dist.all_reduce(flat, group=dp_group)  # gloo has no AVG
                    flat /= dist.get_world_size(dp_group)
                    _unflatten(flat, same)
        return out

    def commit(self, averaged: list[torch.Tensor]) -> None:
        """The step committed: add the groups' averaged change to the committed values
        (integers rounded) and make the live buffers those."""
        with torch.no_grad():
            for (name, t), delta in zip(self.live.items(), averaged, strict=True):
                committed = self.committed[name]
                if committed.is_floating_point():
                    committed.add_(delta)
                else:
                    committed.add_(delta.round().to(committed.dtype))
                t.copy_(committed)

    def restore(self) -> None:
        """The step did not commit: the live buffers go back to the committed ones."""
        with torch.no_grad():
            for name, t in self.live.items():
                t.copy_(self.committed[name])

    def perturb(self, amount: float) -> None:
        """Chaos (``buffers@N:perturb``): this rank's first floating buffer drifts."""
        with torch.no_grad():
            for name, t in self.live.items():
                if t.is_floating_point():
                    self.committed[name].add_(amount)
                    t.copy_(self.committed[name])
                    return


def _by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


def _unflatten(flat: torch.Tensor, into: list[torch.Tensor]) -> None:
    offset = 0
    for t in into:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def joined(part: torch.Tensor, deltas: list[torch.Tensor]) -> torch.Tensor:
    """`part` (a few float64 values) followed by every delta, as one float64 tensor:
    a sharded group averages its loss and its buffers' changes in one all-reduce."""
    return torch.cat([part.double().reshape(-1), *(d.double().reshape(-1) for d in deltas)])


def split(flat: torch.Tensor, deltas: list[torch.Tensor], head: int = 1) -> None:
    """The inverse of :func:`joined` for the deltas: copy them back from `flat[head:]`,
    where `head` is the length of the part before them."""
    _unflatten(flat[head:], deltas)
