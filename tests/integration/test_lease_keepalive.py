"""The lease's keepalive against a real embedded etcd: one long-lived stream per daemon.

pyetcd's ``refresh_lease`` opens a gRPC ``LeaseKeepAlive`` stream per refresh; a daemon
refreshed about once a second, so every node made etcd set up and tear down a stream a
second (issue 35). ``daemon.coordination.keepalive`` keeps one stream open and sends a
keepalive on it every ``refresh_every_s(ttl)``; the supervisor's round asks the session
without a request of its own. Counted with etcd's own Prometheus counters.
"""

from __future__ import annotations

import threading
import time

import pytest

from daemon.coordination.coordinator import Coordinator, EtcdSettings, EtcdUnavailable
from daemon.coordination.etcd_client import _Connection
from daemon.coordination.keepalive import LeaseKeepAlive, _Session
from daemon.coordination.lease_timing import refresh_every_s
from tests.support.coordinators import MakeCoordinator, wait_for
from tests.support.etcd_control import ControlledEtcd
from tests.support.etcd_metrics import counter, counter_in, scrape

pytestmark = pytest.mark.integration

TTL_S = 10
HOLD_S = 6.0
ROUND_S = 0.25  # the supervisor's tick (daemon.supervision.supervisor.TICK_S)


@pytest.fixture
def make(make_coordinator: MakeCoordinator, etcd: ControlledEtcd) -> MakeCoordinator:
    """Coordinators with lease TTL 10 s and a 1 s deadline."""
    settings = EtcdSettings([etcd.endpoint], timeout_s=1.0)
    return lambda node_id: make_coordinator(node_id, TTL_S, settings)


def streams(etcd: ControlledEtcd) -> int:
    """LeaseKeepAlive streams etcd has started since it (last) started."""
    return counter(etcd, "grpc_server_started_total", "LeaseKeepAlive")


def keepalives(etcd: ControlledEtcd) -> int:
    """Keepalive messages etcd has received, on all streams."""
    return counter(etcd, "grpc_server_msg_received_total", "LeaseKeepAlive")


def other_calls(etcd: ControlledEtcd) -> int:
    """gRPC calls of every other method etcd has started (Range, Txn, LeaseGrant, ...).
    Both counts from one scrape: the keepalive thread's stream, opened as its session
    starts, may start between two scrapes and look like one call fewer before it."""
    text = scrape(etcd)
    return counter_in(text, "grpc_server_started_total") - counter_in(
        text, "grpc_server_started_total", "LeaseKeepAlive"
    )


def ensure_session_answers(c: Coordinator) -> bool | None:
    """ensure_session's answer, None while it raises EtcdUnavailable."""
    try:
        return c.ensure_session()
    except EtcdUnavailable:
        return None


def confirmed_after(c: Coordinator, since: float) -> bool:
    """A keepalive sent after `since` was answered."""
    confirmation = c.lease_confirmation()
    return confirmation is not None and confirmation[1] > since


def hold(c: Coordinator, seconds: float) -> None:
    """Ask for the session every round for `seconds`, as the supervisor's upkeep does."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert c.ensure_session() is False
        assert c.session_alive
        time.sleep(ROUND_S)


def test_one_stream_carries_every_keepalive_and_the_main_loop_sends_none(
    etcd: ControlledEtcd, make: MakeCoordinator
) -> None:
    a = make("a")
    first = a.lease_confirmation()
    assert first is not None
    calls, sent = other_calls(etcd), keepalives(etcd)
    hold(a, HOLD_S)
    assert streams(etcd) == 1  # before: about 1.2 new streams a second
    assert other_calls(etcd) == calls  # ensure_session asked etcd nothing
    expected = HOLD_S / refresh_every_s(TTL_S)  # one keepalive per refresh_every_s
    assert expected / 2 <= keepalives(etcd) - sent <= expected + 3
    last = a.lease_confirmation()
    assert last is not None and last[0] == first[0] and last[1] > first[1] + HOLD_S / 2


def test_a_new_leases_first_keepalive_goes_at_once_and_tells_etcds_term(
    etcd: ControlledEtcd,
) -> None:
    """A session refreshing once an hour still refreshes as it starts: etcd's raft term
    is known at once (the incident record waits for it after a cut, and a daemon killed
    before a refresh interval had passed lost the cut's record)."""
    settings = EtcdSettings([etcd.endpoint], timeout_s=1.0)
    conn = _Connection(settings, 1.0)
    keepalive = LeaseKeepAlive(_Connection(settings, 1.0))  # its own: nobody else's answers
    try:
        grant = conn.call(lambda c: c.lease(TTL_S))
        hourly = _Session(int(grant.id), int(grant.ttl), keepalive, "itest", every_s=3600.0)
        sent = keepalives(etcd)
        hourly.start()
        wait_for(lambda: keepalive.raft_told[0] is not None, 10, "a keepalive's answer")
        assert keepalives(etcd) > sent  # etcd's own count: the refresh reached it
        hourly.stop()
    finally:
        keepalive.close()
        conn.close()


def test_a_restarted_etcd_is_reached_on_a_new_stream_and_the_lease_is_kept(
    etcd: ControlledEtcd, make: MakeCoordinator
) -> None:
    a = make("a")
    a.register({"host": "h"})
    assert a.claim_slot(2) == 0
    lease = a.lease_confirmation()
    assert lease is not None
    etcd.restart()  # same data and ports: etcd restores the lease with a fresh TTL
    restarted = time.monotonic()
    wait_for(lambda: confirmed_after(a, restarted), 10, "the restarted etcd to confirm the lease")
    assert a.ensure_session() is False
    opened = streams(etcd)  # counted by the restarted etcd
    assert 1 <= opened <= 3  # the first attempts may meet an etcd still starting
    kept = a.lease_confirmation()
    assert kept is not None and kept[0] == lease[0] and kept[1] > lease[1]
    hold(a, 3.0)
    assert streams(etcd) == opened  # and then that one stream again
    assert a.snapshot().groups == {0: "a"}


def test_ensure_session_reports_a_paused_etcd_once_the_keepalive_failed(
    etcd: ControlledEtcd, make: MakeCoordinator
) -> None:
    a = make("a")
    lease = a.lease_confirmation()
    assert lease is not None
    etcd.pause()
    try:
        # Within a refresh interval and the keepalive's deadline of the pause.
        wait_for(lambda: ensure_session_answers(a) is None, 10, "ensure_session to raise")
        with pytest.raises(EtcdUnavailable):
            a.ensure_session()
        assert a.session_alive  # the TTL has not passed
    finally:
        etcd.resume()
    wait_for(lambda: ensure_session_answers(a) is False, 10, "ensure_session to answer False")
    kept = a.lease_confirmation()
    assert kept is not None and kept[0] == lease[0]
    hold(a, 1.0)


def test_close_ends_the_keepalive_threads(etcd: ControlledEtcd, make: MakeCoordinator) -> None:
    def keepalive_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("phalanx-keepalive")]

    a = make("a")
    wait_for(lambda: streams(etcd) == 1, 5, "the keepalive stream to open")
    assert len(keepalive_threads()) == 2  # the session's and the stream's reader
    a.close()
    wait_for(lambda: not keepalive_threads(), 5, "the keepalive threads to end")
