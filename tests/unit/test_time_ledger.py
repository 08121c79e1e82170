"""The node's time ledger (daemon/accounting/ledger.py): each transition of the node's
state and each kind of rank event credits the right activity, and the activities always
add up to the ledger's life."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.accounting import ORDER, Activity, Ledger, goodput
from daemon.node_state.progress import MOST_LAG_S, ProgressFold, RankProgress, fold, logged_ago
from daemon.node_state.states import State
from daemon.supervision.reports import STATE_TIME, time_goes_to
from trainer.contracts import rank_events as events

A = Activity


def spent(ledger: Ledger, now: float) -> dict[Activity, float]:
    """The non-zero totals, rounded (the float sums are not exact)."""
    return {a: round(s, 6) for a, s in ledger.totals(now).items() if round(s, 6)}


def step(name: str = events.STEP_ITEMS, step: int = 5, **times: float) -> dict[str, object]:
    return {"event": name, "step": step, **times}


def running(at: float = 10.0, stepped: bool = True) -> Ledger:
    """A ledger whose node waited 10 s, whose ranks run from `at` (and have stepped)."""
    ledger = Ledger.begin(0.0).switch(at, None)
    return ledger if not stepped else ledger.event(at, step(step_seconds=0.0), 0)


def test_a_fixed_mode_counts_its_open_interval_and_each_switch_closes_it() -> None:
    ledger = Ledger.begin(0.0)
    assert spent(ledger, 3.0) == {A.WAITING: 3.0}
    ledger = ledger.switch(3.0, A.SPARE).switch(7.0, A.WAITING).switch(8.0, A.FENCED)
    assert spent(ledger, 10.0) == {A.WAITING: 4.0, A.SPARE: 4.0, A.FENCED: 2.0}
    assert ledger.switch(9.0, A.FENCED) is ledger.switch(9.0, A.FENCED).switch(9.5, A.FENCED)


def test_a_step_in_flight_is_counted_only_when_it_ends() -> None:
    ledger = running(10.0)
    assert spent(ledger, 12.0) == {A.WAITING: 10.0}  # the step's 2 s wait for its end
    assert ledger.in_flight(12.0) == 2.0
    ended = ledger.event(12.0, step(step_seconds=2.0), 0)
    assert spent(ended, 12.0) == {A.WAITING: 10.0, A.TRAINING: 2.0}
    assert ended.in_flight(12.0) == 0.0


def test_the_ranks_start_until_their_first_step_began_is_restarting() -> None:
    ledger = Ledger.begin(0.0).switch(10.0, None)  # spawn, build, load: 6 s, then a 1 s step
    ledger = ledger.event(17.0, step(step_seconds=1.0, quorum_s=0.25), 0)
    assert spent(ledger, 17.0) == {
        A.WAITING: 10.0,
        A.RESTARTING: 6.0,
        A.QUORUM: 0.25,
        A.TRAINING: 0.75,
    }
    # From then on the loop's own time between steps is the steps'.
    ledger = ledger.event(18.5, step(step=6, step_seconds=1.0), 0)
    assert spent(ledger, 18.5)[A.TRAINING] == 2.25


def test_the_loops_save_and_evaluation_between_steps_are_theirs() -> None:
    ledger = running(10.0).event(
        14.0, step(step_seconds=1.0, checkpoint_s=2.0, eval_s=0.5, quorum_s=0.1), 0
    )
    assert spent(ledger, 14.0) == {
        A.WAITING: 10.0,
        A.CHECKPOINT: 2.0,
        A.EVALUATING: 0.5,
        A.TRAINING: 0.5 + 0.9,  # the loop's other 0.5 s between steps, and the step's 0.9
        A.QUORUM: 0.1,
    }


def test_what_a_rank_says_it_spent_never_exceeds_the_interval() -> None:
    ledger = running(10.0).event(11.0, step(step_seconds=0.5, checkpoint_s=3.0, quorum_s=9.0), 0)
    assert spent(ledger, 11.0) == {A.WAITING: 10.0, A.CHECKPOINT: 0.5, A.QUORUM: 0.5}


def test_skipped_and_abandoned_steps_are_discarded() -> None:
    skipped = running(10.0).event(12.0, step(events.STEP_SKIPPED, step_seconds=2.0), 0)
    assert spent(skipped, 12.0) == {A.WAITING: 10.0, A.DISCARDED: 2.0}
    skipped = running(10.0).event(13.0, step(events.STEP_SKIPPED, step_seconds=2, quorum_s=1), 0)
    assert spent(skipped, 13.0) == {A.WAITING: 10, A.TRAINING: 1, A.QUORUM: 1, A.DISCARDED: 1}
    abandoned = running(10.0).event(15.0, {"event": events.STEP_ABANDONED, "step": 6}, 0)
    assert spent(abandoned, 15.0) == {A.WAITING: 10.0, A.DISCARDED: 5.0}


def test_a_committed_step_the_job_had_reached_before_is_redone_so_discarded() -> None:
    ledger = running(10.0)
    assert spent(ledger.event(11.0, step(step=7, step_seconds=1.0), 7), 11.0)[A.DISCARDED] == 1.0
    assert A.DISCARDED not in spent(ledger.event(11.0, step(step=8, step_seconds=1.0), 7), 11.0)
    logged = step(events.TRAIN_STEP, step=3, step_seconds=1.0)
    assert spent(ledger.event(11.0, logged, 7), 11.0)[A.DISCARDED] == 1.0


def test_a_heal_is_healing_and_the_steps_quorum_wait_after_it_what_remains() -> None:
    ledger = Ledger.begin(0.0).switch(10.0, None)  # start 4 s; the first step's heal: 3 s
    healed = ledger.event(17.0, {"event": events.HEAL_DONE, "step": 40, "seconds": 3.0}, 0)
    assert spent(healed, 17.0) == {A.WAITING: 10.0, A.RESTARTING: 4.0, A.HEALING: 3.0}
    # The step went on 2 s: it was 5 s long and waited 3.5 s for its quorum (the heal's 3
    # in it), so 0.5 s more of quorum, then 1.5 s of the step.
    ended = healed.event(19.0, step(step=41, step_seconds=5.0, quorum_s=3.5), 0)
    assert spent(ended, 19.0) == {
        A.WAITING: 10.0,
        A.RESTARTING: 4.0,
        A.HEALING: 3.0,
        A.QUORUM: 0.5,
        A.TRAINING: 1.5,
    }


def test_a_step_in_flight_when_the_ranks_stop_for_a_restart_is_lost() -> None:
    stopped = running(10.0).switch(13.0, A.RESTARTING)
    assert spent(stopped, 15.0) == {A.WAITING: 10.0, A.DISCARDED: 3.0, A.RESTARTING: 2.0}
    # Their last words while they stop are the restart's time.
    assert stopped.event(14.0, step(step_seconds=4.0), 0) is stopped


def test_a_fence_holds_the_step_in_flight_and_its_end_says_what_it_was() -> None:
    fenced = running(10.0).switch(11.0, A.FENCED)
    assert spent(fenced, 13.0) == {A.WAITING: 10.0, A.FENCED: 2.0}
    assert fenced.in_flight(13.0) == 1.0  # the step's second before the fence is held
    resumed = fenced.switch(13.0, None)
    assert resumed.stepped  # not a start: the time before the next step end is a step's
    ended = resumed.event(14.0, step(step_seconds=4.0), 0)
    assert spent(ended, 14.0) == {A.WAITING: 10.0, A.TRAINING: 2.0, A.FENCED: 2.0}
    # It did not commit: the time it ran before the fence went with it.
    skipped = resumed.event(14.0, step(events.STEP_SKIPPED, step_seconds=4.0), 0)
    assert spent(skipped, 14.0) == {A.WAITING: 10.0, A.DISCARDED: 2.0, A.FENCED: 2.0}
    # The fence's verdict stops the ranks: the held step is lost.
    lost = fenced.switch(13.0, A.RESTARTING)
    assert spent(lost, 14.0) == {A.WAITING: 10, A.FENCED: 2, A.DISCARDED: 1, A.RESTARTING: 1}
    assert lost.in_flight(14.0) == 0.0
    assert not running(10.0).switch(11.0, A.RESTARTING).switch(12.0, None).stepped


def test_a_drain_counts_the_step_in_flight_as_a_step() -> None:
    drained = running(10.0).switch(12.0, A.DRAINING)
    assert spent(drained, 13.0) == {A.WAITING: 10.0, A.TRAINING: 2.0, A.DRAINING: 1.0}


def test_after_the_ranks_last_step_the_jobs_end_is_draining() -> None:
    """The final save, the digest and the ranks' exit are no step: before train_done
    said so, the switch at the job's end counted them as the step in flight."""
    stepped = running(10.0).event(12.0, step(step_seconds=2.0), 0)
    done = stepped.event(15.0, {"event": events.TRAIN_DONE, "step": 5}, 0)  # a 3 s save
    assert spent(done, 16.0) == {A.WAITING: 10.0, A.TRAINING: 2.0, A.DRAINING: 4.0}
    assert done.in_flight(16.0) == 0.0
    # the supervisor's ticks, the ranks not yet exited, still say they run: still draining
    assert done.switch(15.5, None) is done
    ended = done.switch(16.5, A.DRAINING)
    assert spent(ended, 17.0) == {A.WAITING: 10.0, A.TRAINING: 2.0, A.DRAINING: 5.0}
    # later rank events change nothing; a drained group's last words read the same
    assert done.event(16.0, step(step=6, step_seconds=1.0), 0) is done
    stopped = stepped.event(15.0, {"event": events.TRAIN_STOPPED, "step": 5}, 0)
    assert spent(stopped, 16.0) == spent(done, 16.0)


