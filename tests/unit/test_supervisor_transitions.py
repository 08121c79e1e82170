"""The supervisor driven through every move of its transition table with fake parts.

No etcd, no processes, no threads: the ranks, the etcd upkeep and the health monitor
are fakes that answer as the protocols of ``daemon/supervision/parts.py`` say, the
rest (waiting, the restart budget, after_stop, the health gate) is the real logic.
Each scenario sets up one situation, runs the state's handler once (as a tick does),
and checks the state the node moved to and what it asked of its parts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from daemon.accounting import Activity
from daemon.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from daemon.fencing import Fence
from daemon.node_state.progress import RankProgress
from daemon.node_state.states import TERMINAL, TRANSITIONS, State
from daemon.ranks.stop_cause import FENCED_OUT, JobEnded
from daemon.ranks.workers import ExitKind, GroupExit
from daemon.supervision.supervisor import HANDLERS
from tests.support.supervisor_fakes import (
    FAILED,
    LIGHTHOUSE,
    Node,
    completed,
    fenced_out_without_a_slot,
    handle,
    no_slot,
    node,
    nothing,
    past_backoff,
    pause,
    refused,
    running_ranks,
    stopped_by,
    verdict,
    waited_out,
)

STARTED = ["ranks_started", "set_state running"]  # what the upkeep is told of a first start


# (from, to, the situation, what the parts must have been asked, the exit code)
SCENARIOS: list[tuple[State, State, Callable[[Node], None], list[str], int]] = [
    (State.JOINING, State.CLAIMING, nothing, [], EXIT_OK),
    (State.JOINING, State.FAILED, refused, ["kill", "release"], EXIT_BAD_INPUT),
    (State.CLAIMING, State.WAITING, nothing, [], EXIT_OK),
    (State.CLAIMING, State.DONE, completed, ["release"], EXIT_OK),
    (State.WAITING, State.RUNNING, nothing, [f"start 0 {LIGHTHOUSE}", *STARTED], EXIT_OK),
    (State.WAITING, State.CLAIMING, no_slot, [], EXIT_OK),
    (State.WAITING, State.DONE, completed, ["release"], EXIT_OK),
    (State.WAITING, State.FAILED, waited_out, ["kill", "fail_job", "release"], EXIT_FAILED),
    (State.RUNNING, State.FENCED, pause, ["pause"], EXIT_OK),
    (State.RUNNING, State.STOPPING, running_ranks(FAILED), ["stop", "announce_failure"], 0),
    (
        State.RUNNING,
        State.DONE,
        running_ranks(GroupExit(ExitKind.COMPLETED, [0], "")),
        ["set_state completed", "release"],
        EXIT_OK,
    ),
    (State.FENCED, State.RUNNING, verdict(Fence.KEEP), ["resume"], EXIT_OK),
    (State.FENCED, State.STOPPING, verdict(Fence.DISCARD), ["stop"], EXIT_OK),
    (State.STOPPING, State.RESTARTING, stopped_by(FAILED), [], EXIT_OK),
    (State.STOPPING, State.WAITING, stopped_by(FENCED_OUT), [], EXIT_OK),
    (State.STOPPING, State.CLAIMING, fenced_out_without_a_slot, [], EXIT_OK),
    (State.STOPPING, State.DONE, stopped_by(JobEnded("completed elsewhere")), ["release"], 0),
    (
        State.STOPPING,
        State.FAILED,
        stopped_by(GroupExit(ExitKind.BAD_INPUT, [2], "train.steps must be positive")),
        ["kill", "release"],
        EXIT_BAD_INPUT,
    ),
    (State.RESTARTING, State.WAITING, past_backoff, [], EXIT_OK),
    (State.RESTARTING, State.CLAIMING, no_slot, [], EXIT_OK),
    (State.RESTARTING, State.DONE, completed, ["release"], EXIT_OK),
    (State.DRAINING, State.DONE, stopped_by(FENCED_OUT), ["release"], EXIT_OK),
]


def _label(s: tuple[State, State, Callable[[Node], None], list[str], int]) -> str:
    return f"{s[0].name}->{s[1].name}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[_label(s) for s in SCENARIOS])
def test_a_handler_moves_along_its_row(
    scenario: tuple[State, State, Callable[[Node], None], list[str], int],
) -> None:
    frm, to, setup, asked, code = scenario
    n = node(frm, "node.wait_timeout_s=1")
    setup(n)
    assert handle(n) == to
    assert n.ranks.calls + n.upkeep.calls == asked
    assert n.sup.exit_code == code


LIVE = [s for s in State if s not in TERMINAL and s != State.DRAINING]


@pytest.mark.parametrize("frm", LIVE, ids=[s.name for s in LIVE])
def test_a_sigterm_drains_every_live_state_in_the_next_tick(frm: State) -> None:
    n = node(frm)
    n.sup.request_drain()
    n.sup.tick()
    assert n.view.state == State.DRAINING
    assert "drain" in n.ranks.calls
    assert n.sup.exit_code == EXIT_OK


def test_a_lost_slot_stops_running_ranks_in_the_tick_that_finds_it() -> None:
    n = node(State.RUNNING)
    n.ranks.running = True
    n.upkeep.slot_lost = True
    n.sup.tick()
    assert n.view.state == State.STOPPING
    assert n.ranks.calls == ["stop"]


def test_the_scenarios_cover_every_move_of_the_table() -> None:
    table = {(frm, to) for frm, targets in TRANSITIONS.items() for to in targets}
    covered = {(frm, to) for frm, to, *_ in SCENARIOS} | {(s, State.DRAINING) for s in LIVE}
    assert covered == table


def test_a_tick_follows_a_failed_group_through_its_restart_without_waiting_a_tick_each() -> None:
    """STOPPING -> RESTARTING in one tick; once the backoff is over, WAITING -> RUNNING in
    the next: each handler that moves runs the next state's in the same tick."""
    n = node(State.STOPPING, "node.restart_backoff_s=0")
    stopped_by(FAILED)(n)
    n.sup.tick()
    assert n.view.state == State.RUNNING
    assert n.view.restarts == {"rank_exit": 1}
    assert n.ranks.calls == [f"start 0 {LIGHTHOUSE}"]
    assert n.upkeep.calls == STARTED


