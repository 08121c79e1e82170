"""A node that becomes the leader, or whose lighthouse starts to serve, publishes its status
before it logs the line: whoever reads `leader_elected` or `lighthouse_started` in the log
and then asks /status finds the node leading (the status is otherwise published at the end
of the supervisor's tick, after the election's round)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from daemon.config import load_daemon_config
from daemon.leadership.election import Leadership, Lighthouse

JOB = Path(__file__).resolve().parents[2] / "tests" / "integration" / "daemon_job.toml"


class Shown(Exception):
    """Raised by the fake publish: the round stops there, before any lighthouse starts."""


def leadership(tmp_path: Path, logged: list[str]) -> Leadership:
    cfg = load_daemon_config(JOB, [f'node.run_dir="{tmp_path}"'], node_id="node-a")
    coord = SimpleNamespace(campaign=lambda epoch: True, leader_lease_held=True)

    def shown() -> None:
        assert lead.leader, "published before the election says it leads"
        raise Shown(list(logged))

    lead = Leadership(cfg, coord, tmp_path, shown)  # type: ignore[arg-type]
    lead.log = SimpleNamespace(
        info=lambda event, **_: logged.append(event),
        warning=lambda event, **_: logged.append(event),
    )
    return lead


def test_a_new_leader_is_published_before_leader_elected_is_logged(tmp_path: Path) -> None:
    logged = list[str]()
    lead = leadership(tmp_path, logged)
    with pytest.raises(Shown) as raised:
        lead.update(None, None)  # nobody leads (no job view yet): it campaigns and wins
    assert raised.value.args[0] == []  # nothing logged before the status was published
    assert lead.leader


def test_a_serving_lighthouse_is_published_before_lighthouse_started_is_logged(
    tmp_path: Path,
) -> None:
    logged = list[str]()
    lead = leadership(tmp_path, logged)
    lead.leader = True
    process: Any = SimpleNamespace(listening=lambda: True, port=29510, internal_port=1, pid=2)
    lead.lighthouse, lead.phase = process, Lighthouse.STARTING
    with pytest.raises(Shown) as raised:
        lead._probe()
    assert "lighthouse_started" not in raised.value.args[0]
    assert lead.phase == Lighthouse.SERVING
