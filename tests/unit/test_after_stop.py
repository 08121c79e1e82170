"""What a node does once its group has stopped: every branch of daemon.supervision.after_stop."""

from __future__ import annotations

from daemon.exits import EXIT_BAD_INPUT, EXIT_FAILED, RANK_BAD_INPUT, RANK_NO_QUORUM
from daemon.node_state.states import State
from daemon.ranks.stop_cause import JobEnded, NoState, StopCause, Unhealthy
from daemon.ranks.workers import ExitKind, GroupExit, _failure_kind
from daemon.supervision.after_stop import SLOT_LOST, StopDecision, after_stop
from daemon.supervision.restarts import RestartBudget


def _exit(kind: ExitKind, reason: str = "rank 1 exited with code 1") -> GroupExit:
    return GroupExit(kind, [1, None], reason)


def _decide(cause: StopCause, **kw: object) -> StopDecision:
    args: dict[str, object] = {
        "slot_held": True,
        "missing_groups": None,
        "budget": RestartBudget(max_restarts=3, window_s=60.0, backoff_s=1.0),
        "now": 100.0,
        "last_error": None,
    }
    args.update(kw)
    return after_stop(cause, **args)  # type: ignore[arg-type]


def test_a_lost_slot_waits_with_its_new_slot_or_claims_again() -> None:
    assert _decide(SLOT_LOST).state == State.WAITING
    assert _decide(SLOT_LOST, slot_held=False).state == State.CLAIMING


def test_a_reason_given_by_the_node_ends_it() -> None:
    v = _decide(JobEnded("the job completed elsewhere"))
    assert (v.state, v.reason) == (State.DONE, "the job completed elsewhere")


def test_a_start_over_the_user_would_rather_stop_fails_the_node_outside_the_budget() -> None:
    v = _decide(NoState(from_step=412))
    assert (v.state, v.code) == (State.FAILED, EXIT_FAILED)
    assert "step 412" in v.error and "job.on_no_state" in v.error


def test_ranks_stopped_from_outside_fail_the_node_with_exit_1() -> None:
    v = _decide(_exit(ExitKind.DRAINED))
    assert (v.state, v.code) == (State.FAILED, EXIT_FAILED)
    assert "outside the daemon" in v.error


def test_a_drain_agreed_in_a_group_that_spans_nodes_waits_for_the_drained_nodes_seat() -> None:
    v = _decide(_exit(ExitKind.DRAINED), spanning=True)
    assert (v.state, v.reason, v.code) == (State.WAITING, "group", 0)
    assert _decide(_exit(ExitKind.DRAINED), spanning=True, slot_held=False).state == State.CLAIMING


def test_bad_input_from_a_rank_fails_with_exit_2_and_the_ranks_message() -> None:
    v = _decide(_exit(ExitKind.BAD_INPUT), last_error="model.dim must be even")
    assert (v.state, v.code, v.error) == (State.FAILED, EXIT_BAD_INPUT, "model.dim must be even")


def test_missing_peers_wait_without_spending_the_restart_budget() -> None:
    budget = RestartBudget(max_restarts=1, window_s=60.0, backoff_s=1.0)
    v = _decide(_exit(ExitKind.FAILED), missing_groups="replica groups: 1 of 2", budget=budget)
    assert (v.state, v.reason) == (State.WAITING, "peers")
    assert budget.total == 0


def test_ranks_without_a_quorum_wait_for_peers_that_hold_a_slot() -> None:
    """Peers that hold a slot but whose ranks are still starting time the quorum out:
    the node waits for them again, and the budget (no restart here) is untouched."""
    budget = RestartBudget(max_restarts=0, window_s=60.0, backoff_s=1.0)
    late = GroupExit(ExitKind.NO_QUORUM, [RANK_NO_QUORUM], "rank 0 exited with code 75")
    for _ in range(3):
        v = _decide(late, budget=budget)
        assert (v.state, v.reason) == (State.WAITING, "peers")
    assert budget.total == 0


def test_exit_codes_say_whether_the_group_only_lacked_a_quorum() -> None:
    assert _failure_kind([RANK_NO_QUORUM]) == ExitKind.NO_QUORUM
    assert _failure_kind([RANK_NO_QUORUM, RANK_NO_QUORUM]) == ExitKind.NO_QUORUM
    # One rank that crashed otherwise makes it a crash; bad input stays bad input.
    assert _failure_kind([RANK_NO_QUORUM, 1]) == ExitKind.FAILED
    assert _failure_kind([-9, RANK_NO_QUORUM]) == ExitKind.FAILED
    assert _failure_kind([RANK_NO_QUORUM, RANK_BAD_INPUT]) == ExitKind.BAD_INPUT
    assert _failure_kind([1]) == ExitKind.FAILED


def test_a_crash_or_a_hang_restarts_with_backoff_until_the_budget_is_spent() -> None:
    budget = RestartBudget(max_restarts=2, window_s=60.0, backoff_s=1.0)
    first = _decide(_exit(ExitKind.FAILED), budget=budget, now=10.0)
    assert (first.state, first.reason, first.delay_s) == (State.RESTARTING, "rank_exit", 1.0)
    second = _decide(_exit(ExitKind.HUNG, "rank 0 made no progress"), budget=budget, now=11.0)
    assert (second.state, second.reason, second.delay_s) == (State.RESTARTING, "hang", 2.0)
    third = _decide(_exit(ExitKind.FAILED), budget=budget, now=12.0, last_error="boom")
    assert (third.state, third.code) == (State.FAILED, EXIT_FAILED)
    assert third.error == "gave up after 2 restarts in 60s; last error: boom"
    # The window slides: once the old restarts are out of it, restarting is allowed again.
    assert _decide(_exit(ExitKind.FAILED), budget=budget, now=100.0).state == State.RESTARTING


def test_an_unhealthy_node_that_made_way_waits_to_give_its_seat_back_outside_the_budget() -> None:
    budget = RestartBudget(max_restarts=0, window_s=60.0, backoff_s=1.0)
    v = _decide(Unhealthy("clock: off"), budget=budget)
    assert (v.state, v.reason, v.detail) == (State.WAITING, "", "clock: off")
    assert _decide(Unhealthy("clock: off"), slot_held=False).state == State.CLAIMING