def test_each_state_tells_the_ranks_what_the_nodes_time_goes_to() -> None:
    """daemon.accounting: every state a tick passes through, and a spare's wait."""
    n = node(State.CLAIMING, "node.restart_backoff_s=0")
    n.upkeep.slot, n.upkeep.free_slot = None, None
    n.sup.tick()  # no seat free
    n.upkeep.free_slot = 0
    n.sup.tick()  # CLAIMING -> WAITING -> RUNNING: the ranks' steps say from here
    n.ranks.running, n.upkeep.must_pause = True, True
    n.upkeep.verdict = (Fence.HOLD, "etcd unreachable")
    n.sup.tick()  # the lease unconfirmed: the ranks pause
    n.upkeep.must_pause, n.upkeep.verdict = False, (Fence.KEEP, "etcd confirmed the lease")
    n.sup.tick()  # the fence lifts: the ranks go on
    n.ranks.outcome = FAILED
    n.sup.tick()  # a rank failed: its group is being stopped, for a restart
    stopped_by(FAILED)(n)
    n.ranks.outcome = None  # the new ranks run
    n.sup.tick()  # stopped, no backoff: restarted in the same tick (the time is a restart's)
    modes = [mode for mode, _ in itertools.groupby(n.ranks.modes)]
    assert modes == [
        Activity.WAITING,  # CLAIMING
        None,  # RUNNING (WAITING passed in the same tick as the claim)
        Activity.FENCED,
        None,
        Activity.RESTARTING,  # STOPPING, then RESTARTING
        Activity.WAITING,  # -> WAITING: ...
        None,  # ... -> RUNNING in one tick
    ]


def test_the_upkeep_is_handed_the_nodes_progress_as_a_value() -> None:
    n = node(State.RUNNING)
    n.ranks.running = True
    n.ranks.now = RankProgress(step=7, invalid_checkpoints=frozenset({"/ckpt/step-5"}))
    n.sup.tick()
    handed = n.upkeep.handed[-1]
    assert (handed.registered, handed.running, handed.step) == (True, True, 7)
    assert handed.invalid_checkpoints == {"/ckpt/step-5"}
    n.ranks.now = RankProgress(step=8)  # the rank threads go on: what was handed stays
    assert handed.step == 7 and n.sup.published.step == 7


def test_a_seat_claimed_in_a_tick_is_the_one_its_ranks_start_on_in_that_tick() -> None:
    n = node(State.CLAIMING)
    n.upkeep.slot, n.upkeep.free_slot = None, 3
    n.sup.tick()  # CLAIMING -> WAITING -> RUNNING: each handler reads the upkeep's report
    assert n.view.state == State.RUNNING
    assert n.ranks.calls == [f"start 3 {LIGHTHOUSE}"]
    assert n.sup.published.slot == 3


def test_a_rank_events_publish_shows_the_ranks_newest_progress() -> None:
    n = node(State.RUNNING)
    n.ranks.now = RankProgress(step=5, rank_error="rank 1 exited 1")
    n.sup.publish()  # as the node group calls it after folding an event in
    assert (n.sup.published.step, n.sup.published.last_error) == (5, "rank 1 exited 1")
    n.view.failure = "refused"  # the daemon's own failure comes first
    n.sup.publish()
    assert n.sup.published.last_error == "refused"


def test_the_exit_reads_what_the_ranks_said_as_they_ended() -> None:
    """An event folded in after the last tick began (the ranks' last words) is in the
    daemon's exit line."""
    n = node(State.FAILED)
    n.sup.exit_code = EXIT_FAILED
    n.ranks.now = RankProgress(rank_error="rank 0 exited 1")
    said: list[tuple[str, dict[str, Any]]] = []
    n.sup.log = SimpleNamespace(
        info=lambda event, **kw: said.append((event, kw)),
        warning=lambda event, **kw: said.append((event, kw)),
    )
    assert n.sup.run() == EXIT_FAILED
    exits = [fields for event, fields in said if event == "daemon_exit"]
    assert len(exits) == 1
    seconds = exits[0].pop("seconds")  # its life by activity (test_time_ledger.py)
    assert exits[0] == {"state": "failed", "code": 1, "error": "rank 0 exited 1"}
    assert set(seconds) == {a.value for a in Activity}


def test_a_completed_job_is_recorded_at_the_ranks_last_step() -> None:
    n = node(State.RUNNING)
    running_ranks(GroupExit(ExitKind.COMPLETED, [0], ""))(n)
    n.sup.progress = RankProgress(step=9)  # as the tick began
    n.ranks.now = RankProgress(step=10)  # the last step's event came in since
    n.sup.decide(HANDLERS[State.RUNNING](n.sup))
    assert n.view.state == State.DONE and n.upkeep.states == [("completed", 10)]
