"""The walls between the supervisor and its parts (daemon/supervision/parts.py).

The etcd upkeep's sub-objects (its seats, attempts, record, fence judge, ...) are its
own: no other module of the daemon or the benches imports them, and what the rest
asks of the upkeep is only the verbs its protocol lists. What the parts hand the
supervisor, and what it publishes, are values nobody can change.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from daemon.health import HealthReport
from daemon.node_state.progress import RankProgress
from daemon.node_state.reports import RanksReport, UpkeepInput, UpkeepReport
from daemon.node_state.status import NodeStatus
from daemon.node_state.view import NodeView
from daemon.supervision.after_stop import StopDecision
from daemon.supervision.parts import Upkeep

ROOT = Path(__file__).resolve().parents[2]
DAEMON = ROOT / "daemon"
# The upkeep's sub-objects, by the module that defines each (below daemon/); the fencing
# package's are the upkeep's too, and its modules use one another.
SUB_OBJECTS = {
    "Seats": "supervision/seats.py",
    "SeatProbe": "supervision/seat_probe.py",
    "Attempts": "supervision/attempts.py",
    "NodeRecord": "supervision/node_record.py",
    "RankNotice": "supervision/rank_notice.py",
    "HeldIdWait": "supervision/held_id.py",
    "JobFollower": "supervision/job_follow.py",
    "LighthouseFollow": "supervision/lighthouse_follow.py",
    "ProgressAsk": "fencing/progress_ask.py",
    "LeaseFile": "fencing/lease_file.py",
    "FenceJudge": "fencing/judge.py",
}
UPKEEP_MODULES = {"supervision/upkeep.py", "fencing/__init__.py", *SUB_OBJECTS.values()}


def _sources() -> list[Path]:
    return sorted([*(ROOT / "daemon").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])


def test_the_listed_sub_objects_are_where_the_list_says() -> None:
    for name, module in SUB_OBJECTS.items():
        tree = ast.parse((DAEMON / module).read_text())
        assert any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body), name


def test_no_module_outside_the_upkeep_imports_its_sub_objects() -> None:
    found = []
    for path in _sources():
        if path.is_relative_to(DAEMON) and str(path.relative_to(DAEMON)) in UPKEEP_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and {a.name for a in node.names} & set(SUB_OBJECTS):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_what_is_asked_of_the_upkeep_is_only_its_protocols_verbs() -> None:
    """`upkeep.<member>` (or `self.upkeep.<member>`) outside upkeep.py names a member of
    parts.Upkeep: a handler never reaches `upkeep.seats` or `upkeep.judge`."""
    verbs = {n for n in vars(Upkeep) if not n.startswith("_")} | set(Upkeep.__annotations__)
    reached = []
    for path in _sources():
        if path == DAEMON / "supervision" / "upkeep.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            owner = node.value if isinstance(node, ast.Attribute) else None
            named = isinstance(owner, ast.Name) and owner.id == "upkeep"
            on_self = isinstance(owner, ast.Attribute) and owner.attr == "upkeep"
            if isinstance(node, ast.Attribute) and (named or on_self) and node.attr not in verbs:
                reached.append(f"{path.relative_to(ROOT)}:{node.lineno} upkeep.{node.attr}")
    assert reached == []


KINDS = [
    UpkeepReport,
    UpkeepInput,
    RanksReport,
    RankProgress,
    HealthReport,
    StopDecision,
    NodeStatus,
]


@pytest.mark.parametrize("kind", KINDS)
def test_what_the_parts_hand_over_is_frozen(kind: type) -> None:
    assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_published_status_cannot_be_changed_through_its_collections() -> None:
    """A list or dict of the view is copied as a tuple or a read-only mapping: the HTTP
    thread reads what the tick built, whatever the view does next."""
    view = NodeView(restarts={"hang": 1})
    status = NodeStatus.of(view, "me", "job", 1, shared_fault=False)
    view.restarts["hang"] = 2
    assert status.restarts["hang"] == 1
    with pytest.raises(TypeError):
        status.restarts["hang"] = 3  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.step = 5  # type: ignore[misc]


# The modules that may name the supervisor's view: its own, where it is built and copied.
VIEW_HOLDERS = {
    "daemon/node_state/__init__.py",
    "daemon/node_state/view.py",
    "daemon/node_state/status.py",
    "daemon/supervision/supervisor.py",
    "daemon/supervision/assembly.py",
    "daemon/supervision/reports.py",
    "bench/scale_node.py",  # the scale bench's simulated supervisor
    "bench/scale.py",
}


def test_the_view_is_the_supervisors_alone() -> None:
    """No other part is handed the supervisor's view: the upkeep is given an
    UpkeepInput, the node group folds its ranks' events into a RankProgress of its own."""
    named = {
        str(path.relative_to(ROOT))
        for path in _sources()
        if any(
            isinstance(node, ast.Name | ast.alias)
            and "NodeView" in (getattr(node, "id", None), getattr(node, "name", None))
            for node in ast.walk(ast.parse(path.read_text()))
        )
    }
    assert named <= VIEW_HOLDERS, sorted(named - VIEW_HOLDERS)
    fields = {f.name for f in dataclasses.fields(NodeView)}
    assert not fields & {"slot", "job", "leader", "step", "stragglers", "latest_checkpoint"}
