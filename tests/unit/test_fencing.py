"""The partition rule's decision after a fence (daemon.fencing.rules.after_fence), branch by branch."""

from __future__ import annotations

import time
from typing import Any

from daemon.coordination.job_view import JobView
from daemon.coordination.lease_timing import fence_margin_s, refresh_every_s
from daemon.fencing import AHEAD_BY, HOLD_S, Fence, FenceJudge, after_fence, job_moved_on
from daemon.node_state.progress import ProgressFold
from daemon.node_state.states import State
from daemon.supervision.after_stop import FENCED_OUT, after_stop
from daemon.supervision.restarts import RestartBudget


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


def test_nobody_went_on_without_us_so_the_ranks_resume() -> None:
    """An etcd outage: every group was paused together, at most one step apart."""
    together = {
        "b": {"epoch": 7, "epoch_step": 0, "step": 51},
        "c": {"epoch": 7, "epoch_step": 0, "step": 49},
    }
    assert decide(step=50, epoch=7, trained=7, nodes=together) == Fence.KEEP
    # A new leader (the old key expired with etcd) under which nothing was committed yet.
    fresh = {"b": {"epoch": 9, "epoch_step": 51, "step": 51}}
    assert decide(step=50, epoch=9, trained=7, nodes=fresh) == Fence.KEEP


def test_no_leader_yet_holds_then_discards() -> None:
    assert decide(epoch=None) == Fence.HOLD
    assert decide(epoch=None, held_s=HOLD_S + 1) == Fence.DISCARD


def test_groups_that_went_on_without_us_are_healed_from_not_rejoined() -> None:
    ahead = {"b": {"epoch": 7, "epoch_step": 0, "step": 50 + AHEAD_BY}}
    assert decide(step=50, epoch=7, trained=7, nodes=ahead) == Fence.DISCARD
    assert decide(step=50, epoch=9, trained=7, nodes=ahead) == Fence.DISCARD


def test_commits_under_a_new_leader_must_not_be_overridden_even_from_behind() -> None:
    """A cut-off leader that committed alone before its fence may be ahead of the groups
    that went on under the new leader: its state must not be what they heal from."""
    behind = {"b": {"epoch": 9, "epoch_step": 40, "step": 45}}
    assert decide(step=50, epoch=9, trained=7, nodes=behind) == Fence.DISCARD
    assert decide(step=50, epoch=7, trained=7, nodes=behind) == Fence.KEEP  # same leader


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


def test_the_round_refreshes_the_lease_at_most_once_a_second_and_well_before_the_fence() -> None:
    assert refresh_every_s(10) == 1.0 and refresh_every_s(300) == 1.0
    assert refresh_every_s(2) == 0.25  # the smallest lease: every round, as before
    for ttl in range(2, 301):
        # Four refreshes fit between a confirmation and the moment the node would fence.
        assert 0 < 4 * refresh_every_s(ttl) <= ttl - fence_margin_s(ttl)


def test_what_the_job_recorded_outranks_the_records_of_who_is_left() -> None:
    """The majority finished and left: no records, but the job's state and newest
    checkpoint say it went on (issue 34: a fenced minority's save became the final one)."""
    completed = {"state": "completed", "step": 2500}
    assert job_moved_on(2498, completed, None) == (
        "the job completed (at step 2500) while we were fenced"
    )
    assert job_moved_on(2498, {"state": "running", "step": 0}, {"step": 2500}) is not None
    assert job_moved_on(2498, {"state": "running", "step": 0}, {"step": 2499}) is None
    assert job_moved_on(2498, None, {"step": 2000}) is None
    assert job_moved_on(2498, None, None) is None


def test_a_checkpoint_our_ranks_found_corrupt_is_no_sign_the_job_went_on() -> None:
    """Random faults, seed 673522: step-450 was corrupted, the job resumed from step 400, and
    etcd still named step 450 as the newest checkpoint. An etcd outage then fenced every
    node, and each discarded its ranks at step 427 for "a checkpoint of step 450": every
    group restarted, loaded step 400 and trained 401-427 again. A checkpoint that this
    node's ranks refused to load (checkpoint_invalid) is where the job went back from."""
    corrupt = {"step": 450, "path": "/ckpt/run-1/step-450"}
    assert job_moved_on(427, None, corrupt) is not None
    assert job_moved_on(427, None, corrupt, {"/ckpt/run-1/step-450"}) is None
    assert job_moved_on(427, None, corrupt, {"/ckpt/run-1/step-400"}) is not None
    ranks = ProgressFold("me")
    ranks.track({"event": "checkpoint_invalid", "path": "/ckpt/run-1/step-450"})
    assert ranks.snapshot().invalid_checkpoints == {"/ckpt/run-1/step-450"}
    # Saved again at the same step after the resume: a good checkpoint, trusted again.
    ranks.track({"event": "checkpoint_saved", "step": 450, "path": "/ckpt/run-1/step-450"})
    assert ranks.snapshot().invalid_checkpoints == set()


