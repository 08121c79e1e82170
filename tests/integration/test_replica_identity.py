"""A rank killed with SIGKILL is replaced under its group's replica id (daemon/ranks/node_group.py).

Two real daemons on a real etcd, the real torchft lighthouse, real ranks. The lighthouse
here counts a silent replica alive for 10 minutes and waits as long for stragglers, so
the survivor's next quorum forms before then only if the replacement takes the dead
process's place at the lighthouse; under a new id, the dead one would be waited for.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.harness import (
    HOLD_PACE_S,
    Daemon,
    event_time,
    hurry,
    start_daemon,
    wait_for,
)
from tests.support.job_queries import digest

pytestmark = pytest.mark.integration

TEN_MINUTES_MS = 600_000
REPLICA_ID = re.compile(r"(phalanx_group_\d{5}:[0-9a-f-]+): seen")


def heartbeating(lighthouse: str) -> set[str]:
    """The replica ids the lighthouse's status page lists as heartbeating (alive or not)."""
    url = lighthouse if lighthouse.startswith("http") else f"http://{lighthouse}"
    with urllib.request.urlopen(f"{url}/status", timeout=10) as page:
        return set(REPLICA_ID.findall(page.read().decode()))


def test_a_killed_rank_is_replaced_under_its_replica_id_and_rejoins_at_once(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    overrides = [
        "train.steps=100",  # at HOLD_PACE_S until hurried: under 40 are spent waiting
        f"lighthouse.heartbeat_timeout_ms={TEN_MINUTES_MS}",
        f"lighthouse.join_timeout_ms={TEN_MINUTES_MS}",
    ]
    a = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=overrides, pace_s=HOLD_PACE_S)
    b = start_daemon(tmp_path, "node-b", [etcd_endpoint], overrides=overrides, pace_s=HOLD_PACE_S)
    daemons: list[Daemon] = [a, b]
    try:
        wait_for(
            lambda: [e for e in a.events("train_step") if e["participants"] == 2],
            120,
            "both groups to train together",
        )
        # The lighthouse's status page, on the leader's loopback (the published address is its
        # gate, which serves only the ranks' gRPC).
        started = [e for d in daemons for e in d.events("lighthouse_started")]
        lighthouse = f"127.0.0.1:{started[-1]['internal_port']}"
        before = wait_for(
            lambda: len(ids := heartbeating(lighthouse)) == 2 and ids, 30, "two heartbeating groups"
        )
        victim = b.rank_pids()[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        restarted = wait_for(lambda: b.events("group_restarted"), 60, "node-b's group to restart")
        assert restarted[0]["reason"] == "rank_exit" and victim not in restarted[0]["pids"]
        # The survivor trains with both groups again, well inside the ten minutes.
        wait_for(
            lambda: [
                e
                for e in a.events("train_step")
                if e["participants"] == 2 and event_time(e) > event_time(restarted[0])
            ],
            120,
            "node-a to train with node-b's new rank",
        )
        # Under the same two ids: no third (the dead process's) is heartbeating.
        assert heartbeating(lighthouse) == before
        hurry(a, b)
        assert a.wait(180) == 0, a.proc.tail()
        assert b.wait(60) == 0, b.proc.tail()
    finally:
        for d in daemons:
            d.stop()
    healed = [e for e in b.events("heal_done") if event_time(e) > killed_at]
    assert healed, b.proc.tail()
    assert not a.events("group_restarted")  # the survivor's rank never failed a quorum
    assert digest(a) == digest(b)
