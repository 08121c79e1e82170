"""What a node does about its health (daemon/supervision/health_gate.py) and how it says
so: /readyz, /status, its etcd record and `phalanx status`."""

from __future__ import annotations

from typing import Any

from daemon.coordination.job_view import JobView
from daemon.health import CheckResult, HealthReport
from daemon.node_state import NodeView, State
from daemon.node_state.status import NodeStatus
from daemon.supervision.health_gate import (
    FIRST_CHECK,
    claim_blocked,
    failing,
    healthy_groups_besides,
    must_leave,
    shared_fault,
)
from daemon.surfaces.server import health_document, readiness
from daemon.surfaces.status import status_json, status_table

OK = CheckResult("clock", True, "+0.1 s off etcd's")
FULL = CheckResult("checkpoint_dir", False, "checkpoint.dir /c has 1.0 MB free")


def report(*checks: CheckResult, in_a_row: int = 0) -> HealthReport:
    return HealthReport(checks, 0.0, in_a_row)


def test_a_node_claims_only_once_a_report_says_it_is_healthy() -> None:
    assert claim_blocked(None) == FIRST_CHECK
    assert claim_blocked(report(OK)) is None
    assert claim_blocked(report(OK, FULL, in_a_row=1)) == (
        "the node to be healthy (failing: checkpoint_dir; see /status)"
    )
    assert failing(report(OK, FULL)) == {"checkpoint_dir": FULL.reason}
    assert failing(None) == {} == failing(report(OK))


def test_a_seat_is_given_back_after_leave_after_failures_in_a_row() -> None:
    bad = [report(FULL, in_a_row=n) for n in range(1, 4)]
    assert [must_leave(r, 3, False, 0, 1) for r in bad] == [False, False, True]
    assert not must_leave(bad[2], 0, False, 0, 1)  # leave_after = 0: never
    assert not must_leave(report(OK), 1, False, 0, 1)
    assert not must_leave(None, 1, False, 0, 1)


def test_a_running_node_makes_way_only_while_min_replicas_other_groups_train_healthy() -> None:
    bad = report(FULL, in_a_row=5)
    assert not must_leave(bad, 3, True, 0, 1)  # alone: it keeps training (and says so)
    assert must_leave(bad, 3, True, 1, 1)
    assert not must_leave(bad, 3, True, 1, 2)  # the others could not commit without it
    assert must_leave(bad, 3, True, 2, 2)


def _job(records: dict[str, Any]) -> JobView:
    return JobView(records, {}, None, None, None, None, None)


def test_other_groups_count_when_their_running_nodes_say_they_are_healthy() -> None:
    job = _job(
        {
            "me": {"group": 0, "state": "running", "health": {"clock": "off"}},
            "mate": {"group": 0, "state": "running", "health": {}},  # my own group
            "b": {"group": 1, "state": "running", "health": {}},
            "c": {"group": 2, "state": "running"},  # a record from before health
            "d": {"group": 3, "state": "running", "health": {"memory": "low"}},
            "e": {"group": 4, "state": "waiting", "health": {}},
            "f1": {"group": 5, "state": "running", "health": {}},
            "f2": {"group": 5, "state": "running", "health": {"devices": "lost one"}},
            "g": {"group": True, "state": "running"},
            "h": {"group": 6, "state": "running", "health": "garbage"},
            "i": "not a record",
        }
    )
    assert healthy_groups_besides(job, "me", 0) == 2  # groups 1 and 2
    assert healthy_groups_besides(None, "me", 0) == 0


def test_readyz_is_ready_only_running_and_healthy_and_says_why_not() -> None:
    def published(view: NodeView) -> NodeStatus:  # as the supervisor's tick publishes it
        return NodeStatus.of(view, "me", "job", 1, shared_fault=False)

    view = NodeView(state=State.RUNNING, registered=True, health=report(OK))
    assert readiness(published(view)) == (True, "ready\n")
    view.health = report(OK, FULL, in_a_row=1)
    assert readiness(published(view)) == (
        False,
        f"running\nunhealthy: checkpoint_dir: {FULL.reason}\n",
    )
    claiming = NodeView(state=State.CLAIMING, registered=True)
    assert readiness(published(claiming)) == (False, "claiming\n")


def test_status_shows_every_checks_verdict() -> None:
    assert health_document(None) is None
    assert health_document(report(OK, FULL, in_a_row=2)) == {
        "ok": False,
        "failed_in_a_row": 2,
        "checks": {
            "clock": {"ok": True, "reason": OK.reason},
            "checkpoint_dir": {"ok": False, "reason": FULL.reason},
        },
    }


def test_phalanx_status_prints_each_failing_check_of_each_node() -> None:
    job = _job(
        {
            "a": {"group": None, "state": "claiming", "health": {"checkpoint_dir": FULL.reason}},
            "b": {"group": 1, "state": "running", "health": {}},
            "c": {"group": 2, "state": "running", "health": ["not", "a", "dict"]},
        }
    )
    doc = status_json("j", job)
    assert [n["health"] for n in doc["nodes"]] == [{"checkpoint_dir": FULL.reason}, {}, {}]
    table = status_table(doc)
    assert f"a is unhealthy: checkpoint_dir: {FULL.reason}" in table
    assert "b is unhealthy" not in table and "c is unhealthy" not in table


CLOCK_OFF = CheckResult("clock", False, "clock is +3600.0 s off etcd's")


def test_a_fault_every_node_shares_lets_a_node_claim_and_one_of_its_own_does_not() -> None:
    """A full shared volume: every live node fails checkpoint_dir, so none could take the
    seat and the node trains (saves refused) instead of waiting for ever."""
    full = report(OK, FULL, in_a_row=4)
    both_full = _job(
        {"a": {"health": {"checkpoint_dir": "x"}}, "b": {"health": {"checkpoint_dir": "y"}}}
    )
    assert shared_fault(full, both_full, "a")
    assert claim_blocked(full, shared_fault(full, both_full, "a")) is None
    assert shared_fault(full, _job({"a": {"health": {}}}), "a")  # alone: no one else could
    # b writes the volume (a local disk full on a alone): a waits, b takes the seat.
    assert not shared_fault(full, _job({"a": {}, "b": {"health": {}}}), "a")
    # b has not reported yet, or its record is malformed: wait for its first check.
    assert not shared_fault(full, _job({"b": {"state": "claiming"}}), "a")
    assert not shared_fault(full, _job({"b": "garbage"}), "a")
    # b fails something else: it passes the volume check, so the volume is a's alone.
    assert not shared_fault(full, _job({"b": {"health": {"clock": "off"}}}), "a")


def test_a_nodes_own_fault_is_never_shared_even_when_every_node_has_it() -> None:
    clock = report(OK, CLOCK_OFF)
    everyone = _job({"b": {"health": {"clock": "off"}}})
    assert not shared_fault(clock, everyone, "a")
    both = report(FULL, CLOCK_OFF)  # a shared volume and its own clock: its own fault wins
    assert not shared_fault(
        both, _job({"b": {"health": {"checkpoint_dir": "x", "clock": "o"}}}), "a"
    )
    assert not shared_fault(report(OK), everyone, "a")  # healthy: nothing to share
    assert not shared_fault(None, everyone, "a")
    assert not shared_fault(report(FULL), None, "a")  # etcd not read yet
