"""The etcd coordination layer against a real embedded etcd (no mocks)."""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from daemon.coordination.coordinator import (
    Coordinator,
    EtcdSettings,
    NodeIdHeld,
    NotLeader,
)
from daemon.coordination.etcd_server import EmbeddedEtcd, EtcdStartError, find_etcd_binary
from daemon.coordination.identity import Identity, new_instance
from tests.support.coordinators import MakeCoordinator, wait_for
from tests.support.etcd_control import ControlledEtcd
from tests.support.etcd_metrics import calls

pytestmark = pytest.mark.integration


@pytest.fixture
def make(make_coordinator: MakeCoordinator) -> MakeCoordinator:
    return make_coordinator


# ------------------------------------------------------------------- embedded etcd


def test_embedded_etcd_lifecycle(tmp_path: Path) -> None:
    assert os.access(find_etcd_binary(), os.X_OK)
    server = EmbeddedEtcd(tmp_path / "etcd")
    with server:
        host, port = server.endpoint.split(":")
        assert host == "127.0.0.1" and port.isdigit()
        pid = server.pid
        assert pid is not None and server.running
        assert server.log_path == tmp_path / "etcd.log" and server.log_path.stat().st_size > 0
    assert not server.running and server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # A second start is a fresh store: the old data dir is wiped.
    with EmbeddedEtcd(tmp_path / "etcd") as again:
        c = Coordinator(EtcdSettings([again.endpoint]), "demo", "a", 5)
        try:
            assert c.snapshot().spec is None
        finally:
            c.close()


def test_embedded_etcd_refuses_to_wipe_a_foreign_dir(tmp_path: Path) -> None:
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(EtcdStartError, match="refusing to wipe"):
        EmbeddedEtcd(tmp_path / "precious").start()
    assert (tmp_path / "precious" / "notes.txt").exists()


# ------------------------------------------------------------------ nodes, slots


def test_register_and_snapshot(make: MakeCoordinator) -> None:
    a = make("a")
    record = {"host": "10.0.0.1", "ports": {"metrics": 9100}, "pid": 42, "state": "starting"}
    a.register(record)
    a.register({**record, "state": "running"})
    view = a.snapshot()
    assert view.nodes == {"a": {**record, "state": "running", "instance": a.identity.instance}}
    json.dumps(dataclasses.asdict(view))  # JSON-able as documented


def raw_value(c: Coordinator, name: str) -> bytes:
    value, _ = c._call(lambda client: client.get(c._key(name)))
    return bytes(value)


def test_a_node_id_is_one_process_and_its_successor_takes_over(
    etcd_settings: EtcdSettings, make: MakeCoordinator
) -> None:
    """A second process with the same node id is refused; the next process on the same
    run directory (the predecessor's successor) takes the record, slot and leader key."""
    first = make("a")
    first.register({"host": "10.0.0.1", "pid": 1})
    assert first.claim_slot(2, preferred=1) == 1 and first.campaign()
    assert json.loads(raw_value(first, "groups/1")) == {
        "node": "a",
        "instance": first.identity.instance,
    }
    twin = Coordinator(etcd_settings, "demo", "a", 10)
    successor = Coordinator(
        etcd_settings, "demo", "a", 10, Identity("a", new_instance(), first.identity.instance)
    )
    try:
        for c in (twin, successor):
            c.connect()
            c.ensure_session()
        with pytest.raises(
            NodeIdHeld, match=r"node id 'a' is held by a live daemon on 10\.0\.0\.1"
        ):
            twin.register({"host": "10.0.0.2", "pid": 2})
        successor.register({"host": "10.0.0.1", "pid": 3})
        assert successor.claim_slot(2) == 1 and successor.campaign()
        view = successor.snapshot()
        assert view.groups == {1: "a"} and view.leader == "a"
        assert view.nodes["a"]["instance"] == successor.identity.instance
        for key in ("groups/1", "leader"):
            held = json.loads(raw_value(successor, key))
            assert held["instance"] == successor.identity.instance, key
        first.close()  # the predecessor's lease goes: nothing of the successor's goes with it
        assert successor.snapshot().groups == {1: "a"}
    finally:
        twin.close()
        successor.close()


