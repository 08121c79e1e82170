"""Issue 55, streaming DiLoCo (``ft.num_fragments``): the parameters cut into fragments
(trainer/ft/outer.py) and what a sync says about items a fragment never saw
(trainer/data/sync_ledger.py)."""

from __future__ import annotations

import torch
from torch import nn

from trainer.data.shares import Quorum
from trainer.data.sync_ledger import Added, Ledger, settle, slots
from trainer.ft.outer import OuterStep, cut


def test_fragments_are_runs_in_model_order_of_nearly_equal_size() -> None:
    sizes = {"a": 10, "b": 10, "c": 30, "d": 10, "e": 40}
    assert cut(sizes, 1) == (("a", "b", "c", "d", "e"),)
    assert cut(sizes, 2) == (("a", "b", "c"), ("d", "e"))
    assert cut(sizes, 3) == (("a", "b"), ("c", "d"), ("e",))
    assert cut({"w": 6, "b": 1}, 2) == (("w",), ("b",))
    assert cut({"w": 1}, 3) == ((), ("w",), ())  # more fragments than tensors: some empty


def two_tensors() -> tuple[nn.Linear, OuterStep]:
    model = nn.Linear(2, 1).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.fill_(3.0)
    return model, OuterStep.build(dict(model.named_parameters()), 1.0, 0.0, fragments=2)


def test_a_fragment_sync_moves_its_own_parameters_and_leaves_the_others_training() -> None:
    model, outer = two_tensors()
    assert outer.fragment(0) == ("weight",) and outer.fragment(1) == ("bias",)
    with torch.no_grad():
        model.weight.sub_(0.5)
        model.bias.sub_(0.25)
    (moved,) = outer.pseudo_gradients(0)
    assert moved.tolist() == [[0.5, 0.5]]
    outer.apply([moved * 2], 0)  # as if the other group moved three times as far
    assert model.weight.tolist() == [[0.0, 1.0]]  # synced, and the live weight with it
    assert model.bias.item() == 2.75  # still this group's own
    assert outer.synced["bias"].item() == 3.0


def test_a_failed_sync_goes_back_to_where_its_steps_began_and_a_heal_to_the_synced() -> None:
    model, outer = two_tensors()
    with torch.no_grad():
        model.bias.sub_(1.0)  # trained before this sync's steps began
    outer.mark()
    with torch.no_grad():
        model.weight.add_(5.0)
        model.bias.add_(5.0)
    outer.roll_back()
    assert model.weight.tolist() == [[1.0, 2.0]] and model.bias.item() == 2.0
    outer.reset()
    assert model.bias.item() == 3.0
    assert set(outer.synced_tensors()) == {"weight", "bias"}  # a checkpoint keeps them
    _, whole = two_tensors()
    assert (
        OuterStep.build(dict(nn.Linear(2, 1).named_parameters()), 1.0, 0.0).synced_tensors() == {}
    )
    assert whole.fragment(None) == ("weight", "bias")


def exchange(groups: int, adds: dict[int, tuple[float, int]]) -> list[float]:
    """The summed exchange of a sync: round rank -> (mark, ledger depth)."""
    which = [0.0] * slots(groups)
    for rank, (mark, depth) in adds.items():
        which[rank], which[groups + rank] = mark, float(depth)
    return which


def test_a_group_gone_after_adding_is_told_partly_lost_for_the_fragment_synced_next() -> None:
    """Three groups (marks 11, 22, 33), syncs of 30 items, two fragments: the group of
    mark 33 added at step 10 and is gone at step 20; its share of step 10 never reaches
    the fragment synced at step 20, and its share of step 20 is wholly lost."""
    items10, items20 = range(30, 60), range(60, 90)
    ledger = Ledger(keep=1)
    first = settle(
        exchange(3, {0: (11, 0), 1: (22, 0), 2: (33, 0)}), 3, Quorum(3, 0), items10, ledger
    )
    assert first.lost == () and first.partly == () and first.tells
    ledger = ledger.after(first.added)
    assert ledger.added == (Added({11.0: range(30, 40), 22.0: range(40, 50), 33.0: range(50, 60)}),)
    second = settle(exchange(3, {0: (11, 1), 1: (22, 1)}), 3, Quorum(3, 1), items20, ledger)
    assert second.lost == (range(80, 90),)
    assert second.partly == (range(50, 60),)
    assert not second.tells  # round rank 0 says it
    # A group that came back (a new mark) is not the one that went.
    back = settle(
        exchange(3, {0: (11, 1), 1: (22, 1), 2: (44, 0)}), 3, Quorum(3, 0), items20, ledger
    )
    assert back.lost == () and back.partly == (range(50, 60),)
    # The record keeps num_fragments - 1 syncs (none without fragments).
    assert len(ledger.after(second.added).after(back.added).added) == 1
    assert Ledger(keep=0).after(second.added).added == ()


def test_the_group_whose_record_reaches_furthest_back_tells() -> None:
    ledger = Ledger(keep=3)
    shown = settle(exchange(2, {0: (5, 1), 1: (6, 3)}), 2, Quorum(2, 1), range(0, 8), ledger)
    assert shown.tells
    assert not settle(
        exchange(2, {0: (5, 1), 1: (6, 3)}), 2, Quorum(2, 0), range(0, 8), ledger
    ).tells
