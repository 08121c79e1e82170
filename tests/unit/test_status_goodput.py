"""`phalanx status` shows the job's goodput (from the time its nodes' progress carries)
and its incidents (issue 54)."""

from __future__ import annotations

from typing import Any

from daemon.accounting import Action, IncidentLog, Kind
from daemon.coordination.job_view import JobView
from daemon.surfaces.status import incidents_table, status_json, status_table


def _job(times: dict[str, dict[str, dict[str, Any]]]) -> JobView:
    nodes = {
        node: {"group": gid, "state": "running", "host": "10.0.0.1", **spent}
        for gid, (node, spent) in enumerate(sorted(times.items()))
    }
    return JobView(nodes, {0: "a"}, "a", None, None, {"state": "running"}, None)


def test_the_jobs_goodput_is_its_nodes_training_over_all_their_seconds() -> None:
    view = _job(
        {
            "a": {"time": {"training": 90.0, "quorum": 10.0}, "time_1h": {"training": 30.0}},
            "b": {"time": {"training": 50.0, "spare": 50.0}, "time_1h": {"spare": 30.0}},
            "c": {},  # no progress written yet
        }
    )
    doc = status_json("j", view)
    assert doc["goodput"] == {"since_start": 0.7, "last_hour": 0.5}
    assert "goodput 0.700 since the daemons started, 0.500 over the last hour" in (
        status_table(doc)
    )
    assert status_json("j", _job({"a": {}}))["goodput"] == {
        "since_start": None,
        "last_hour": None,
    }


def test_the_incidents_are_listed_oldest_first_and_the_table_shows_the_last_ones() -> None:
    log = IncidentLog("node-b")
    for n in range(7):
        log = log.opened(Kind.RANK_EXIT, 1_000_000.0 + 60 * n, group=1).acted(Action.HEAL)
        log = log.committed(1_000_003.5 + 60 * n)
    doc = status_json("j", _job({"a": {}}), log.closed)
    assert [i["began"] for i in doc["incidents"]] == [1_000_000.0 + 60 * n for n in range(7)]
    assert doc["incidents"][0] == {"name": log.closed[0].key, **log.closed[0].record()}
    table = status_table(doc)
    assert "last incidents (all: phalanx status --incidents):" in table
    assert table.count("rank_exit  node-b") == 5  # the last five
    full = incidents_table(doc)
    assert full.count("rank_exit  node-b  1      0.0       3.5        heal    3.5 group-s") == 7
    assert incidents_table({"incidents": []}) == "(no incidents)"


def test_status_says_how_the_groups_exchange() -> None:
    """Issue 55: a semi-synchronous job's nodes write their exchange into their records;
    `phalanx status` says it (every-step jobs write nothing and read as such)."""
    diloco = {"exchange": {"semi_sync_method": "diloco", "sync_steps": 20}}
    doc = status_json("j", _job({"a": diloco, "b": diloco}))
    assert doc["exchange"] == {"semi_sync_method": "diloco", "sync_steps": 20}
    assert "exchange diloco: groups sync every 20 steps" in status_table(doc)
    fragments = {"exchange": {"semi_sync_method": "diloco", "sync_steps": 20, "num_fragments": 4}}
    shown = status_table(status_json("j", _job({"a": fragments})))
    assert "every 20 steps, in 4 fragments synced in turn" in shown
    plain = status_json("j", _job({"a": {}}))
    assert plain["exchange"] == {"semi_sync_method": "none"}
    assert "exchange" not in status_table(plain)