def test_two_nodes_claim_slots_zero_and_one(make: MakeCoordinator) -> None:
    a, b, c = make("a"), make("b"), make("c")
    assert a.claim_slot(2) == 0
    assert b.claim_slot(2) == 1
    assert a.claim_slot(2) == 0  # already held: same slot
    assert c.claim_slot(2) is None
    assert a.snapshot().groups == {0: "a", 1: "b"}


def test_preferred_slot_honoured(make: MakeCoordinator) -> None:
    a, b = make("a"), make("b")
    assert a.claim_slot(4, preferred=2) == 2
    assert b.claim_slot(4, preferred=2) == 0  # taken: lowest free
    assert b.claim_slot(4, preferred=3) == 0  # already holds one


def test_release_slot_only_by_holder(make: MakeCoordinator) -> None:
    a, b = make("a"), make("b")
    assert a.claim_slot(2) == 0
    b.release_slot(0)
    assert a.snapshot().groups == {0: "a"}
    a.release_slot(0)
    assert a.snapshot().groups == {}


def test_close_frees_slot_and_leadership_at_once(make: MakeCoordinator) -> None:
    a, b = make("a"), make("b")
    a.register({"host": "h"})
    assert a.claim_slot(2) == 0 and a.campaign()
    a.publish_lighthouse("127.0.0.1:29510")
    a.close()
    view = b.snapshot()
    assert view.nodes == {} and view.groups == {}
    assert view.leader is None and view.lighthouse is None
    assert b.claim_slot(2, preferred=0) == 0
    assert b.campaign()


def test_lease_expiry_frees_slot_leader_and_lighthouse(make: MakeCoordinator) -> None:
    a, b = make("a", ttl=3), make("b")  # the TTL must exceed etcd.timeout_s (2 s)
    a.register({"host": "h"})
    assert a.claim_slot(2) == 0 and a.campaign()
    a.publish_lighthouse("127.0.0.1:29510")
    a.close(revoke=False)  # the node dies: no keepalive, no revoke

    def expired() -> bool:
        view = b.snapshot()
        return not view.nodes and not view.groups and view.leader is None

    wait_for(expired, 10, "the dead node's lease to expire")
    assert b.snapshot().lighthouse is None
    assert b.claim_slot(2, preferred=0) == 0
    assert b.campaign()
    assert b.snapshot().leader == "b"


JOINERS = 32
MOST_CLAIM_TXNS = 2.5  # per joiner; trying the lowest free slot first took ~N/2 = 16


def test_concurrent_joiners_take_distinct_slots_with_few_collisions(
    make: MakeCoordinator, etcd: ControlledEtcd
) -> None:
    """Many nodes joining at once (registered, then claiming together, as after a cluster
    start) spread over the lowest slots instead of all racing for the lowest free one."""
    nodes = [make(f"joiner-{i:02d}") for i in range(JOINERS)]
    for c in nodes:
        c.register({"state": "claiming"})
    txns = calls(etcd, "Txn")
    with ThreadPoolExecutor(JOINERS) as pool:
        slots = list(pool.map(lambda c: c.claim_slot(JOINERS), nodes))
    used = calls(etcd, "Txn") - txns
    assert sorted(s for s in slots if s is not None) == list(range(JOINERS)), slots
    assert used <= MOST_CLAIM_TXNS * JOINERS, f"{used} claim transactions for {JOINERS} joiners"
    assert nodes[0].claim_slot(JOINERS) == slots[0], "a node keeps the slot it holds"
    late = make("late")
    late.register({"state": "claiming"})
    assert late.claim_slot(JOINERS) is None, "every slot taken: the late node is a spare"


