"""DiLoCo's outer step: what the replica groups agree on once a round (issue 55).

In the semi-synchronous mode each group takes ``sync_steps`` inner steps on its own (its
job optimizer, nothing crosses groups), then the groups sync: each one's pseudo-gradient
is how far its parameters moved from the round's start (``synced - live``); the groups
average them, the outer optimizer (SGD with Nesterov momentum, as the DiLoCo paper's)
takes one step on the synced parameters with that average as their gradient, and every
group starts the next round from the result. A sync that fails is not applied: each
group goes back to the round's start (:meth:`OuterStep.roll_back`).

:class:`OuterStep` holds the synced parameters and the outer optimizer for one rank;
for sharded parameters it holds this rank's shard, which lines up with the same rank's
shard in every other group (the layout is the job's). The average itself is the
replication's (a managed all-reduce across groups); this module is pure torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import SGD

from trainer.ft.state import as_param, copy_into, local


@dataclass
class OuterStep:
    live: dict[str, torch.Tensor]  # this rank's parameters (local shards), trained in place
    synced: dict[str, torch.Tensor]  # the same, as of each one's last sync
    optimizer: SGD  # over `synced`
    params: Mapping[str, torch.nn.Parameter]  # the parameters, for their layout
    # Streaming (ft.num_fragments > 1): the parameter names of each fragment, in sync
    # order, and the live parameters at the start of the current sync's steps, which a
    # failed sync goes back to (without fragments that is `synced`).
    fragments: tuple[tuple[str, ...], ...] = ()
    start: dict[str, torch.Tensor] | None = None

    @classmethod
    def build(
        cls,
        params: Mapping[str, torch.nn.Parameter],
        lr: float,
        momentum: float,
        fragments: int = 1,
    ) -> OuterStep:
        """Start from the parameters as they are (the first round's start). The momentum
        buffers exist from the start (zeros: SGD's first step makes them the gradient
        either way), so a checkpoint always holds them and a load copies into them."""
        live = {name: local(p.detach()) for name, p in params.items()}
        synced = {name: t.clone() for name, t in live.items()}
        nesterov = momentum > 0
        optimizer = SGD(list(synced.values()), lr=lr, momentum=momentum, nesterov=nesterov)
        if momentum > 0:
            for t in synced.values():
                optimizer.state[t]["momentum_buffer"] = torch.zeros_like(t)
        parts = cut({name: p.numel() for name, p in params.items()}, fragments)
        start = {name: t.clone() for name, t in live.items()} if fragments > 1 else None
        return cls(live, synced, optimizer, params, parts, start)

    def fragment(self, index: int | None) -> tuple[str, ...]:
        """The names synced together as fragment `index` (None: every parameter)."""
        return tuple(self.live) if index is None else self.fragments[index]

    @torch.no_grad()
    def mark(self) -> None:
        """The steps of a sync begin: what a failed sync goes back to (streaming only)."""
        if self.start is not None:
            for name, t in self.live.items():
                self.start[name].copy_(t)

    def synced_tensors(self) -> dict[str, torch.Tensor]:
        """The synced parameters as a checkpoint keeps them where they differ from the
        live ones at a sync (streaming: the fragments not synced there), else nothing."""
        if self.start is None:
            return {}
        return {name: as_param(self.params[name], t) for name, t in self.synced.items()}

    def tensors(self) -> dict[str, torch.Tensor]:
        """The momentum as a checkpoint keeps it: by parameter name, a DTensor laid out as
        its parameter where that is one (a load copies into the buffers)."""
        out = {}
        for name, t in self.synced.items():
            buf = self.optimizer.state.get(t, {}).get("momentum_buffer")
            if buf is None:
                continue
            out[name] = as_param(self.params[name], buf)
        return out

    def pseudo_gradients(self, index: int | None = None) -> list[torch.Tensor]:
        """How far this group moved since the last sync of fragment `index` (None: every
        parameter), per parameter: new tensors, synced less live (so that a step against
        it moves the synced parameters the same way)."""
        return [self.synced[name] - self.live[name] for name in self.fragment(index)]

    def apply(self, averaged: Sequence[torch.Tensor], index: int | None = None) -> None:
        """Fragment `index` synced (None: every parameter): one outer step on its synced
        parameters with the groups' average pseudo-gradient, and its live parameters set
        to the result; the others train on."""
        names = self.fragment(index)
        if len(averaged) != len(names):
            raise ValueError(f"{len(averaged)} pseudo-gradients for {len(names)} parameters")
        for name, g in zip(names, averaged, strict=True):
            self.synced[name].grad = g
        self.optimizer.step()  # a parameter without a gradient is left as it is
        with torch.no_grad():
            for name in names:
                self.synced[name].grad = None
                self.live[name].copy_(self.synced[name])

    @torch.no_grad()
    def rebase(self) -> None:
        """The live parameters are the round's start (a checkpoint without synced
        parameters of its own was loaded into them)."""
        for name, t in self.live.items():
            self.synced[name].copy_(t)
        self.mark()

    @torch.no_grad()
    def roll_back(self) -> None:
        """Every live parameter back to where the failed sync's steps began."""
        held = self.synced if self.start is None else self.start
        for name, t in self.live.items():
            t.copy_(held[name])

    @torch.no_grad()
    def reset(self) -> None:
        """Every live parameter set to the synced one (a heal: the peer's synced state)."""
        for name, t in self.live.items():
            t.copy_(self.synced[name])
        self.mark()

    def state_dict(self) -> dict[str, Any]:
        """What a healing group or a checkpoint needs: the synced parameters and the outer
        optimizer's momentum, by parameter name (plain tensors)."""
        by_param = self.optimizer.state
        momentum = {
            name: by_param[t]["momentum_buffer"]
            for name, t in self.synced.items()
            if by_param.get(t, {}).get("momentum_buffer") is not None
        }
        return {"synced": dict(self.synced), "momentum": momentum}

    @torch.no_grad()
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a peer's (or a checkpoint's) synced parameters and momentum, and start
        this group's round from them."""
        copy_into(self.synced, dict(state["synced"]), "the outer step's synced parameters")
        momentum: Mapping[str, torch.Tensor] = state["momentum"]
        unknown = set(momentum) - set(self.synced)
        if unknown:
            raise RuntimeError(f"outer momentum for unknown parameters: {sorted(unknown)[:5]}")
        for name, t in self.synced.items():
            held = self.optimizer.state.get(t, {}).get("momentum_buffer")
            if name not in momentum:
                self.optimizer.state.pop(t, None)
            elif held is not None and held.shape == momentum[name].shape:
                held.copy_(momentum[name])
            else:
                self.optimizer.state[t] = {"momentum_buffer": momentum[name].clone()}
        self.reset()


def cut(sizes: Mapping[str, int], parts: int) -> tuple[tuple[str, ...], ...]:
    """`parts` runs of the names in order, nearly equal in total size: a name goes to the
    part its middle falls in (a part may be empty when there are more parts than names)."""
    total = max(1, sum(sizes.values()))
    out: list[list[str]] = [[] for _ in range(parts)]
    seen = 0
    for name, size in sizes.items():
        out[min(parts - 1, (2 * seen + size) * parts // (2 * total))].append(name)
        seen += size
    return tuple(tuple(p) for p in out)
