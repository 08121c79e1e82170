"""What a training daemon asks of etcd in the steady state (issue 14, failure-free overhead).

On a node whose cores the ranks use, every request is CPU taken from them, twice: the
daemon's and etcd's. The supervisor's round runs four times a second; the lease needs a
keepalive about once a second at most (``daemon.fencing.refresh_every_s``).
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from daemon.fencing import refresh_every_s
from tests.etcd_control import ControlledEtcd
from tests.harness import start_daemon, wait_for

pytestmark = pytest.mark.integration
LEASE_TTL_S = 10
WATCH_S = 8.0


def started(etcd: ControlledEtcd, method: str) -> int:
    """How many gRPC calls of `method` etcd has started (its own Prometheus counter)."""
    with urllib.request.urlopen(f"{etcd.metrics_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    needle = f'grpc_method="{method}"'
    lines = [ln for ln in text.splitlines() if ln.startswith("grpc_server_started_total{")]
    return sum(int(float(ln.rsplit(" ", 1)[1])) for ln in lines if needle in ln)


def test_a_training_daemon_keeps_its_lease_alive_without_a_keepalive_every_round(
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
        before, ranges_before = started(etcd, "LeaseKeepAlive"), started(etcd, "Range")
        t0 = time.monotonic()
        time.sleep(WATCH_S)
        keepalives = started(etcd, "LeaseKeepAlive") - before
        ranges = started(etcd, "Range") - ranges_before
        elapsed = time.monotonic() - t0
        step = daemon.step()
    finally:
        daemon.stop()
    # The round's refresh at most once per refresh_every_s, the keepalive thread's every
    # ttl/3, and one each for the window's two ends; a refresh every round would be 4 a second.
    most = elapsed / refresh_every_s(LEASE_TTL_S) + elapsed / (LEASE_TTL_S / 3) + 2
    assert 0 < keepalives <= most, f"{keepalives} keepalives in {elapsed:.1f}s (at most {most:.0f})"
    assert ranges > keepalives, "the rounds themselves went on (one snapshot read each)"
    assert daemon.events("fenced") == [], "a lease refreshed less often must stay confirmed"
    assert step > 3
