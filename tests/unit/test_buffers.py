"""The buffers' arithmetic (trainer/ft/buffers.py) without processes: which buffers are
state, how a step's averaged change is committed, and what a step that fails leaves."""

from __future__ import annotations

import torch
from torch import nn

from trainer.chaos import Chaos, parse
from trainer.ft.buffers import Buffers, joined, persistent_buffers, split


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.register_buffer("cache", torch.ones(2), persistent=False)
        self.register_buffer("mask", torch.ones(2, dtype=torch.bool))
        self.register_buffer("constant", torch.full((2,), 0.1))


def test_only_persistent_float_and_integer_buffers_are_state() -> None:
    names = set(persistent_buffers([WithBuffers()]))
    assert names == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "constant"}


def _average(per_group: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """What the exchange across groups leaves in each group's deltas."""
    return [torch.stack(ds).mean(0) for ds in zip(*per_group, strict=True)]


def test_groups_commit_the_same_buffers_and_untouched_ones_stay_exact() -> None:
    torch.manual_seed(0)
    models = [WithBuffers() for _ in range(3)]
    groups = [Buffers(persistent_buffers([m])) for m in models]
    for step in range(5):
        for i, m in enumerate(models):  # each group's forward sees other items
            m.bn(torch.randn(4, 3) + i + step)
        averaged = _average([g.deltas() for g in groups])
        for g in groups:
            g.commit([a.clone() for a in averaged])
    first = groups[0].committed
    for g in groups:
        for name, value in g.committed.items():
            assert torch.equal(value, first[name]), name
            assert torch.equal(g.live[name], value), name
    assert torch.equal(first["constant"], torch.full((2,), 0.1))  # 3 x 0.1 / 3 would not be
    assert int(first["bn.num_batches_tracked"]) == 5
    assert not torch.equal(first["bn.running_mean"], torch.zeros(3))


def test_a_step_that_does_not_commit_leaves_the_buffers_as_committed() -> None:
    model = WithBuffers()
    buffers = Buffers(persistent_buffers([model]))
    model.bn(torch.randn(4, 3) + 5)
    assert not torch.equal(buffers.live["bn.running_mean"], torch.zeros(3))
    buffers.restore()
    assert torch.equal(buffers.live["bn.running_mean"], torch.zeros(3))
    assert int(buffers.live["bn.num_batches_tracked"]) == 0


def test_a_sharded_groups_loss_and_deltas_travel_in_one_tensor() -> None:
    deltas = [torch.ones(2), torch.zeros(3, dtype=torch.float64)]
    flat = joined(torch.tensor([0.5], dtype=torch.float64), deltas)
    assert flat.tolist() == [0.5, 1.0, 1.0, 0.0, 0.0, 0.0]
    split(flat * 2, deltas)
    assert deltas[0].tolist() == [2.0, 2.0] and deltas[0].dtype == torch.float32


def test_the_buffers_chaos_point_perturbs_the_first_float_buffer() -> None:
    assert [(f.point, f.action) for f in parse("buffers@7:perturb")] == [("buffers", "perturb")]
    chaos = Chaos("buffers@7:perturb", delay=0)
    chaos.begin_step(7)
    assert chaos.at("buffers")
    model = WithBuffers()
    buffers = Buffers(persistent_buffers([model]))
    buffers.perturb(1e-3)  # the root's own buffers come first
    assert torch.equal(buffers.live["constant"], torch.full((2,), 0.1) + 1e-3)
    assert torch.equal(buffers.committed["constant"], buffers.live["constant"])
    assert torch.equal(buffers.live["bn.running_mean"], torch.zeros(3))
