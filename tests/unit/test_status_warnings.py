"""`phalanx status` warns where the job trains, or trained, unreplicated (issue 34)."""

from __future__ import annotations

from typing import Any

from daemon.coordination.job_view import JobView
from daemon.supervision.supervisor import SPARE
from daemon.surfaces.status import status_json, status_table


def _job(participants: dict[str, int | None], state: dict[str, object] | None) -> JobView:
    nodes = {
        node: {"group": gid, "state": "running", "participants": p, "host": "10.0.0.1"}
        for gid, (node, p) in enumerate(sorted(participants.items()))
    }
    groups = {gid: node for gid, node in enumerate(sorted(participants))}
    return JobView(nodes, groups, "a", None, None, state, None)


def test_a_running_node_in_a_quorum_smaller_than_the_slots_is_a_warning() -> None:
    doc = status_json("j", _job({"a": 1, "b": None, "c": None}, {"state": "running"}))
    assert doc["warnings"] == [
        "node a trains in a quorum of 1 of the 3 replica groups holding a slot"
    ]
    assert "warning: node a trains in a quorum of 1" in status_table(doc)
    full = status_json("j", _job({"a": 3, "b": 3, "c": 3}, {"state": "running"}))
    assert full["warnings"] == []


def test_a_job_that_completed_unreplicated_is_a_warning() -> None:
    lonely = {"state": "completed", "node": "a", "largest_quorum": 1, "groups": 3}
    doc = status_json("j", _job({}, lonely))
    assert len(doc["warnings"]) == 1 and "completed unreplicated" in doc["warnings"][0]
    replicated = {**lonely, "largest_quorum": 3}
    assert status_json("j", _job({}, replicated))["warnings"] == []
    alone_by_design = {**lonely, "groups": 1}
    assert status_json("j", _job({}, alone_by_design))["warnings"] == []


def test_a_spare_shows_as_a_spare_waiting_for_a_free_seat() -> None:
    """Issue 51: `phalanx status --json` showed a spare as claiming, waiting for "the first
    health check" (a reason from before its first check, never cleared)."""
    nodes: dict[str, dict[str, Any]] = {
        "a": {"group": 0, "state": "running", "host": "10.0.0.1", "spare": False},
        "s": {"group": None, "state": "claiming", "waiting_for": SPARE, "spare": True},
        "old": {"group": None, "state": "claiming"},  # a record from before the field
    }
    doc = status_json("j", JobView(nodes, {0: "a"}, "a", None, None, None, None))
    assert [(n["id"], n["spare"]) for n in doc["nodes"]] == [
        ("a", False),
        ("old", False),
        ("s", True),
    ]
    assert "s waits for a free seat (every seat is held: this node waits as a spare)" in (
        status_table(doc)
    )