def test_progress_lives_outside_the_job_and_an_answer_is_newer_than_the_ask(
    make: MakeCoordinator,
) -> None:
    a, b = make("a"), make("b")
    a.put_progress({"step": 3})
    assert a.snapshot().nodes == {}, "progress is not under the watched job prefix"
    first = b.ask_progress()
    asked = b.snapshot().progress_asked
    assert a.read_progress()["a"].revision < first, "written before the ask: no answer"
    a.put_progress({"step": 4})
    progress = b.read_progress()
    assert progress["a"].step == 4 and progress["a"].revision > first
    assert b.ask_progress() > first and b.snapshot().progress_asked != asked, (
        "a second ask by the same node must be a new value, or no daemon answers it"
    )
    a.close()
    assert "a" not in b.read_progress(), "progress goes with the node's lease"


# --------------------------------------------------------------------- leadership


def test_exactly_one_leader(make: MakeCoordinator) -> None:
    nodes = [make(f"n{i}") for i in range(4)]
    with ThreadPoolExecutor(len(nodes)) as pool:
        won = list(pool.map(lambda c: c.campaign(), nodes))
    assert won.count(True) == 1
    leader = nodes[won.index(True)]
    assert leader.snapshot().leader == leader.node_id
    assert leader.campaign()  # already the leader
    assert [c.campaign() for c in nodes].count(True) == 1


def test_lighthouse_only_while_leader(make: MakeCoordinator) -> None:
    a, b = make("a"), make("b")
    assert a.campaign() and not b.campaign()
    with pytest.raises(NotLeader):
        b.publish_lighthouse("127.0.0.1:1")
    a.publish_lighthouse("127.0.0.1:29510")
    assert b.snapshot().lighthouse == "127.0.0.1:29510"
    b.resign()  # not the leader: no effect
    assert b.snapshot().leader == "a"
    a.resign()
    view = b.snapshot()
    assert view.leader is None and view.lighthouse is None
    assert b.campaign()


def test_a_suspected_leader_is_deposed_only_while_it_holds_the_key(
    make: MakeCoordinator,
) -> None:
    """``suspects/<node>`` is each watcher's, on its own lease, and shows in every view;
    deposing deletes the leader, lighthouse and lost keys only while the suspected node
    still holds the key (daemon.leadership.unreachable)."""
    a, b, c = make("a"), make("b"), make("c")
    assert a.campaign()
    a.publish_lighthouse("10.0.0.1:29510")
    a.announce_lost(3, ["g1"], "10.0.0.1:29510")
    epoch = b.snapshot().leader_epoch
    b.suspects.suspect("a", epoch)
    c.suspects.suspect("a", epoch)
    assert a.snapshot().suspects == {
        "b": {"leader": "a", "epoch": epoch},
        "c": {"leader": "a", "epoch": epoch},
    }
    assert not b.suspects.depose("c")  # not the holder: nothing deleted
    assert a.snapshot().leader == "a"
    assert b.suspects.depose("a")
    view = c.snapshot()
    assert view.leader is None and view.lighthouse is None and view.lost is None
    assert not c.suspects.depose("a")  # already gone
    assert c.campaign() and c.snapshot().leader == "c"
    b.suspects.clear()
    c.close()  # its suspicion goes with its lease
    assert b.snapshot().suspects == {}


# ----------------------------------------------------------------- persistent keys


def test_state_and_checkpoint_persist_newest_wins(make: MakeCoordinator) -> None:
    a, b = make("a"), make("b")
    a.set_state("running", 10, note="x")
    a.publish_checkpoint({"step": 20, "path": "/c/step-20"})
    b.publish_checkpoint({"step": 10, "path": "/c/step-10"})  # older: ignored
    a.close()  # persistent keys are not bound to the lease
    view = b.snapshot()
    assert view.state == {"state": "running", "step": 10, "note": "x"}
    assert view.checkpoint == {"step": 20, "path": "/c/step-20"}
    b.publish_checkpoint({"step": 30, "path": "/c/step-30"})
    b.set_state("completed", 30)
    view = b.snapshot()
    assert view.checkpoint is not None and view.checkpoint["step"] == 30
    assert view.state == {"state": "completed", "step": 30}
