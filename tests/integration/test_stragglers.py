"""Issue 38: a rank slowed 3x is named a straggler (event, /status, metric), the fast
group never is, and node.straggler_drain takes the straggler's node out of the job."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.support.harness import Daemon, event_time, start_daemon, wait_for

pytestmark = pytest.mark.integration

JOB = ["train.steps=100000", "ft.straggler_steps=20", "ft.straggler_factor=1.5"]
FAST, SLOW = "0.05", "0.15"  # PHALANX_CHAOS_DELAY, slept at every forward


def _together(*daemons: Daemon) -> float:
    """Wait until every daemon's group commits in a quorum of all of them; the time."""
    wait_for(
        lambda: all(((d.status() or {}).get("participants") or 0) == len(daemons) for d in daemons),
        120,
        "the groups to train together",
    )
    return time.time()


def _straggler_gauge(d: Daemon) -> float | None:
    """phalanx_straggler of the daemon's rank 0, as its /metrics shows it."""
    code, body = d.get("/metrics")
    match = re.search(r'^phalanx_straggler\{[^}]*rank="0"[^}]*\} (\S+)$', body, re.M)
    return float(match.group(1)) if code == 200 and match else None


def test_a_rank_slowed_three_times_is_named_a_straggler(tmp_path: Path, etcd_endpoint: str) -> None:
    fast = start_daemon(
        tmp_path, "fast", [etcd_endpoint], overrides=JOB, env={"PHALANX_CHAOS_DELAY": FAST}
    )
    slow = start_daemon(
        tmp_path, "slow", [etcd_endpoint], overrides=JOB, env={"PHALANX_CHAOS_DELAY": SLOW}
    )
    try:
        since = _together(fast, slow)
        named = wait_for(lambda: slow.events("straggler"), 60, "the straggler to be named")[0]
        after = event_time(named) - since
        assert (
            named["rank"] == 0 and named["replica_group"] == slow.require_status()["replica_group"]
        )
        assert named["ratio"] >= 1.5 and named["compute_s"] > named["others_s"]
        assert after < 30, f"named {after:.1f}s after the groups trained together"
        flagged = wait_for(lambda: slow.require_status()["stragglers"], 10, "/status to show it")
        assert list(flagged) == ["0"]
        assert wait_for(lambda: _straggler_gauge(slow) == 1.0, 10, "phalanx_straggler = 1")
        assert _straggler_gauge(fast) == 0.0
        assert not fast.events("straggler") and not fast.require_status()["stragglers"]
        assert not slow.events("straggler_drain")  # the policy is off by default
        print(
            f"\nstraggler named {after:.1f}s after both groups trained together: compute "
            f"{named['compute_s']}s against {named['others_s']}s (ratio {named['ratio']})"
        )
    finally:
        fast.stop()
        slow.stop()


def test_the_drain_policy_takes_the_straggler_out_and_the_others_go_on(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    fast = start_daemon(
        tmp_path, "fast", [etcd_endpoint], overrides=JOB, env={"PHALANX_CHAOS_DELAY": FAST}
    )
    slow = start_daemon(
        tmp_path, "slow", [etcd_endpoint], overrides=[*JOB, "node.straggler_drain=true"],
        env={"PHALANX_CHAOS_DELAY": SLOW},
    )  # fmt: skip
    try:
        _together(fast, slow)
        wait_for(lambda: slow.events("straggler_drain"), 60, "the straggler's node to drain")
        assert slow.wait(60) == 0, slow.proc.tail()
        step = fast.step()
        wait_for(lambda: fast.step() > step + 20, 60, "the fast group to train on alone")
        assert fast.require_status()["participants"] == 1
        assert not fast.events("group_restarted") and not fast.events("straggler")
    finally:
        fast.stop()
        slow.stop()
