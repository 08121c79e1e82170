"""The node's etcd lease against a real embedded etcd (no mocks): writes bound to it need
one, and it survives a paused or restarted etcd, or is replaced once etcd expired it."""

from __future__ import annotations

import time

import pytest

from daemon.coordination.coordinator import (
    CoordinationError,
    Coordinator,
    EtcdSettings,
    EtcdUnavailable,
)
from tests.support.coordinators import MakeCoordinator, reachable, wait_for
from tests.support.etcd_control import ControlledEtcd

pytestmark = pytest.mark.integration


@pytest.fixture
def make(make_coordinator: MakeCoordinator) -> MakeCoordinator:
    return make_coordinator


def test_lease_bound_writes_need_a_session(etcd_settings: EtcdSettings) -> None:
    c = Coordinator(etcd_settings, "demo", "a", 5)
    try:
        with pytest.raises(CoordinationError, match="ensure_session"):
            c.register({"host": "h"})
        assert not c.session_alive
    finally:
        c.close()


# ------------------------------------------------------------------------- outages


def test_paused_etcd_fails_fast_then_same_lease_continues(
    etcd: ControlledEtcd, make: MakeCoordinator
) -> None:
    settings = EtcdSettings([etcd.endpoint], timeout_s=1.0)
    a = make("a", ttl=10, settings=settings)
    a.register({"host": "h"})
    assert a.claim_slot(2) == 0
    etcd.pause()
    try:
        for call in (a.snapshot, a.ensure_session, lambda: a.claim_slot(2)):
            start = time.monotonic()
            with pytest.raises(EtcdUnavailable):
                call()
            assert time.monotonic() - start < settings.timeout_s + 1.0
        assert a.session_alive  # the TTL has not passed
    finally:
        etcd.resume()
    wait_for(lambda: reachable(a), 10, "etcd to answer again")
    assert a.ensure_session() is False  # same lease
    view = a.snapshot()
    assert view.groups == {0: "a"} and "a" in view.nodes


def test_paused_past_ttl_gives_a_new_session(etcd: ControlledEtcd, make: MakeCoordinator) -> None:
    settings = EtcdSettings([etcd.endpoint], timeout_s=1.0)
    a = make("a", ttl=2, settings=settings)
    a.register({"host": "h"})
    assert a.claim_slot(2) == 0
    etcd.pause()
    try:
        wait_for(lambda: not a.session_alive, 10, "the session to be reported lost")
        with pytest.raises(EtcdUnavailable):
            a.register({"host": "h"})
    finally:
        etcd.resume()
    wait_for(lambda: reachable(a), 10, "etcd to answer again")
    assert a.ensure_session() is True  # new lease: register and claim again
    wait_for(lambda: not a.snapshot().groups, 10, "the old lease's keys to vanish")
    a.register({"host": "h"})
    assert a.claim_slot(2) == 0
    assert a.session_alive and a.ensure_session() is False


def test_restarted_etcd_keeps_a_short_outage_lease(
    etcd: ControlledEtcd, make: MakeCoordinator
) -> None:
    settings = EtcdSettings([etcd.endpoint], timeout_s=1.0)
    a = make("a", ttl=10, settings=settings)
    a.register({"host": "h"})
    assert a.claim_slot(2) == 0
    etcd.stop()
    start = time.monotonic()
    with pytest.raises(EtcdUnavailable, match="cannot reach etcd"):
        a.snapshot()
    with pytest.raises(EtcdUnavailable):
        a.ensure_session()
    assert time.monotonic() - start < 2 * settings.timeout_s
    time.sleep(1.5)  # the outage: etcd is down, the keepalive keeps retrying
    etcd.restart()  # same data and ports
    wait_for(lambda: reachable(a), 10, "etcd to answer again")
    assert a.ensure_session() is False
    assert a.snapshot().groups == {0: "a"}
    assert a.claim_slot(2) == 0


def test_restarted_etcd_after_ttl_keeps_the_lease_our_clock_gave_up(
    etcd: ControlledEtcd, make: MakeCoordinator
) -> None:
    """Our clock gave the lease up while etcd was away, but the restarted etcd restored it:
    the session goes on with that lease, so the slot and the leadership never change hands
    (the leader epoch stays), and a new keepalive keeps them past the TTL."""
    settings = EtcdSettings([etcd.endpoint], timeout_s=1.0)
    a, b = make("a", ttl=2, settings=settings), make("b", ttl=30, settings=settings)
    a.register({"host": "h"})
    assert a.claim_slot(1) == 0
    assert a.campaign()
    before = a.snapshot()
    lease = a.lease_confirmation()
    assert lease is not None
    etcd.stop()
    wait_for(lambda: not a.session_alive, 10, "the session to be reported lost")
    etcd.restart()
    wait_for(lambda: reachable(a), 10, "etcd to answer again")
    assert a.ensure_session() is False  # kept: nothing to register or claim again
    kept = a.lease_confirmation()
    assert kept is not None and kept[0] == lease[0] and kept[1] > lease[1]
    # The leader key is on a lease of its own (leader_lease.py), which the daemon's round
    # confirms by campaigning when its clock gave it up: etcd restored that one too.
    assert not a.leader_lease_held and a.campaign() and a.leader_lease_held
    assert b.claim_slot(1) is None and not b.campaign()
    time.sleep(3)  # past the TTL: the new keepalive holds the lease
    assert a.session_alive and a.ensure_session() is False
    after = a.snapshot()
    assert after.groups == {0: "a"} and after.leader == "a"
    assert after.leader_epoch == before.leader_epoch
    assert b.ensure_session() is False  # the long-TTL session survived the restart


def test_a_lease_etcd_expired_is_replaced_and_its_keys_are_gone(
    make: MakeCoordinator,
) -> None:
    """Once etcd itself dropped the lease (here revoked, as expiry would), the next session
    is a new lease, and what the old one held (slot, leadership) is free for others."""
    a, b = make("a", ttl=3), make("b", ttl=30)
    a.register({"host": "h"})
    assert a.claim_slot(1) == 0
    assert a.campaign()
    lease = a.lease_confirmation()
    assert lease is not None
    b._lease_of.revoke(int(lease[0], 16))  # what etcd's expiry does, from another client
    wait_for(lambda: not a.session_alive, 10, "the keepalive to see the lease gone")
    assert a.ensure_session() is True
    fresh = a.lease_confirmation()
    assert fresh is not None and fresh[0] != lease[0]
    view = a.snapshot()
    # The leader key is on the leader's own lease (leader_lease.py): it outlives the node
    # lease, and lapses within the leader TTL once nothing keeps it alive (a fence).
    assert view.groups == {} and view.leader == "a"
    assert b.claim_slot(1) == 0 and not b.campaign()
    a.drop_leadership()
    wait_for(lambda: b.snapshot().leader is None, 10, "the leader lease to lapse")
    assert b.campaign()
