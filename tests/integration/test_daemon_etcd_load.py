"""What a training daemon asks of etcd in the steady state (issue 14, failure-free overhead).

On a node whose cores the ranks use, every request is CPU taken from them, twice: the
daemon's and etcd's. The supervisor's round runs four times a second; the lease needs a
keepalive about once a second at most (``daemon.coordination.fencing.refresh_every_s``), the job is read
only when its watch says something changed or every ``MAX_AGE_S`` (``daemon.coordination.job_watch``),
and a daemon campaigns only when the leader key changed or every ``CAMPAIGN_EVERY_S``.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from daemon.coordination.fencing import refresh_every_s
from daemon.coordination.job_watch import MAX_AGE_S
from daemon.leadership.election import CAMPAIGN_EVERY_S
from daemon.supervision.node_record import RECORD_EVERY_S
from daemon.supervision.supervisor import TICK_S
from tests.support.etcd_control import ControlledEtcd
from tests.support.harness import start_daemon, wait_for

pytestmark = pytest.mark.integration
LEASE_TTL_S = 10
WATCH_S = 8.0
METHODS = ("LeaseKeepAlive", "Range", "Txn")


def started(etcd: ControlledEtcd, method: str) -> int:
    """How many gRPC calls of `method` etcd has started (its own Prometheus counter)."""
    with urllib.request.urlopen(f"{etcd.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    needle = f'grpc_method="{method}"'
    lines = [ln for ln in text.splitlines() if ln.startswith("grpc_server_started_total{")]
    return sum(int(float(ln.rsplit(" ", 1)[1])) for ln in lines if needle in ln)


def test_a_training_daemon_keeps_its_lease_alive_and_reads_its_job_without_a_request_every_round(
    tmp_path: Path, etcd: ControlledEtcd
) -> None:
    daemon = start_daemon(
        tmp_path,
        "node-a",
        [etcd.endpoint],
        overrides=[f"etcd.lease_ttl_s={LEASE_TTL_S}", "train.steps=100000"],
    )
    try:
        wait_for(lambda: daemon.step() >= 3, 120, "node-a to train")
        ticks_before = int((daemon.status() or {})["ticks"])
        before = {m: started(etcd, m) for m in METHODS}
        t0 = time.monotonic()
        time.sleep(WATCH_S)
        calls = {m: started(etcd, m) - before[m] for m in METHODS}
        elapsed = time.monotonic() - t0
        ticks = int((daemon.status() or {})["ticks"]) - ticks_before
        step = daemon.step()
    finally:
        daemon.stop()
    # The round's refresh at most once per refresh_every_s, the keepalive thread's every
    # ttl/3, and one each for the window's two ends; a refresh every round would be 4 a second.
    keepalives, ranges, txns = calls["LeaseKeepAlive"], calls["Range"], calls["Txn"]
    most = elapsed / refresh_every_s(LEASE_TTL_S) + elapsed / (LEASE_TTL_S / 3) + 2
    assert 0 < keepalives <= most, f"{keepalives} keepalives in {elapsed:.1f}s (at most {most:.0f})"
    assert ticks >= elapsed / TICK_S / 2, f"the rounds themselves went on ({ticks} rounds)"
    # A lone daemon's job changes only by its own record, which does not call for a read:
    # one read per MAX_AGE_S, where a read every round would be one per TICK_S (32 here).
    most_reads = elapsed / MAX_AGE_S + 2
    assert 0 < ranges <= most_reads, f"{ranges} reads of the job (at most {most_reads:.0f})"
    # Its record (one transaction each, step changes at most every RECORD_EVERY_S) and a
    # campaign every CAMPAIGN_EVERY_S; campaigning every round alone would be 32 here.
    most_txns = elapsed / RECORD_EVERY_S + 1 + elapsed / CAMPAIGN_EVERY_S + 2
    assert 0 < txns <= most_txns, f"{txns} transactions (at most {most_txns:.0f})"
    assert daemon.events("fenced") == [], "a lease refreshed less often must stay confirmed"
    assert step > 3
