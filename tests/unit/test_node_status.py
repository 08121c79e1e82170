"""The node's published status (daemon/node_state/status.py): a frozen copy of the view
as a supervisor tick left it, which the HTTP thread reads while the view changes on."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import pytest

from daemon.accounting.incidents import EtcdSeen, IncidentLog
from daemon.node_state.progress import ProgressFold, RankProgress
from daemon.node_state.reports import RanksReport, UpkeepReport
from daemon.node_state.states import State
from daemon.node_state.status import NodeStatus
from daemon.node_state.view import NodeView
from daemon.surfaces.server import status_document


def published(
    view: NodeView,
    ranks: RanksReport | None = None,
    slot: int | None = None,
    progress: RankProgress | None = None,
) -> NodeStatus:
    upkept = UpkeepReport(lighthouse_up=True, slot=slot)
    return NodeStatus.of(
        view, "node-a", "job", 2, shared_fault=False, ranks=ranks, upkept=upkept, progress=progress
    )


def test_the_status_is_the_view_as_it_was_published_and_cannot_be_changed() -> None:
    view = NodeView(state=State.RUNNING, registered=True)
    view.restarts["rank_exit"] = 1
    fold = ProgressFold("node-a")
    fold.track({"event": "straggler", "rank": 0, "ratio": 1.7})
    timeouts = {"step": 30.0}
    ranks = RanksReport(pids=(11, 12), hang_timeouts=MappingProxyType(timeouts))
    status = published(view, ranks, slot=1, progress=fold.snapshot())
    # The supervisor goes on writing its view, the rank threads fold on...
    view.state = State.STOPPING
    view.restarts["rank_exit"] = 2
    fold.track({"event": "train_step", "step": 9, "participants": 1})
    fold.track({"event": "straggler_cleared", "rank": 0})
    # ...what was published stays the tick's whole, with the ranks' report of that tick.
    assert (status.state, status.step, status.pids) == (State.RUNNING, 0, (11, 12))
    assert (status.slot, status.lighthouse_up) == (1, True)  # and the upkeep's report
    assert dict(status.restarts) == {"rank_exit": 1} and dict(status.stragglers) == {0: 1.7}
    assert dict(status.hang_timeouts) == {"step": 30.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.step = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        status.restarts["rank_exit"] = 5  # type: ignore[index]


def test_status_shows_what_was_published() -> None:
    doc = status_document(
        published(NodeView(state=State.WAITING), slot=0, progress=RankProgress(step=4))
    )
    assert (doc["node"], doc["job"], doc["state"], doc["replica_group"]) == (
        "node-a",
        "job",
        "waiting",
        0,
    )
    assert doc["step"] == 4 and doc["pids"] == [] and doc["restarts"] == {}


def test_status_shows_since_when_etcd_is_lost_until_the_loss_is_judged() -> None:
    """/status's etcd_lost: set while the node's etcd loss is not yet an incident (its
    raft term not yet told), null once it is judged (here a partition: the same term)."""
    log = IncidentLog("node-a").etcd(100.0, EtcdSeen(True, 7, 99.0), groups=2)
    lost = log.etcd(101.0, EtcdSeen(False, 7, 99.0), groups=2)
    back = lost.etcd(104.0, EtcdSeen(True, 7, 99.0), groups=2)  # term not told since
    judged = back.etcd(104.5, EtcdSeen(True, 7, 104.4), groups=2)

    def shown(incidents: IncidentLog) -> dict[str, Any]:
        progress = RankProgress(incidents=incidents)
        return status_document(published(NodeView(state=State.RUNNING), progress=progress))

    assert [shown(x)["etcd_lost"] for x in (log, lost, back, judged)] == [None, 101.0, 101.0, None]
    assert [i["kind"] for i in shown(judged)["incidents"]] == ["partition"]
