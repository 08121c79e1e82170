"""Issue 55: DiLoCo's outer step (trainer/ft/outer.py) against a reference worked out by
hand: groups of a one-layer model (two weights), plain SGD inside each group, two rounds
of two inner steps, the groups' pseudo-gradients averaged as the replication's all-reduce
averages them, Nesterov momentum across the rounds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.ft.outer import OuterStep

INNER_LR, OUTER_LR, MOMENTUM, H = 0.1, 0.7, 0.9, 2
START = [0.5, -0.25]
# Each group's (x, y) for its inner steps: a group trains its own share.
DATA = [
    [([1.0, 2.0], 1.0), ([0.5, -1.0], 0.0)],
    [([2.0, 0.0], -1.0), ([1.0, 1.0], 2.0)],
    [([-1.0, 1.0], 0.5), ([0.0, 3.0], 1.0)],
]


def reference(groups: int, rounds: int) -> list[float]:
    """The synced weights after `rounds`, in plain floats: inner SGD on 0.5 (w.x - y)^2,
    pseudo-gradient w0 - w, their mean, and torch's Nesterov rule (buffer b = mu b + g,
    the first b = g; step g + mu b)."""
    w0, buf = list(START), None
    for _ in range(rounds):
        moved = []
        for g in range(groups):
            w = list(w0)
            for x, y in DATA[g][:H]:
                err = w[0] * x[0] + w[1] * x[1] - y
                w = [w[i] - INNER_LR * err * x[i] for i in range(2)]
            moved.append([w0[i] - w[i] for i in range(2)])
        mean = [sum(m[i] for m in moved) / groups for i in range(2)]
        buf = mean if buf is None else [MOMENTUM * buf[i] + mean[i] for i in range(2)]
        w0 = [w0[i] - OUTER_LR * (mean[i] + MOMENTUM * buf[i]) for i in range(2)]
    return w0


def group_model() -> tuple[nn.Linear, torch.optim.SGD, OuterStep]:
    model = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([START], dtype=torch.float64))
    params = dict(model.named_parameters())
    return (
        model,
        torch.optim.SGD(model.parameters(), lr=INNER_LR),
        OuterStep.build(params, OUTER_LR, MOMENTUM),
    )


def inner_steps(
    model: nn.Linear, optimizer: torch.optim.SGD, data: list[tuple[list[float], float]]
) -> None:
    for x, y in data[:H]:
        optimizer.zero_grad()
        out = model(torch.tensor([x], dtype=torch.float64))
        (0.5 * (out.squeeze() - y) ** 2).backward()
        optimizer.step()


@pytest.mark.parametrize("groups", [2, 3])
def test_two_rounds_match_the_hand_worked_reference_on_every_group(groups: int) -> None:
    built = [group_model() for _ in range(groups)]
    for _ in range(2):
        for g, (model, optimizer, _) in enumerate(built):
            inner_steps(model, optimizer, DATA[g])
        moved = [outer.pseudo_gradients() for _, _, outer in built]
        averaged = [
            torch.stack([m[i] for m in moved]).sum(0) / groups for i in range(len(moved[0]))
        ]
        for _, _, outer in built:
            outer.apply([a.clone() for a in averaged])
    want = torch.tensor([reference(groups, 2)], dtype=torch.float64)
    for model, _, outer in built:
        assert torch.allclose(model.weight.detach(), want, rtol=0, atol=1e-12), (model.weight, want)
        assert torch.equal(outer.synced["weight"], model.weight.detach())
    first = built[0][0].weight.detach()
    assert all(torch.equal(m.weight.detach(), first) for m, _, _ in built)  # bit-identical


def test_a_failed_sync_rolls_back_to_the_rounds_start_and_keeps_the_momentum() -> None:
    model, optimizer, outer = group_model()
    inner_steps(model, optimizer, DATA[0])
    outer.apply(outer.pseudo_gradients())  # round 1 synced (one group alone)
    after_one = model.weight.detach().clone()
    momentum = outer.state_dict()["momentum"]["weight"].clone()
    inner_steps(model, optimizer, DATA[1])
    assert not torch.equal(model.weight.detach(), after_one)
    outer.roll_back()  # round 2's sync failed: not applied
    assert torch.equal(model.weight.detach(), after_one)
    assert torch.equal(outer.state_dict()["momentum"]["weight"], momentum)


def test_a_healing_group_takes_the_synced_weights_and_the_momentum() -> None:
    model, optimizer, outer = group_model()
    inner_steps(model, optimizer, DATA[0])
    outer.apply(outer.pseudo_gradients())
    fresh_model, _, fresh = group_model()
    # No outer step yet: the buffer is there (a checkpoint holds it), and zero.
    assert not fresh.state_dict()["momentum"]["weight"].any()
    assert fresh.tensors()["weight"] is fresh.state_dict()["momentum"]["weight"]
    fresh.load_state_dict(outer.state_dict())
    assert torch.equal(fresh_model.weight.detach(), model.weight.detach())
    # The next round goes alike on both: the momentum came along.
    for m, o in (
        (model, optimizer),
        (fresh_model, torch.optim.SGD(fresh_model.parameters(), lr=INNER_LR)),
    ):
        inner_steps(m, o, DATA[1])
    outer.apply(outer.pseudo_gradients())
    fresh.apply(fresh.pseudo_gradients())
    assert torch.equal(fresh_model.weight.detach(), model.weight.detach())
    with pytest.raises(RuntimeError, match="unknown parameters"):
        fresh.load_state_dict({"synced": outer.state_dict()["synced"], "momentum": {"bias": 1}})
