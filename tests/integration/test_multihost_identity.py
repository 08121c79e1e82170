"""Who a node is, and who may lead, across hosts (each a network namespace).

A node id held by a live daemon on another host is refused with exit 2, naming
that host; a leader whose lighthouse cannot start resigns and another node leads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import event_time, start_daemon, wait_for
from tests.support.job_queries import digest
from tests.support.multihost import NEEDS_NAMESPACES, etcd_on
from tests.support.netns import Network
from tests.support.ports import free_port

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]


def test_a_node_id_held_on_another_host_is_refused(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """Host b starts a daemon with host a's node id: b waits out one lease TTL, then exits 2
    with one error naming host a; a trains on untouched."""
    etcd_host, a_host, b_host = (network.add_host(n) for n in ("etcd", "a", "b"))
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    a = b = None
    try:
        a = start_daemon(
            tmp_path / "a", "node-x", [endpoint], overrides=["train.steps=100000"], host=a_host
        )
        wait_for(lambda: a.step() > 3, 120, "host a to train")
        pids = a.rank_pids()
        b = start_daemon(
            tmp_path / "b", "node-x", [endpoint], overrides=["train.steps=100000"], host=b_host
        )
        assert b.wait(60) == 2, b.proc.tail()
        held = b.events("node_id_held")
        assert held and a_host.address in held[0]["error"]
        failed = b.events("node_failed")
        assert len(failed) == 1 and a_host.address in failed[0]["error"], failed
        assert "node id 'node-x' is held by a live daemon" in failed[0]["error"]
        assert not b.events("slot_claimed") and not b.events("group_started")
        refused = event_time(failed[0]) - event_time(held[0])
        recovery("duplicate node id: refused (exit 2) after first seeing it held", refused)
        step = a.step()
        wait_for(lambda: a.step() > step + 3, 60, "host a to keep training")
        assert a.rank_pids() == pids and a.proc.popen.poll() is None
        assert not a.events("group_restarted") and not a.events("slot_lost")
        assert a.require_status()["replica_group"] == 0
    finally:
        for d in (a, b):
            if d is not None:
                d.stop()
        etcd.stop()


def test_a_leader_whose_lighthouse_port_is_taken_resigns_and_another_leads(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    """Host a leads first, but its lighthouse port is taken: it says why and resigns; host
    b then leads, and both groups train to the end on b's lighthouse."""
    etcd_host, a_host, b_host = (network.add_host(n) for n in ("etcd", "a", "b"))
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    port = free_port()
    squatter = a_host.popen(
        [sys.executable, "-c", f"import socket, time; s = socket.create_server(('0.0.0.0', {port})); time.sleep(300)"]
    )  # fmt: skip
    overrides = ["train.steps=60", f"node.lighthouse_port={port}", "ft.quorum_timeout_s=30"]
    a = b = None
    try:
        a = start_daemon(tmp_path, "node-a", [endpoint], overrides=overrides, host=a_host)
        failed = wait_for(lambda: a.events("lighthouse_failed"), 60, "host a's lighthouse to fail")
        assert a.events("leader_elected"), "host a never led"
        assert f"node.lighthouse_port {port}" in failed[0]["error"], failed
        assert failed[0]["action"] == "resigning leadership"
        wait_for(lambda: not a.require_status()["leader"], 10, "host a to resign")
        b = start_daemon(tmp_path, "node-b", [endpoint], overrides=overrides, host=b_host)
        wait_for(lambda: b.events("lighthouse_started"), 60, "host b to lead")
        assert a.wait(240) == 0, a.proc.tail()
        assert b.wait(120) == 0, b.proc.tail()
    finally:
        squatter.kill()
        squatter.wait()
        for d in (a, b):
            if d is not None:
                d.stop()
        etcd.stop()
    # While b led, a never tried again. Once b has left at the job's end (a's rank, slower
    # to start under load, still finishing), a may try: nobody else is left to lead.
    b_left = event_time(b.events("leader_resigned")[-1])
    tries = [e for e in a.events("lighthouse_failed") if event_time(e) < b_left]
    assert len(tries) == 1, "host a tried to lead again while b led"
    published = b.events("lighthouse_published")
    assert published and str(published[0]["address"]).startswith(f"{b_host.address}:")
    assert not a.events("lighthouse_published")
    resigned = event_time(a.events("lighthouse_failed")[0]) - event_time(
        a.events("leader_elected")[0]
    )
    recovery("lighthouse port taken: leader resigned after its election", resigned)
    took_over = event_time(published[0]) - event_time(b.events("node_registered")[0])
    recovery("lighthouse port taken: next node's lighthouse published after it joined", took_over)
    assert digest(a) == digest(b)
