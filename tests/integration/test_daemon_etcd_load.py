"""What a training daemon asks of etcd in the steady state (issues 14 and 35).

On a node whose cores the ranks use, every request is CPU taken from them, twice: the
daemon's and etcd's; and at a thousand nodes every write is an event each other daemon
receives. In the steady state a daemon sends its lease keepalives (about one a second,
``daemon.coordination.lease_timing.refresh_every_s``) and its progress every
``PROGRESS_EVERY_S``, and nothing else: no read of the job (the watch keeps its copy,
``daemon.coordination.job_cache``), no record write while nothing in it changes, no
campaign while a leader holds the key. The daemon here is alone, so it leads: since
issue 36 the leader also keeps its own short lease alive (``leader_lease``), on the one
node of a job that leads, and those keepalives are counted apart.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyetcd
import pytest

from daemon.coordination.leader_lease import DEFAULT_LEADER_TTL_S, leader_refresh_s
from daemon.coordination.lease_timing import refresh_every_s
from daemon.coordination.progress import PROGRESS_EVERY_S
from daemon.supervision.node_record import RECORD_GAP_S
from daemon.supervision.supervisor import TICK_S
from tests.support.etcd_control import ControlledEtcd
from tests.support.etcd_metrics import calls, counter
from tests.support.harness import start_daemon, wait_for

pytestmark = pytest.mark.integration
LEASE_TTL_S = 10
WATCH_S = 8.0
JOB = "itest"  # tests/integration/daemon_job.toml
MOST_REQUESTS_PER_S = 2.0  # issue 35's steady-state target per node


def record(etcd: ControlledEtcd) -> dict[str, Any]:
    host, port = etcd.endpoint.split(":")
    client = pyetcd.client(host=host, port=int(port), timeout=5)
    try:
        value, _ = client.get(f"/phalanx/{JOB}/nodes/node-a")
    finally:
        client.close()
    return json.loads(value) if value else {}


def requests(etcd: ControlledEtcd) -> dict[str, int]:
    return {
        "keepalive": counter(etcd, "grpc_server_msg_received_total", "LeaseKeepAlive"),
        **{m: calls(etcd, m) for m in ("Range", "Txn", "Put")},
    }


def test_a_training_daemon_sends_keepalives_and_rare_progress_and_nothing_else(
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
        # The record's last change is the ranks' start (state running, their pids), held
        # back up to RECORD_GAP_S; from then on nothing in it changes while the node trains.
        wait_for(lambda: record(etcd).get("state") == "running", 30, "the record to say running")
        wait_for(lambda: bool(record(etcd).get("pids")), 30, "the record to hold the ranks")
        time.sleep(RECORD_GAP_S + 2 * TICK_S)
        assert daemon.require_status()["leader"], "alone, the daemon leads"
        ticks_before = int((daemon.status() or {})["ticks"])
        published = len(daemon.events("checkpoint_published"))
        before = requests(etcd)
        t0 = time.monotonic()
        time.sleep(WATCH_S)
        after = requests(etcd)
        elapsed = time.monotonic() - t0
        ticks = int((daemon.status() or {})["ticks"]) - ticks_before
        published = len(daemon.events("checkpoint_published")) - published
        step = daemon.step()
    finally:
        daemon.stop()
    sent = {k: after[k] - before[k] for k in after}
    assert ticks >= elapsed / TICK_S / 2, f"the rounds themselves went on ({ticks} rounds)"
    # The keepalive threads' refreshes, at most one per refresh_every_s for the node lease
    # and one per leader_refresh_s for the leader lease, and one each for the window's ends.
    leader_most = elapsed / leader_refresh_s(DEFAULT_LEADER_TTL_S) + 2
    most = elapsed / refresh_every_s(LEASE_TTL_S) + 2 + leader_most
    assert 0 < sent["keepalive"] <= most, f"{sent['keepalive']} keepalives (at most {most:.0f})"
    assert sent["Range"] == 0, "the job was read again although only this node wrote"
    # A checkpoint's publication is one transaction; nothing else is (no record write,
    # no campaign) while nothing changes.
    assert sent["Txn"] == published, f"{sent['Txn']} transactions, {published} checkpoints"
    assert sent["Put"] <= elapsed / PROGRESS_EVERY_S + 1, f"{sent['Put']} progress writes"
    # Per node, as for every node that does not lead: all but the leader lease's keepalives.
    per_s = (sum(sent.values()) - min(sent["keepalive"], leader_most)) / elapsed
    assert per_s <= MOST_REQUESTS_PER_S, f"{per_s:.2f} requests a second: {sent}"
    assert daemon.events("fenced") == [], "a lease refreshed less often must stay confirmed"
    assert step > 3