def test_goodput_is_trainings_share() -> None:
    assert goodput(dict.fromkeys(ORDER, 0.0)) is None
    assert goodput({A.TRAINING: 3.0, A.QUORUM: 1.0}) == 0.75


def test_every_state_has_an_activity_and_only_running_defers_to_the_ranks() -> None:
    assert set(STATE_TIME) == set(State)
    assert [s for s in State if time_goes_to(s, False) is None] == [State.RUNNING]
    assert time_goes_to(State.CLAIMING, True) == A.SPARE
    assert time_goes_to(State.WAITING, True) == A.SPARE
    assert time_goes_to(State.STOPPING, True) == A.RESTARTING


def test_a_step_read_late_ends_where_the_rank_logged_it() -> None:
    """The daemon's reader got to the line 0.3 s after the rank logged it: the step closes
    at the rank's time, and the 0.3 s are the next step's (its quorum wait, here)."""
    wall = 1_796_646_725.0
    stamp = datetime.fromtimestamp(wall - 0.3, UTC).isoformat().replace("+00:00", "Z")
    p = RankProgress(ledger=running(10.0))
    late = step(events.TRAIN_STEP, step=6, step_seconds=1.0) | {"time": stamp}
    p, _ = fold(p, late, "n", 11.3, wall)
    assert p.ledger.since == pytest.approx(11.0)
    assert spent(p.ledger, 11.0) == {A.WAITING: 10.0, A.TRAINING: 1.0}
    p, _ = fold(p, step(events.TRAIN_STEP, step=7, step_seconds=1.0, quorum_s=0.5), "n", 12.0)
    assert spent(p.ledger, 12.0) == {A.WAITING: 10.0, A.TRAINING: 1.5, A.QUORUM: 0.5}


