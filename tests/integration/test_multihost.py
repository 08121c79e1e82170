"""Phalanx across hosts: each host a network namespace with its own address and loopback.

etcd runs on a host of its own; every daemon advertises its host's address. Nothing
here may work by accident of a shared 127.0.0.1: a rank that dials its own loopback
for a peer's store finds nothing there.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import (
    HOLD_PACE_S,
    Daemon,
    event_time,
    hurry,
    largest_step_gap,
    start_daemon,
    wait_for,
)
from tests.support.job_queries import digest
from tests.support.multihost import NEEDS_NAMESPACES, etcd_on, reaches
from tests.support.netns import Network

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]


def test_the_harness_cuts_and_heals_links(network: Network) -> None:
    """Partition primitives: a cut drops one pair only, isolate drops a host from all."""
    a, b, c = (network.add_host(n) for n in ("a", "b", "c"))
    server = c.popen(
        [sys.executable, "-c", f"import socket, time; s = socket.create_server(('{c.address}', 7000)); time.sleep(60)"]
    )  # fmt: skip
    try:
        wait_for(lambda: reaches(a, c, 7000), 10, "host c's listener")
        assert reaches(b, c, 7000)
        network.cut(a, c)
        assert not reaches(a, c, 7000) and reaches(b, c, 7000)
        network.heal(a, c)
        assert reaches(a, c, 7000)
        network.isolate(c)
        assert not reaches(a, c, 7000) and not reaches(b, c, 7000)
        network.rejoin(c)
        wait_for(lambda: reaches(a, c, 7000), 10, "host c back on the bridge")
        # Each host's loopback is its own: c's listener is not on a's 127.0.0.1.
        assert a.run([sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 7000), timeout=1)"]).returncode != 0  # fmt: skip
    finally:
        server.kill()
        server.wait()


def test_two_hosts_train_heal_a_killed_group_and_agree(tmp_path: Path, network: Network) -> None:
    """One group per host: both train together across the bridge; host b's ranks are
    SIGKILLed; its daemon restarts them and they heal from host a; both end equal."""
    etcd_host, a_host, b_host = (network.add_host(n) for n in ("etcd", "a", "b"))
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    overrides = ["train.steps=80", "ft.timeout_s=20", "ft.quorum_timeout_s=30"]
    a = b = None
    try:
        # At HOLD_PACE_S until hurried: under 40 of the 80 steps are spent waiting.
        a = start_daemon(
            tmp_path, "node-a", [endpoint], overrides=overrides, host=a_host, pace_s=HOLD_PACE_S
        )
        b = start_daemon(
            tmp_path, "node-b", [endpoint], overrides=overrides, host=b_host, pace_s=HOLD_PACE_S
        )
        together = wait_for(
            lambda: [e for e in b.events("train_step") if e.get("participants") == 2],
            180,
            "both hosts' groups to commit a step together",
        )
        assert together
        os.kill(b.rank_pids()[0], signal.SIGKILL)
        restarted = wait_for(lambda: b.events("group_restarted"), 60, "host b's group to restart")
        # The restarted ranks' heal: b's first ranks may have healed at step 1 too.
        wait_for(
            lambda: [e for e in b.events("heal_done") if event_time(e) > event_time(restarted[0])],
            120,
            "host b's restarted group to heal from host a",
        )
        hurry(a, b)
        assert a.wait(240) == 0, a.proc.tail()
        assert b.wait(120) == 0, b.proc.tail()
        assert not a.events("group_restarted"), "host a's group was restarted"
        assert digest(a) == digest(b)
    finally:
        for d in (a, b):
            if d is not None:
                d.stop()
        etcd.stop()


def test_three_hosts_lose_the_leaders_host_and_the_others_never_restart(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """SIGKILL the leader host's daemon (its ranks die with it): another host starts a
    lighthouse and leads; the two other hosts' ranks are told it moved (their daemon's
    notice, ``lighthouse_moved``) and train on, never restarted, without waiting out
    ``ft.timeout_s`` (its default, 30 s, is left alone here)."""
    etcd_host = network.add_host("etcd")
    hosts = [network.add_host(n) for n in ("a", "b", "c")]
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    overrides = [
        "job.max_replicas=3",
        "train.steps=100",  # at HOLD_PACE_S until hurried: under 50 are spent waiting
        "ft.quorum_timeout_s=30",
    ]
    daemons: list[Daemon] = []
    try:
        for h in hosts:
            node = f"node-{h.name}"
            daemons.append(
                start_daemon(
                    tmp_path, node, [endpoint], overrides=overrides, host=h, pace_s=HOLD_PACE_S
                )
            )
        wait_for(
            lambda: all(
                any(e.get("participants") == 3 for e in d.events("train_step")) for d in daemons
            ),
            180,
            "three hosts' groups to commit a step together",
        )
        leader = next(d for d in daemons if d.require_status()["leader"])
        others = [d for d in daemons if d is not leader]
        pids = {d.node_id: d.rank_pids() for d in others}
        killed_at = time.time()
        os.kill(leader.pid, signal.SIGKILL)
        wait_for(
            lambda: any(d.events("lighthouse_started") for d in others),
            60,
            "another host to start a lighthouse",
        )
        hurry(*others)
        for d in others:
            assert d.wait(240) == 0, d.proc.tail()
    finally:
        for d in daemons:
            d.stop()
        etcd.stop()
    for d in others:
        assert not d.events("group_restarted") and not d.events("group_failed"), d.node_id
        assert d.events("group_started")[0]["pids"] == pids[d.node_id]
        told = [e for e in d.events("lighthouse_moved") if event_time(e) > killed_at]
        assert told, f"{d.node_id}'s ranks were not told the lighthouse moved"
    gap = max(largest_step_gap(d.events(), killed_at) for d in others)
    recovery("leader host SIGKILLed: the others' longest pause between commits", gap)
    assert gap < 30.0, "the survivors waited out ft.timeout_s"
    assert digest(others[0]) == digest(others[1])
