"""Hosts whose hostname resolves to 127.0.0.1, node.advertise_host unset (issue 34).

Each host is a network namespace whose /etc/hosts maps the hostname to loopback, and
etcd runs on a host of its own. Before, every node advertised the loopback name: one
group trained every step alone and the others never joined a quorum, all exiting 0.
Now each daemon advertises its address on the route to etcd, and every group trains
replicated; a loopback address set explicitly, or one address advertised from two
machines, is refused with exit 2.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import Daemon, event_time, start_daemon, wait_for
from tests.support.job_queries import digest
from tests.support.multihost import (
    NEEDS_NAMESPACES,
    etcd_on,
    hostname_is_loopback,
    job_without_advertise_host,
)
from tests.support.netns import Network

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]


def test_three_hosts_with_a_loopback_hostname_train_replicated(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """No node.advertise_host: each daemon advertises its host's address (the route to
    etcd), all three groups commit steps together and end with equal digests."""
    etcd_host = network.add_host("etcd")
    hosts = [network.add_host(n) for n in ("a", "b", "c")]
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    job = job_without_advertise_host(tmp_path)
    overrides = ["job.max_replicas=3", "train.steps=60", "ft.quorum_timeout_s=30"]
    daemons: list[Daemon] = []
    with hostname_is_loopback(hosts) as hostname:
        try:
            for h in hosts:
                daemons.append(
                    start_daemon(
                        tmp_path, f"node-{h.name}", [endpoint], config=job,
                        overrides=overrides, host=h, advertise=False,
                    )
                )  # fmt: skip
            for d in daemons:
                assert d.wait(240) == 0, d.proc.tail()
        finally:
            for d in daemons:
                d.stop()
            etcd.stop()
    for d, h in zip(daemons, hosts, strict=True):
        chosen = d.events("advertise_host_chosen")
        assert chosen and chosen[0]["address"] == h.address, (d.node_id, chosen)
        assert repr(hostname) in chosen[0]["why"] and endpoint in chosen[0]["why"]
        assert d.events("node_registered")[0]["host"] == h.address
        steps = [e for e in d.events("train_step") if e["step"] > 1]
        assert steps and all(e["participants"] == 3 for e in steps[-3:]), (d.node_id, steps)
        assert not d.events("never_replicated"), d.node_id
    assert digest(daemons[0]) == digest(daemons[1]) == digest(daemons[2])
    together = min(event_time(e) for e in daemons[0].events("train_step") if e["participants"] == 3)
    started = max(event_time(d.events("daemon_started")[0]) for d in daemons)
    recovery(
        "loopback hostname: first step of all 3 groups after the last daemon started",
        together - started,
    )


def test_a_loopback_advertise_host_set_with_a_remote_etcd_is_refused(
    tmp_path: Path, network: Network
) -> None:
    etcd_host, a_host = network.add_host("etcd"), network.add_host("a")
    etcd = etcd_on(etcd_host, tmp_path)
    try:
        a = start_daemon(
            tmp_path, "node-a", [f"{etcd_host.address}:2379"], host=a_host, advertise=False
        )  # the job file's node.advertise_host = "127.0.0.1"
        assert a.wait(60) == 2, a.proc.tail()
    finally:
        etcd.stop()
    err = a.proc.stderr.read_text()
    assert "error: node.advertise_host '127.0.0.1' is a loopback address" in err, err
    assert not a.events("daemon_started")


def test_one_address_advertised_from_two_hosts_is_refused(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """Hosts a and b both hold (and advertise) one extra address: b is refused at join
    with exit 2 naming both nodes; a is untouched."""
    etcd_host, a_host, b_host = (network.add_host(n) for n in ("etcd", "a", "b"))
    shared = f"{network.prefix}.250"
    for h in (a_host, b_host):
        network.add_address(h, shared)
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    settings = [f'node.advertise_host="{shared}"', "train.steps=100000"]
    a = b = None
    try:
        a = start_daemon(tmp_path, "node-a", [endpoint], overrides=settings, host=a_host)
        wait_for(lambda: a.events("node_registered"), 60, "host a to register")
        b = start_daemon(tmp_path, "node-b", [endpoint], overrides=settings, host=b_host)
        assert b.wait(60) == 2, b.proc.tail()
        assert a.proc.popen.poll() is None and not a.events("node_failed")
    finally:
        for d in (a, b):
            if d is not None:
                d.stop()
        etcd.stop()
    failed = b.events("node_failed")
    assert len(failed) == 1 and failed[0]["code"] == 2, failed
    error = failed[0]["error"]
    assert "'node-b'" in error and "'node-a'" in error and "node.advertise_host" in error
    assert shared in error and not b.events("slot_claimed")
    refused = event_time(failed[0]) - event_time(b.events("daemon_started")[0])
    recovery("one address from two hosts: refused (exit 2) after the daemon started", refused)