@pytest.mark.parametrize(
    ("stamp", "ago"),
    [(None, 0.0), ("not a time", 0.0), (-2.0, 2.0), (-60.0, MOST_LAG_S), (1.0, 0.0)],
)
def test_how_long_ago_a_rank_logged_an_event(stamp: float | str | None, ago: float) -> None:
    wall = 1_796_646_725.0
    if isinstance(stamp, float):
        stamp = datetime.fromtimestamp(wall + stamp, UTC).isoformat()
    assert logged_ago({"event": "x", "time": stamp}, wall) == pytest.approx(ago)
    assert logged_ago({"event": "x", "time": stamp}, 0.0) == 0.0  # no wall clock given


def test_the_fold_takes_a_start_over_as_redone_steps() -> None:
    """The fold hands the ledger the job's reached step: after a cold restart from step 0
    (the job had reached 30), steps up to 30 are trained again."""
    p = RankProgress(ledger=Ledger.begin(0.0).switch(1.0, None), redo_through=30)
    p, lost = fold(p, step(events.TRAIN_STEP, step=1, step_seconds=1.0), "n", 2.0)
    assert lost is None and spent(p.ledger, 2.0) == {A.WAITING: 1.0, A.DISCARDED: 1.0}
    p, _ = fold(p, step(step=31, step_seconds=1.0), "n", 3.0)
    assert spent(p.ledger, 3.0)[A.TRAINING] == 1.0


def test_what_was_reached_before_a_start_is_the_highest_step_the_node_knows() -> None:
    progress = ProgressFold("n")
    progress.reached(None)  # etcd unread at the first start
    for n in range(1, 41):
        progress.track(step(step=n))
    progress.reached(30)  # etcd's reached step lags the node's own (written every 10 s)
    assert (progress.snapshot().reached, progress.snapshot().redo_through) == (30, 40)
    progress.track(step(step=11))  # a cold restart from step 10's checkpoint
    progress.reached(None)
    assert progress.snapshot().redo_through == 40


MODES = st.sampled_from([None, *ORDER])
EVENTS = st.fixed_dictionaries(
    {
        "event": st.sampled_from(
            [
                events.STEP_ITEMS,
                events.TRAIN_STEP,
                events.STEP_SKIPPED,
                events.STEP_ABANDONED,
                events.HEAL_DONE,
                events.CHECKPOINT_SAVED,
                events.TRAIN_DONE,
                events.TRAIN_STOPPED,
            ]
        ),
        "step": st.integers(0, 50),
    },
    optional={
        name: st.floats(0, 20)
        for name in ("seconds", "step_seconds", "quorum_s", "checkpoint_s", "eval_s")
    },
)


@given(st.lists(st.tuples(st.floats(0, 5), st.one_of(MODES, EVENTS)), max_size=40))
def test_the_activities_always_add_up_to_the_ledgers_life(
    moves: list[tuple[float, object]],
) -> None:
    ledger, now = Ledger.begin(100.0), 100.0
    for gap, move in moves:
        now += gap
        if isinstance(move, dict):
            ledger = ledger.event(now, move, 20)
        else:
            assert move is None or isinstance(move, Activity)
            ledger = ledger.switch(now, move)
        totals = ledger.totals(now)
        assert min(totals.values()) >= 0.0
        assert sum(totals.values()) + ledger.in_flight(now) == pytest.approx(now - 100.0)
