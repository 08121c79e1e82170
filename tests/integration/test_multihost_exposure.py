"""What a host exposes: by default no Phalanx process listens on every interface.

Two hosts (network namespaces) train one job with two-rank groups, so every
listener kind exists: each daemon's HTTP server, the leader's lighthouse, the
lighthouse proxy, rank 0's group store and torchft manager, every rank's healing
server and gloo's pairs. Each is listed with ``ss`` inside its host and must be on
the host's address (or loopback, for what only the host itself dials), never on
0.0.0.0 or ``::``. Setting node.bind_host = "0.0.0.0" is the one way to get that.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from daemon.children import descendants
from tests.support.harness import Daemon, start_daemon, wait_for
from tests.support.multihost import NEEDS_NAMESPACES, etcd_on
from tests.support.netns import Host, Network
from tests.support.sockets import Listener, listeners

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]

OVERRIDES = ["node.nproc=2", "parallel.dp_shard=2", "train.steps=100000"]


def phalanx_listeners(host: Host, daemon: Daemon) -> list[Listener]:
    tree = {daemon.proc.pid, *descendants(daemon.proc.pid)}
    return [lst for lst in listeners(host.argv([])) if lst.pid in tree]


def trained(daemon: Daemon) -> bool:
    return daemon.step() > 3


def by_pid(found: list[Listener]) -> dict[int, list[Listener]]:
    grouped: dict[int, list[Listener]] = {}
    for lst in found:
        grouped.setdefault(lst.pid, []).append(lst)
    return grouped


@pytest.fixture
def two_hosts(tmp_path: Path, network: Network) -> Iterator[list[tuple[Host, Daemon]]]:
    etcd_host, a_host, b_host = (network.add_host(n) for n in ("etcd", "a", "b"))
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    daemons: list[Daemon] = []
    try:
        for host in (a_host, b_host):
            daemons.append(
                start_daemon(
                    tmp_path, f"node-{host.name}", [endpoint], overrides=OVERRIDES, host=host
                )
            )
        for d in daemons:
            wait_for(partial(trained, d), 180, f"{d.node_id} to train")
        yield list(zip((a_host, b_host), daemons, strict=True))
    finally:
        for d in daemons:
            d.stop()
        etcd.stop()


def test_no_phalanx_process_listens_on_every_interface(
    two_hosts: list[tuple[Host, Daemon]],
) -> None:
    leaders = 0
    for host, daemon in two_hosts:
        found = phalanx_listeners(host, daemon)
        wide = [lst for lst in found if lst.on_every_interface]
        assert not wide, f"{host.name}: listening on every interface: {wide}"
        # Everything is on the host's address, or on loopback (the lighthouse proxy).
        assert {lst.address for lst in found} <= {host.address, "127.0.0.1"}, found
        # Every kind of listener was there to be seen, so the check above saw them all.
        mine = by_pid(found)
        status = daemon.require_status()
        assert (host.address, daemon.http_port) in {
            (lst.address, lst.port) for lst in mine[daemon.proc.pid]
        }, mine
        ranks = status["pids"]
        assert len(ranks) == 2 and all(mine.get(pid) for pid in ranks), mine
        # rank 0: group store, torchft manager, healing server (and gloo): at least 3
        assert len(mine[ranks[0]]) >= 3, mine[ranks[0]]
        started = daemon.events("lighthouse_started")
        if started and status["leader"]:
            leaders += 1
            port = int(started[-1]["port"])
            assert any(lst.port == port and lst.address == host.address for lst in found)
    assert leaders == 1
