"""The divergence vote: digests, one-hot votes and the verdict each group reads (pure logic;
the exchange itself is torchft's managed all-reduce, tested in tests/integration/test_divergence.py)."""

from __future__ import annotations

import pytest
import torch

from trainer.ft import divergence
from trainer.ft.divergence import Tally, local_digest, verdict, votes


def average(*ballots: torch.Tensor) -> torch.Tensor:
    """What the managed all-reduce (AVG over the participating groups) returns."""
    return torch.stack(ballots).mean(dim=0)


def params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 8, generator=g), torch.randn(8, generator=g).to(torch.bfloat16)]


def test_the_digest_sees_every_bit_and_where_it_is() -> None:
    base = local_digest(params())
    assert int(base) == int(local_digest(params()))
    for index in range(2):
        flipped = params()
        bits = flipped[index].view(torch.int16 if index else torch.int32)
        bits.view(-1)[3] ^= 1  # the lowest bit of one element
        assert int(local_digest(flipped)) != int(base)
    swapped = params()
    swapped[0].view(-1)[[0, 1]] = swapped[0].view(-1)[[1, 0]]
    assert int(local_digest(swapped)) != int(base)


def test_equal_groups_agree() -> None:
    d = local_digest(params())
    ballots = [votes(d, writer=i == 0) for i in range(3)]
    for mine in ballots:
        seen = verdict(mine, average(*ballots))
        assert seen == Tally(share=1.0, with_writer=True) and not seen.diverged


def test_the_one_group_that_differs_is_the_minority_even_as_the_writer() -> None:
    good, bad = local_digest(params()), local_digest(params(seed=1))
    ballots = [votes(bad, writer=True), votes(good, writer=False), votes(good, writer=False)]
    averaged = average(*ballots)
    first, second, third = (verdict(b, averaged) for b in ballots)
    assert first.diverged and first.minority
    assert second.diverged and not second.minority and not second.with_writer
    assert third == second


def test_a_tie_goes_to_the_writer_group() -> None:
    a, b = local_digest(params()), local_digest(params(seed=1))
    ballots = [votes(a, writer=True), votes(b, writer=False)]
    averaged = average(*ballots)
    writer, other = (verdict(x, averaged) for x in ballots)
    assert writer.share == other.share == 0.5
    assert not writer.minority and other.minority


def test_a_healing_group_contributes_nothing() -> None:
    """torchft zeroes a non-participating group's tensor and averages over participants."""
    d = local_digest(params())
    ballots = [votes(d, writer=True), votes(d, writer=False)]
    averaged = (ballots[0] + ballots[1] + torch.zeros_like(ballots[0])) / 2
    assert not verdict(ballots[1], averaged).diverged


def test_the_digest_is_the_same_folded_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    shards = params()
    whole = int(local_digest(shards))
    monkeypatch.setattr(divergence, "CHUNK", 5)
    assert int(local_digest(shards)) == whole