def test_a_fenced_node_never_resumes_into_a_completed_job() -> None:
    """Lease kept or lost: a job that completed meanwhile discards the paused ranks, once
    the job has been read since etcd answered."""
    for lease_lost in (False, True):
        judge = FenceJudge("me", trained_epoch=7)
        judge.fence(2498)
        if lease_lost:
            judge.renewed()
        judge.answered()
        job = JobView({}, {}, None, None, None, {"state": "completed", "step": 2500}, None, 9)
        assert judge.verdict(job, 2498, snapshot_at=0.0, shown=None)[0] == Fence.HOLD
        verdict, why = judge.verdict(job, 2498, snapshot_at=time.monotonic() + 1, shown=None)
        assert verdict == Fence.DISCARD and "completed" in why, (lease_lost, why)


def test_a_new_leader_seen_after_a_gap_longer_than_the_leader_lease_restarts_the_ranks() -> None:
    """With the leader on a 2 s lease another node may lead before a cut-off node fences
    (DESIGN.md, "Partitions", rule 4): a new epoch in the first view after etcd went more
    than the leader TTL without confirming our lease is a doubt, judged DISCARD once;
    after a short gap, once a view after the gap showed no new leader, or for ranks
    started since, it is only followed."""
    job = JobView({}, {}, "other", None, None, None, None, 9)
    judge = FenceJudge("me")
    judge.follow_epoch(5, running=True, step=100, doubt_s=2.0)
    judge.out_of_touch(1.5)  # shorter than the leader lease: no takeover possible meanwhile
    judge.follow_epoch(9, running=True, step=110, doubt_s=2.0)
    assert not judge.must_pause() and judge.trained_epoch == 9

    judge.out_of_touch(6.0)
    judge.follow_epoch(12, running=True, step=121, doubt_s=2.0)
    assert judge.must_pause() and judge.doubt is not None
    verdict, why = judge.verdict(job, 121, snapshot_at=time.monotonic(), shown=None)
    assert verdict == Fence.DISCARD and "12" in why and "6.0 s" in why
    assert not judge.must_pause()  # judged once

    judge.out_of_touch(8.0)
    judge.ranks_started()  # fresh ranks: they never trained under the old epoch
    judge.follow_epoch(15, running=True, step=0, doubt_s=2.0)
    assert not judge.must_pause() and judge.trained_epoch == 15


def test_a_leader_elected_after_the_view_caught_up_is_no_doubt() -> None:
    """etcd itself was away (every node out of touch): the first whole view after it shows
    the old leader, or none (its lease lapsed); a leader elected after that is followed
    live like any other, and nobody's ranks restart."""
    for seen_after_gap in (5, None):
        judge = FenceJudge("me")
        judge.follow_epoch(5, running=True, step=1, doubt_s=2.0)
        judge.out_of_touch(5.0)
        judge.follow_epoch(seen_after_gap, running=True, step=2, doubt_s=2.0)
        judge.follow_epoch(6, running=True, step=3, doubt_s=2.0)
        assert not judge.must_pause() and judge.trained_epoch == 6


def test_an_epoch_the_lost_lease_judgement_kept_is_not_doubted_again() -> None:
    """A lost lease judged KEEP against the view's new epoch (here the node's own, elected
    when it came back: nobody committed under it) leaves nothing to doubt: the view that
    shows that epoch next does not restart the ranks the judgement resumed. A CI run saw
    `group_resumed` ("nobody went on without us") and, a round later, `epoch_doubt` for
    the same 4.2 s gap and epoch."""
    judge = FenceJudge("me")
    judge.follow_epoch(14, running=True, step=4, doubt_s=2.0)
    judge.fence(4)
    judge.renewed()
    judge.out_of_touch(4.2)
    judge.answered()
    job = JobView({"me": {"step": 4}}, {}, "me", None, None, None, None, 21)
    verdict, why = judge.verdict(job, 4, snapshot_at=time.monotonic() + 1, shown=None)
    assert verdict == Fence.KEEP, why
    judge.follow_epoch(21, running=True, step=4, doubt_s=2.0)
    assert not judge.must_pause() and judge.trained_epoch == 21
