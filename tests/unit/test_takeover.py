"""When a follower campaigns for a vacant leader key (``Leadership.takeover_due``): at once
when the last leader's gate does not answer, but not while that leader is coming back
from the same fence as this node (an etcd outage fences every node)."""

from __future__ import annotations

from pathlib import Path

from daemon.config import load_daemon_config
from daemon.coordination.job_view import JobView
from daemon.leadership.election import Leadership
from daemon.node_state.view import NodeView

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "daemon_job.toml"


class Secret:
    """What takeover_due asks of the coordinator: the job's secret, for the gate probe."""

    def job_secret(self) -> bytes:
        return b"secret"


def job(leader: str | None, nodes: list[str]) -> JobView:
    return JobView(
        nodes={n: {} for n in nodes},
        groups={},
        leader=leader,
        lighthouse=None,
        checkpoint=None,
        state=None,
        spec=None,
    )


def follower(tmp_path: Path) -> tuple[Leadership, NodeView]:
    cfg = load_daemon_config(JOB, node_id="node-b")
    leadership = Leadership(cfg, Secret(), tmp_path)  # type: ignore[arg-type]
    view = NodeView()
    view.lighthouse = "127.0.0.1:1"  # the last leader's gate: nothing answers there
    view.job = job("node-a", ["node-a", "node-b"])
    leadership.update(view)  # a follower's round with a leader: it sends nothing
    return leadership, view


def test_a_vacancy_whose_gate_does_not_answer_is_taken_at_once(tmp_path: Path) -> None:
    leadership, view = follower(tmp_path)
    view.job = job(None, ["node-a", "node-b"])
    assert leadership.takeover_due(view)


def test_back_from_a_fence_the_follower_leaves_the_key_to_the_returning_leader(
    tmp_path: Path,
) -> None:
    leadership, view = follower(tmp_path)
    leadership.fence(view)
    view.job = job(None, ["node-a", "node-b"])
    assert not leadership.takeover_due(view)  # node-a is registered: it is coming back
    assert not leadership.takeover_due(view)
    leadership._vacant_since = -1e9  # past the grace: it did not come back after all
    assert leadership.takeover_due(view)


def test_back_from_a_fence_with_the_last_leader_gone_the_follower_campaigns(
    tmp_path: Path,
) -> None:
    leadership, view = follower(tmp_path)
    leadership.fence(view)
    view.job = job(None, ["node-b"])  # node-a's lease lapsed: it is not coming back
    assert leadership.takeover_due(view)
