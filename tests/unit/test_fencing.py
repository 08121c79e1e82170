"""The partition rule's decision after a fence (daemon.fencing.after_fence), branch by branch."""

from __future__ import annotations

from typing import Any

from daemon.after_stop import FENCED_OUT, after_stop
from daemon.fencing import AHEAD_BY, HOLD_S, Fence, after_fence, fence_margin_s
from daemon.restarts import RestartBudget
from daemon.states import State


def decide(
    step: int = 50,
    trained: int | None = 7,
    epoch: int | None = 7,
    nodes: dict[str, dict[str, Any]] | None = None,
    held_s: float = 0.0,
) -> Fence:
    verdict, why = after_fence(
        node_id="me",
        step=step,
        trained_epoch=trained,
        epoch=epoch,
        nodes=nodes or {},
        held_s=held_s,
    )
    assert why
    return verdict


def test_the_fence_comes_before_the_lease_can_expire() -> None:
    assert fence_margin_s(4) == 1.0 and fence_margin_s(10) == 2.0 and fence_margin_s(60) == 12.0


def test_the_same_leader_means_one_history() -> None:
    others = {"b": {"epoch": 7, "epoch_step": 0, "step": 10}}
    assert decide(epoch=7, trained=7, nodes=others) == Fence.KEEP


def test_no_leader_yet_holds_then_discards() -> None:
    assert decide(epoch=None) == Fence.HOLD
    assert decide(epoch=None, held_s=HOLD_S + 1) == Fence.DISCARD


def test_a_new_leader_without_commits_keeps_the_ranks() -> None:
    others = {
        "b": {"epoch": 9, "epoch_step": 40, "step": 40},  # under the new leader, no commit
        "c": {"epoch": 7, "epoch_step": 0, "step": 45},  # still under the old one
    }
    assert decide(epoch=9, nodes=others) == Fence.KEEP


def test_a_new_leader_ahead_heals_us_so_we_keep() -> None:
    ahead = {"b": {"epoch": 9, "epoch_step": 40, "step": 50 + AHEAD_BY}}
    assert decide(step=50, epoch=9, nodes=ahead) == Fence.KEEP


def test_a_new_leader_that_committed_but_is_behind_must_not_be_overridden() -> None:
    behind = {"b": {"epoch": 9, "epoch_step": 40, "step": 45}}
    assert decide(step=50, epoch=9, nodes=behind) == Fence.HOLD
    assert decide(step=50, epoch=9, nodes=behind, held_s=HOLD_S + 1) == Fence.DISCARD
    one_ahead = {"b": {"epoch": 9, "epoch_step": 40, "step": 51}}
    assert decide(step=50, epoch=9, nodes=one_ahead) == Fence.HOLD


def test_our_own_record_and_malformed_records_do_not_count() -> None:
    nodes: dict[str, dict[str, Any]] = {
        "me": {"epoch": 9, "epoch_step": 0, "step": 99},
        "b": {"epoch": "9", "epoch_step": None, "step": True},
    }
    assert decide(epoch=9, nodes=nodes) == Fence.KEEP


def test_a_discarded_group_restarts_outside_the_budget() -> None:
    budget = RestartBudget(1, 60, 1)
    common: dict[str, Any] = {
        "missing_groups": None, "budget": budget, "now": 0.0, "last_error": None,
    }  # fmt: skip
    v = after_stop(FENCED_OUT, slot_held=True, **common)
    assert v.state == State.WAITING and v.reason == "fenced"
    assert after_stop(FENCED_OUT, slot_held=False, **common).state == State.CLAIMING
    assert budget.total == 0 and budget.allows(0.0)
