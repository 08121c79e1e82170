"""Every replica group gone and no checkpoint to load: the job can only train again from
step 0, and each node says so (``job_started_over``, a warning with the step it had
reached, and ``phalanx_job_started_over_total``) instead of silently retraining what it
had committed; with ``job.on_no_state = "stop"`` it stops instead, also when every node
restarted (the reached step is kept in etcd)."""

from __future__ import annotations

import os
import re
import signal
from functools import partial
from pathlib import Path

import pyetcd
import pytest

from daemon.coordination.progress import parse_reached, reached_key
from tests.support.harness import HOLD_PACE_S, Daemon, hurry, start_daemon, wait_for
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
        assert [started_over_total(d) for d in pair] == [1.0, 1.0]
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


def started_over_total(d: Daemon) -> float:
    code, text = d.get("/metrics")
    assert code == 200
    found = re.search(r"^phalanx_job_started_over_total\{[^}]*\} (\S+)$", text, re.M)
    assert found, "phalanx_job_started_over_total is not exported"
    return float(found.group(1))


def test_told_to_stop_rather_than_retrain_it_stops_even_after_every_node_restarted(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    job = ["train.steps=400", "job.min_replicas=2", 'job.on_no_state="stop"']
    host, port = etcd_endpoint.split(":")
    client = pyetcd.client(host=host, port=int(port), timeout=5)
    first = [
        start_daemon(tmp_path, n, [etcd_endpoint], overrides=job, pace_s=HOLD_PACE_S)
        for n in ("a", "b")
    ]
    again: list[Daemon] = []
    try:
        # The reached step reaches etcd with a node's progress (every 10 s).
        reached = wait_for(
            lambda: parse_reached("itest", client.get(reached_key("itest"))[0]) > 1,
            120,
            "the job's reached step in etcd",
        )
        assert reached
        for d in first:  # every daemon and rank SIGKILLed at once: a power cut
            d.stop()
        again = [
            start_daemon(tmp_path, n, [etcd_endpoint], overrides=job, name=f"{n}-again")
            for n in ("a", "b")
        ]
        codes = [d.wait(180) for d in again]
    finally:
        for d in [*first, *again]:
            d.stop()
        client.close()
    assert codes == [1, 1], [d.proc.tail() for d in again]
    for d in again:
        over = d.events("job_started_over")
        assert len(over) == 1 and int(over[0]["from_step"]) > 1, over
        exits = d.events("daemon_exit")
        assert exits and "job.on_no_state is 'stop'" in str(exits[-1]), exits
        assert not d.events("train_done")
