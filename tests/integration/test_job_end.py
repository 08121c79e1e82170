"""A group whose ranks come up after the job completed elsewhere does not retrain it.

Seen when test_sample_coverage ran unpaced: one group trained the whole 30-step job
alone while the other's ranks were still starting, and the other then trained it
again from step 0 within its drain grace (both with participants 1). Here the late
group's rank stops itself once built, before its first step (PHALANX_CHAOS
start@0:stop), and is continued once the other group's daemon has exited.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.harness import Daemon, event_time, start_daemon, wait_for

pytestmark = pytest.mark.integration


def stopping(d: Daemon) -> bool:
    return any(e.get("to") == "stopping" for e in d.events("state_changed"))


def test_a_group_far_behind_a_job_completed_elsewhere_stops_without_training_it_again(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    job = ["train.steps=30", "node.standby=false"]
    # Held stopped in its start for as long as node-a takes, not judged hung meanwhile.
    late = start_daemon(
        tmp_path,
        "node-b",
        [etcd_endpoint],
        overrides=[*job, "hang.start_s=600"],
        env={"PHALANX_CHAOS": "start@0:stop"},
    )
    try:
        rank = wait_for(late.rank_pids, 60, "node-b's rank")[0]
        wait_for(lambda: late.events("rank_started"), 120, "node-b's rank to be built")
        first = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=job, pace_s=0.0)
        try:
            assert first.wait(180) == 0, first.proc.tail()
        finally:
            first.stop()
        done = first.events("train_done")[0]
        assert int(done["step"]) == 30
        # node-b's daemon has seen the end once it stops its group; within its drain grace
        # (15 s) it used to let the group go on. Continued either way after 5 s.
        deadline = time.monotonic() + 5
        while not stopping(late) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(rank, signal.SIGCONT)
        assert late.wait(120) == 0, late.proc.tail()
    finally:
        late.stop()
    # node-b's group trained none of the finished job again: at most the step under way
    # when its SIGTERM arrived (a rank drains after its step).
    retrained = [e for e in late.events("train_step") if event_time(e) > event_time(done)]
    assert len(retrained) <= 1, f"node-b trained {len(retrained)} steps of a finished job"
    assert late.events("node_done")[0]["reason"] == "the job completed elsewhere"
    assert not late.events("train_done")
