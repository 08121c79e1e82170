"""What WAITING waits for after a group stopped (daemon/supervision/waiting.py), as pure logic."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from daemon.config import load_daemon_config
from daemon.coordination.job_view import JobView
from daemon.node_state.reports import UpkeepReport
from daemon.supervision.waiting import QUIET_MARGIN_S, REPORT_EVERY_S, Waiting

JOB = Path(__file__).resolve().parents[2] / "tests" / "integration" / "daemon_job.toml"
QUIET = "the failed ranks' quorum requests to expire at the lighthouse"


JOBVIEW = JobView({}, {0: "a", 1: "b"}, "a", "127.0.0.1:1", None, None, None)
# The upkeep follows the published lighthouse, and its forwarder has that target.
UP = UpkeepReport(ranks_lighthouse="127.0.0.1:2", lighthouse="127.0.0.1:1", job=JOBVIEW)


def waiting() -> Waiting:
    return Waiting(load_daemon_config(JOB, ["lighthouse.heartbeat_timeout_ms=2000"]))


def test_a_rank_that_failed_on_its_own_delays_the_next_start_by_the_heartbeat_timeout() -> None:
    w = waiting()
    assert w.missing(UP, now=100.0) is None
    w.after_exit([1], now=100.0)  # e.g. it gave up waiting for a quorum
    assert w.missing(UP, now=100.0) == QUIET
    assert w.missing(UP, now=102.0 + QUIET_MARGIN_S / 2) == QUIET
    assert w.missing(UP, now=102.0 + QUIET_MARGIN_S) is None


def test_killed_or_drained_ranks_restart_at_once() -> None:
    w = waiting()
    w.after_exit([-9, None], now=100.0)  # SIGKILL; a rank the daemon stopped
    w.after_exit([143], now=100.0)  # drained
    w.after_exit([-9, 1], now=100.0)  # rank 1 failed after rank 0, the lighthouse's client, died
    w.after_exit(None, now=100.0)
    assert w.missing(UP, now=100.0) is None


def test_a_wait_is_logged_when_it_changes_and_again_every_30_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A health wait (a full volume) is in the log, not only on /status."""
    w = waiting()
    said: list[dict[str, object]] = []
    monkeypatch.setattr(w.log, "info", lambda event, **kw: said.append({"event": event, **kw}))
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    full = "the node to be healthy (failing: checkpoint_dir; see /status)"
    w.say(full, since=990.0, shown=None)  # new: logged
    clock[0] += 10
    w.say(full, since=990.0, shown=full)  # the same, 10 s later: not again
    clock[0] += REPORT_EVERY_S
    w.say(full, since=990.0, shown=full)  # 40 s after the first: again
    assert said == [
        {"event": "waiting", "waiting_for": full, "waited_s": 10.0},
        {"event": "waiting", "waiting_for": full, "waited_s": 50.0},
    ]


def test_nothing_starts_without_a_lighthouse_or_enough_groups() -> None:
    w = waiting()
    no_forwarder = UpkeepReport(lighthouse="127.0.0.1:1", job=JOBVIEW)
    assert w.missing(no_forwarder, now=1.0) == "a lighthouse address in etcd"
    one_group = UpkeepReport(ranks_lighthouse="127.0.0.1:2", lighthouse="127.0.0.1:1", job=None)
    assert w.missing(one_group, now=1.0) == "replica groups: 0 of job.min_replicas=1"
