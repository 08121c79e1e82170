"""A spanning group's node steps aside while it asks about a member whose host answers
nothing (``daemon.supervision.aside``): the decision, and the supervisor's moves with fake
parts (the integration test is test_groups_across_nodes's power cut)."""

from __future__ import annotations

import time
from dataclasses import replace

from daemon.fencing import Fence
from daemon.node_state.states import State
from daemon.supervision.aside import ASIDE_MAX_S, RESTART_AFTER_S, Aside, verdict
from daemon.supervision.seat_probe import Asking
from tests.support.supervisor_fakes import Node, handle, node

SPANNING = ("job.nodes_per_group=2", "parallel.dp_shard=2")
ASKED_B = Asking(began=("node-b",), waiting=True)


def test_a_node_steps_aside_once_per_silent_member_silence_and_generation() -> None:
    aside = Aside()
    assert aside.steps_for(["node-b"], ASKED_B, 3)
    # Not for a member asked about while its host answers (the ranks' stillness alone),
    # nor for a silent one whose ask was out already (not begun this round).
    assert not aside.steps_for([], ASKED_B, 3)
    assert not aside.steps_for(["node-b"], Asking(waiting=True), 3)
    taken = aside.taken(["node-b"], 3, silence=12.5)
    assert taken.active and taken.silence == 12.5 and taken.members == {"node-b"}
    assert not taken.steps_for(["node-b"], ASKED_B, 3)  # answered once: a split, waited on
    assert taken.steps_for(["node-c"], Asking(began=("node-c",), waiting=True), 3)
    assert taken.steps_for(["node-b"], ASKED_B, 4)  # the group's next generation
    assert taken.taken(["node-c"], 3, 0.0).members == {"node-b", "node-c"}
    assert taken.taken(["node-c"], 4, 0.0).members == {"node-c"}
    # Its host answered again: forgotten, so its next silence is a new one.
    assert taken.forgetting(["node-b"]).members == {"node-b"}
    assert taken.forgetting([]).steps_for(["node-b"], ASKED_B, 3)


def test_what_paused_ranks_do_by_what_the_ask_came_to() -> None:
    assert verdict(Asking(revoked=True), None, 0.5, 1)[0] == Fence.DISCARD
    moved = "replica group 1 moved on to generation 5"
    assert verdict(Asking(waiting=True), moved, 0.5, 1) == (Fence.DISCARD, moved)
    assert verdict(Asking(waiting=True), None, 0.5, 1)[0] == Fence.HOLD
    assert verdict(Asking(), None, 0.5, 1)[0] == Fence.KEEP  # answered, its host too
    assert verdict(Asking(), None, 0.5, 1, split=True)[0] == Fence.HOLD  # a split
    assert verdict(Asking(), None, 10 * ASIDE_MAX_S, 1, split=True)[0] == Fence.HOLD
    # The split healed: a short one resumes the ranks, a long one restarts the group.
    assert verdict(Asking(), None, RESTART_AFTER_S - 0.1, 1)[0] == Fence.KEEP
    assert verdict(Asking(), None, RESTART_AFTER_S + 0.1, 1)[0] == Fence.DISCARD
    assert verdict(Asking(revoked=True), None, 0.5, 1, split=True)[0] == Fence.DISCARD
    assert verdict(Asking(waiting=True), None, ASIDE_MAX_S + 0.1, 1)[0] == Fence.KEEP


def silent_member(state: State) -> Node:
    n = node(state, *SPANNING)
    n.ranks.running = True
    n.upkeep.silent, n.upkeep.asking = ("node-b",), ASKED_B
    return n


def test_a_silent_members_ask_announces_the_groups_failure_and_pauses_its_ranks() -> None:
    n = silent_member(State.RUNNING)
    assert handle(n) == State.FENCED
    assert n.upkeep.calls == ["announce_failure"] and n.ranks.calls == ["pause"]
    assert "node-b" in n.ranks.paused_for[0] and "answers nothing" in n.ranks.paused_for[0]
    n.sup.tick()  # the standbys stay warm: the group may restart as soon as the ask ends
    assert n.ranks.standbys_live[-1] and n.view.state == State.FENCED
    assert n.view.waiting_for is not None and "answer" in n.view.waiting_for
    assert n.upkeep.handed[-1].watching  # the members' ports are still watched
    # The member answered while its host still answers us nothing: a split inside the
    # group, held out of the other groups' quorums until it heals.
    n.upkeep.asking = Asking()
    assert handle(n) == State.FENCED and "split" in str(n.view.waiting_for)
    # Its host answers again: the ranks go on. Silent again before a running round saw it
    # answer: the same silence, not stepped aside for twice.
    n.upkeep.silent = ()
    assert handle(n) == State.RUNNING and n.ranks.calls[-1] == "resume"
    n.upkeep.silent, n.upkeep.asking = ("node-b",), ASKED_B
    assert handle(n) == State.RUNNING and n.ranks.calls.count("pause") == 1
    # Its host answers for a while, then goes silent again: a new silence, asked about
    # and stepped aside for again.
    n.upkeep.silent, n.upkeep.asking = (), Asking()
    assert handle(n) == State.RUNNING
    n.upkeep.silent, n.upkeep.asking = ("node-b",), ASKED_B
    assert handle(n) == State.FENCED and n.ranks.calls.count("pause") == 2


def test_a_revoked_seat_stops_the_paused_ranks_and_a_lost_lease_is_the_fences() -> None:
    n = silent_member(State.RUNNING)
    handle(n)
    n.upkeep.asking = Asking(revoked=True)
    assert handle(n) == State.STOPPING and n.ranks.calls[-1] == "stop"
    # The lease in doubt meanwhile: the fence judges from then on, as for any pause.
    n = silent_member(State.RUNNING)
    handle(n)
    n.upkeep.must_pause, n.upkeep.asking = True, Asking(revoked=True)
    n.upkeep.verdict = (Fence.HOLD, "etcd away")
    assert handle(n) == State.FENCED and n.view.waiting_for == "etcd away"
    n.upkeep.must_pause, n.upkeep.verdict = False, (Fence.KEEP, "etcd confirmed the lease")
    assert handle(n) == State.RUNNING and n.ranks.calls[-1] == "resume"


def test_a_split_held_when_the_job_completes_elsewhere_stops_its_ranks() -> None:
    n = silent_member(State.RUNNING)
    handle(n)
    n.upkeep.asking = Asking()  # answered, the host still silent: a split, held
    assert handle(n) == State.FENCED
    n.upkeep.job = replace(n.upkeep.job, state={"state": "completed", "step": 10})
    assert handle(n) == State.STOPPING and n.ranks.calls[-1] == "stop"


def test_an_ask_without_an_outcome_resumes_the_ranks_after_its_time() -> None:
    n = silent_member(State.RUNNING)
    handle(n)
    n.upkeep.asking = Asking(waiting=True)
    assert handle(n) == State.FENCED
    n.sup.entered_at = time.monotonic() - ASIDE_MAX_S - 0.1
    assert handle(n) == State.RUNNING and n.ranks.calls[-1] == "resume"


def test_a_one_node_group_never_steps_aside() -> None:
    n = node(State.RUNNING)
    n.ranks.running = True
    n.upkeep.silent, n.upkeep.asking = ("node-b",), ASKED_B
    assert handle(n) == State.RUNNING and "pause" not in n.ranks.calls
