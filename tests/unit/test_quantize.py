"""trainer/ft/quantize.py: pseudo-gradients as int8 multiples of a row scale the groups
share, summed exactly (issue 55's quantised exchange)."""

from __future__ import annotations

import torch

from trainer.ft.quantize import dequantize, levels, quantize, row_maxima


def test_levels_leave_room_for_every_group_in_int8() -> None:
    assert [levels(g) for g in (1, 2, 3, 8, 127, 500)] == [127, 63, 42, 15, 1, 1]
    for groups in (1, 2, 3, 7, 16):
        assert groups * levels(groups) <= 127


def test_each_row_has_its_own_maximum_and_a_vector_is_one_row() -> None:
    matrix = torch.tensor([[1.0, -3.0], [0.5, 0.25], [0.0, 0.0]])
    vector, scalar = torch.tensor([-2.0, 1.0, 0.5]), torch.tensor(-0.75)
    got = row_maxima([matrix, vector, scalar])
    assert [t.tolist() for t in got] == [[3.0, 0.5, 0.0], [2.0], [0.75]]


def test_the_groups_sum_their_integers_and_every_group_reads_the_same_sum() -> None:
    """Three groups' tensors, the maxima as a MAX all-reduce would give them, int8 sums
    that cannot overflow, and a result within half a step per group of the true sum."""
    gen = torch.Generator().manual_seed(3)
    groups = [torch.randn(4, 5, generator=gen) * (1 + g) for g in range(3)]
    steps = levels(3)
    maxima = [torch.stack([m for (m,) in (row_maxima([t]) for t in groups)]).amax(0)]
    sent = [quantize([t], maxima, steps)[0] for t in groups]
    assert all(q.dtype == torch.int8 and int(q.abs().max()) <= steps for q in sent)
    total = torch.stack(sent).sum(0, dtype=torch.int8)  # as gloo sums int8
    assert torch.equal(total.to(torch.int64), torch.stack(sent).to(torch.int64).sum(0))
    out = torch.empty(4, 5)
    dequantize([total], maxima, steps, [out])
    exact = torch.stack(groups).sum(0)
    half_step = (maxima[0] / steps / 2).unsqueeze(-1)
    assert bool(((out - exact).abs() <= 3 * half_step + 1e-6).all())
    assert not torch.equal(out, exact)  # it is rounded: 8 bits, not 32


def test_a_row_of_zeros_stays_zero_and_the_largest_value_is_exact() -> None:
    t = torch.tensor([[0.0, 0.0], [2.0, -0.5]])
    maxima = row_maxima([t])
    (q,) = quantize([t], maxima, 63)
    assert q.tolist() == [[0, 0], [63, -16]]
    out = torch.empty(2, 2)
    dequantize([q], maxima, 63, [out])
    assert out[0].tolist() == [0.0, 0.0] and out[1, 0].item() == 2.0
