"""What a host exposes: by default no Phalanx process listens on every interface.

Two hosts (network namespaces) train one job with two-rank groups, so every
listener kind exists: each daemon's HTTP server, the leader's lighthouse, the
lighthouse proxy, rank 0's group store and torchft manager, every rank's healing
server and gloo's pairs. Each is listed with ``ss`` inside its host and must be on
the host's address (or loopback, for what only the host itself dials), never on
0.0.0.0 or ``::``. Setting node.bind_host = "0.0.0.0" is the one way to get that.

And what a hostile client can do with what it reaches (docs/operations.md, "Who can
do what from where"): from another host, the leader's lighthouse port is its gate,
which kills nothing and admits no replica without the job's secret.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from daemon.children import descendants
from tests.support.harness import Daemon, event_time, start_daemon, wait_for
from tests.support.multihost import NEEDS_NAMESPACES, etcd_on, reaches
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


# What an outsider (or a local user through a node's lighthouse proxy) tries. Each
# script prints one word: what happened.
HTTP_KILL = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b"POST /replica/%s/kill HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 0\\r\\n\\r\\n" % sys.argv[3].encode())
got = b""
try:
    while chunk := s.recv(4096):
        got += chunk
except OSError:
    pass
print("ANSWERED" if b"HTTP/" in got else "REFUSED")
"""
# Only a failure to reach the lighthouse counts as refused: a call this torchft does not
# accept (a TypeError, say) would prove nothing, and says so. Against a port that accepts
# and closes, torchft 0.2.0's client raises TimeoutError ("operation was canceled").
FAKE_JOIN = """
import sys
from datetime import timedelta
from torchft._torchft import LighthouseClient
try:
    client = LighthouseClient(f"http://{sys.argv[1]}:{sys.argv[2]}", timedelta(seconds=3))
    client.quorum(replica_id="intruder", timeout=timedelta(seconds=5),
                  address="http://10.0.0.1:1", store_address="10.0.0.1:1", step=0, world_size=1)
    print("JOINED")
except (TimeoutError, ConnectionError, RuntimeError) as e:
    print("REFUSED", type(e).__name__)
except Exception as e:
    print("API_ERROR", type(e).__name__, e)
"""
STATUS_PAGE = """
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/status", timeout=5).read().decode())
"""


def unreachable(outsider: Host, leader_host: Host, member: Host, gate: int) -> str:
    """Why the test cannot go on, with what tells a network fault from the gate's: the
    leader's listening sockets and their queues, and whether a member reaches the gate."""
    listening = leader_host.run(["ss", "-ltn", f"sport = :{gate}"]).stdout
    return (
        f"the test needs the gate reachable from {outsider.address}; a job member reaches "
        f"it: {reaches(member, leader_host, gate)}; the outsider, a second time: "
        f"{reaches(outsider, leader_host, gate)}; the leader's listener:\n{listening}"
    )


def test_from_another_host_the_lighthouse_neither_kills_nor_admits(
    two_hosts: list[tuple[Host, Daemon]], network: Network
) -> None:
    """An outsider that reaches the leader's lighthouse port can neither kill a rank nor
    join the quorum; nor can a local user through a node's lighthouse proxy; the job's
    own nodes still train and heal through the gate."""
    (leader_host, leader), (other_host, other) = sorted(
        two_hosts, key=lambda hd: not hd[1].require_status()["leader"]
    )
    started = leader.events("lighthouse_started")[-1]
    gate, internal = int(started["port"]), int(started["internal_port"])
    # The lighthouse itself is on loopback only; its gate is on the host's address.
    found = phalanx_listeners(leader_host, leader)
    assert {lst.address for lst in found if lst.port == internal} == {"127.0.0.1"}, found
    page = leader_host.run([sys.executable, "-c", STATUS_PAGE, str(internal)])
    victims = sorted(set(re.findall(r"phalanx_group_\d{5}:[0-9a-f-]+", page.stdout)))
    assert len(victims) == 2, page
    outsider = network.add_host("x")
    assert reaches(outsider, leader_host, gate), unreachable(
        outsider, leader_host, other_host, gate
    )
    # The two groups train together before the attack (the fixture waits only for each
    # to train: in CI at 21a3e53's successor one had trained alone and healed its peer's
    # state after the attack began, a heal that was no effect of it).
    wait_for(
        lambda: all(
            any(e["participants"] == 2 for e in d.events("train_step")) for d in (leader, other)
        ),
        120,
        "both groups to train together",
    )
    attacked_at = time.time()
    for victim in victims:
        tried = outsider.run(
            [sys.executable, "-c", HTTP_KILL, leader_host.address, str(gate), victim]
        )
        assert tried.stdout.split() == ["REFUSED"], tried
    joined = outsider.run([sys.executable, "-c", FAKE_JOIN, leader_host.address, str(gate)])
    assert joined.stdout.split()[:1] == ["REFUSED"], joined
    # A local user on the other node, through its lighthouse proxy (the ranks' door).
    proxy = next(
        lst.port
        for lst in phalanx_listeners(other_host, other)
        if lst.pid == other.pid and lst.address == "127.0.0.1"
    )
    local = other_host.run([sys.executable, "-c", HTTP_KILL, "127.0.0.1", str(proxy), victims[0]])
    assert local.stdout.split() == ["REFUSED"], local
    refused = leader.events("lighthouse_gate_refused")
    assert any(e["client"] == outsider.address for e in refused), refused
    # Nothing was killed, nobody else joined; the two groups keep training together.
    step = leader.step()
    wait_for(lambda: leader.step() > step + 5, 60, "training to go on")
    for d in (leader, other):
        assert not d.events("group_restarted"), d.events("group_restarted")
    after = [e for e in leader.events("train_step") if event_time(e) > attacked_at]
    assert after and all(e["participants"] == 2 for e in after), after[-3:]
    page = leader_host.run([sys.executable, "-c", STATUS_PAGE, str(internal)])
    assert "intruder" not in page.stdout
    # And a real failure still heals through the gate.
    os.kill(other.require_status()["pids"][0], signal.SIGKILL)
    killed_at = time.time()
    wait_for(
        lambda: [e for e in other.events("heal_done") if event_time(e) > killed_at],
        120,
        "the killed group to heal",
    )
