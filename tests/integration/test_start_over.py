"""Every replica group gone and no checkpoint to load: the job can only train again from
step 0, and each node says so (``job_started_over``, a warning with the step it had
reached) instead of silently retraining what it had committed."""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

import pytest

from tests.support.harness import hurry, start_daemon, wait_for
from tests.support.job_queries import digest
from tests.support.pair_runs import run_to_end

pytestmark = pytest.mark.integration


def test_every_group_gone_without_a_checkpoint_starts_over_and_says_so(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    # No checkpoint.dir; neither group commits alone, so both start over (a group that
    # committed first would be healed from, and the other would not start at step 0).
    job = ["train.steps=60", "job.min_replicas=2"]
    pair = [start_daemon(tmp_path, n, [etcd_endpoint], overrides=job) for n in ("a", "b")]
    try:
        wait_for(lambda: all(d.step() > 10 for d in pair), 120, "both groups to train")
        for pid in [p for d in pair for p in d.rank_pids()]:
            os.kill(pid, signal.SIGKILL)
        said = [
            wait_for(partial(d.events, "job_started_over"), 120, f"{d.node_id} to say so")
            for d in pair
        ]
        hurry(*pair)
        run_to_end(pair)
    finally:
        for d in pair:
            d.stop()
    for d, events in zip(pair, said, strict=True):
        assert len(events) == 1 and int(events[0]["from_step"]) > 10, events
        assert events[0]["level"] == "warning" and "step 0" in events[0]["detail"]
        assert [e["step"] for e in d.events("train_step")].count(1) == 2, d.node_id
    assert digest(pair[0]) == digest(pair[1])
