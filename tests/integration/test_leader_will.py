"""The leader's will (daemon/leadership/will.py): its leader lease revoked when its daemon dies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import asdict

import pytest

from daemon.coordination import EtcdSettings
from tests.support.coordinators import MakeCoordinator
from tests.support.harness import wait_for

pytestmark = pytest.mark.integration

# A stand-in daemon: keeps a will for the lease it is given, then waits to be killed.
DAEMON = """
import json, sys, time
from daemon.coordination import EtcdSettings
from daemon.leadership.will import Will
doc = json.loads(sys.stdin.readline())
will = Will(EtcdSettings(**doc["settings"]), doc["lease"])
if doc["cancel"]:
    will.cancel()
print(will.popen.pid, flush=True)
time.sleep(120)
"""


def holds_lease(make: MakeCoordinator, lease: int) -> bool:
    observer = make("observer")
    ttl = observer._call(lambda c: c.get_lease_info(lease)).TTL
    return int(ttl) > 0


def run_daemon(settings: EtcdSettings, lease: int, cancel: bool) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"settings": asdict(settings), "lease": lease, "cancel": cancel}))
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.stdout.readline()  # the will runs (or was cancelled)
    return proc


def test_a_killed_daemons_will_revokes_its_leader_lease_and_a_cancelled_one_does_not(
    etcd_settings: EtcdSettings, make_coordinator: MakeCoordinator
) -> None:
    owner = make_coordinator("owner")
    leases = [int(owner._call(lambda c: c.lease(30)).id) for _ in range(2)]
    kept, revoked = leases
    cancelled = run_daemon(etcd_settings, kept, cancel=True)
    willing = run_daemon(etcd_settings, revoked, cancel=False)
    try:
        for proc in (cancelled, willing):
            proc.send_signal(signal.SIGKILL)  # the daemon dies: its will gets SIGTERM
            proc.wait(10)
        wait_for(
            lambda: not holds_lease(make_coordinator, revoked), 15, "the will to revoke the lease"
        )
        assert holds_lease(make_coordinator, kept)  # cancelled: revoked nothing
    finally:
        for proc in (cancelled, willing):
            proc.kill()
