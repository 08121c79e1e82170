"""When a follower campaigns for a vacant leader key (``Leadership.takeover_due``): at once
when the last leader's gate does not answer, but not while that leader is coming back
from the same fence as this node (an etcd outage fences every node)."""

from __future__ import annotations

from pathlib import Path

from daemon.config import load_daemon_config
from daemon.coordination.job_view import JobView
from daemon.leadership.election import Leadership

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "daemon_job.toml"
LAST = "127.0.0.1:1"  # the last leader's gate, as last published: nothing answers there


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


def follower(tmp_path: Path) -> Leadership:
    cfg = load_daemon_config(JOB, node_id="node-b")
    leadership = Leadership(cfg, Secret(), tmp_path)  # type: ignore[arg-type]
    # A follower's round with a leader: it sends nothing.
    leadership.update(job("node-a", ["node-a", "node-b"]), LAST)
    return leadership


def test_a_vacancy_whose_gate_does_not_answer_is_taken_at_once(tmp_path: Path) -> None:
    leadership = follower(tmp_path)
    assert leadership.takeover_due(job(None, ["node-a", "node-b"]), LAST)


def test_back_from_a_fence_the_follower_leaves_the_key_to_the_returning_leader(
    tmp_path: Path,
) -> None:
    leadership = follower(tmp_path)
    leadership.fence()
    vacant = job(None, ["node-a", "node-b"])
    assert not leadership.takeover_due(vacant, LAST)  # node-a is registered: coming back
    assert not leadership.takeover_due(vacant, LAST)
    leadership._vacant_since = -1e9  # past the grace: it did not come back after all
    assert leadership.takeover_due(vacant, LAST)


def test_back_from_a_fence_with_the_last_leader_gone_the_follower_campaigns(
    tmp_path: Path,
) -> None:
    leadership = follower(tmp_path)
    leadership.fence()
    # node-a's lease lapsed: it is not coming back.
    assert leadership.takeover_due(job(None, ["node-b"]), LAST)
