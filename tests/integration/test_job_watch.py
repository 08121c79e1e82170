"""The daemon's job view against a real etcd: one read, then the watch's events.

``daemon.coordination.job_watch`` queues the events, ``daemon.coordination.job_cache``
applies them, ``daemon.supervision.job_follow`` joins the two as the upkeep uses them.
A whole read of the job (one Range) happens only when the watch cannot be trusted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pyetcd
import pytest

from daemon.coordination.coordinator import Coordinator, EtcdSettings
from daemon.coordination.job_cache import JobCache
from daemon.coordination.job_view import JobView
from daemon.coordination.job_watch import JobWatch
from daemon.supervision.job_follow import JobFollower
from tests.support.coordinators import reachable, wait_for
from tests.support.etcd_control import ControlledEtcd
from tests.support.etcd_metrics import calls

pytestmark = pytest.mark.integration
QUIET_S = 0.5  # long enough for etcd to have delivered an event on this machine


@pytest.fixture
def pair(etcd_settings: EtcdSettings) -> Iterator[tuple[Coordinator, Coordinator]]:
    made = []
    for node in ("node-a", "node-b"):
        c = Coordinator(etcd_settings, "demo", node, 10)
        c.connect()
        c.ensure_session()
        made.append(c)
    yield made[0], made[1]
    for c in made:
        c.close()


def round_of(follower: JobFollower, view: JobView | None) -> JobView | None:
    """What the upkeep's round does with the job (EtcdUpkeep._read_job)."""
    if follower.due():
        return follower.load()
    return follower.changed() or view


def raw_client(etcd: ControlledEtcd) -> pyetcd.Etcd3Client:
    host, port = etcd.endpoint.split(":")
    return pyetcd.client(host=host, port=int(port), timeout=5)


def test_another_nodes_write_reaches_the_view_through_the_watch_without_a_read(
    pair: tuple[Coordinator, Coordinator], etcd: ControlledEtcd
) -> None:
    a, b = pair
    a.register({"state": "running"})
    woken = threading.Event()
    follower = JobFollower(a, a.node_id, woken.set)
    view: JobView | None = follower.load()
    ranges = calls(etcd, "Range")
    try:
        a.register({"state": "fenced"})  # this daemon's own record: applied, nothing woken
        time.sleep(QUIET_S)
        assert not woken.is_set(), "its own record woke the daemon"
        b.register({"state": "running", "group": 1})
        wait_for(woken.is_set, 10, "node-b's record to wake the daemon")
        view = round_of(follower, view)
        assert view is not None
        assert view.nodes["node-b"]["group"] == 1 and view.nodes["node-a"]["state"] == "fenced"
        woken.clear()
        assert b.campaign()
        wait_for(woken.is_set, 10, "the leader key to wake the daemon")
        view = round_of(follower, view)
        assert view is not None and view.leader == "node-b" and view.leader_epoch is not None
        b.close()  # revokes its lease: record and leader key deleted, both seen as events
        deadline = time.monotonic() + 10
        while view is not None and "node-b" in view.nodes and time.monotonic() < deadline:
            time.sleep(0.05)
            view = round_of(follower, view)
        assert view is not None and view.leader is None and set(view.nodes) == {"node-a"}
        assert follower.reads == 1 and calls(etcd, "Range") == ranges, "no read after the first"
        assert view == replace(a.snapshot(), revision=view.revision), "the view is etcd's job"
    finally:
        follower.close()


def test_a_change_between_the_read_and_the_watch_is_not_missed(
    pair: tuple[Coordinator, Coordinator],
) -> None:
    a, b = pair
    watch, cache = JobWatch(f"{a.prefix}nodes/{a.node_id}"), JobCache(a.prefix)
    watch.reading()
    cache.load(*a.read_job())
    b.set_state("running", 3)  # after the read, before the watch exists
    watch.arm(a, cache.revision + 1)
    try:
        wait_for(lambda: cache.apply(watch.take()), 10, "the earlier change to be delivered")
        state = cache.view().state
        assert state is not None and state["state"] == "running"
    finally:
        watch.disarm(a)


def test_the_daemons_own_record_deleted_reaches_the_view(
    pair: tuple[Coordinator, Coordinator], etcd: ControlledEtcd
) -> None:
    a, _ = pair
    a.register({"state": "running"})
    woken = threading.Event()
    follower = JobFollower(a, a.node_id, woken.set)
    follower.load()
    client = raw_client(etcd)
    try:
        client.delete(f"{a.prefix}nodes/{a.node_id}")
        wait_for(woken.is_set, 10, "the deletion to wake the daemon")
        view = follower.changed()
        assert view is not None and "node-a" not in view.nodes
    finally:
        client.close()
        follower.close()


def test_a_restarted_etcd_ends_the_stream_and_leads_to_exactly_one_read(
    pair: tuple[Coordinator, Coordinator], etcd: ControlledEtcd
) -> None:
    a, b = pair
    woken = threading.Event()
    follower = JobFollower(a, a.node_id, woken.set)
    view: JobView | None = follower.load()
    try:
        etcd.restart()
        wait_for(lambda: not follower.watch.armed, 20, "the watch to notice that its stream ended")
        assert follower.due() and woken.is_set(), "the loop is woken to read at once"
        wait_for(lambda: reachable(b), 20, "etcd to answer again")
        b.set_state("completed", 9)  # made while no watch stood: only a read can show it
        for _ in range(5):  # rounds
            view = round_of(follower, view)
        assert follower.reads == 2, "one read after the stream ended, then events again"
        assert view is not None and view.state is not None and view.state["state"] == "completed"
        assert follower.watch.armed and not follower.due()
    finally:
        follower.close()


def test_a_compacted_revision_leads_to_exactly_one_read_and_a_correct_view(
    pair: tuple[Coordinator, Coordinator], etcd: ControlledEtcd
) -> None:
    a, b = pair
    follower = JobFollower(a, a.node_id, None)
    view: JobView | None = follower.load()
    follower.distrust(True)  # the stream lost (as after an error); the view stays at its read
    for step in (1, 2, 3):
        b.set_state("running", step)
    client = raw_client(etcd)
    try:
        client.compact(a.snapshot().revision)  # the revisions the watch would resume from
        follower.watch.arm(a, follower.cache.revision + 1)  # a watch from there is refused
        # Given up once its stream ends: `due` alone is true already (the distrust above).
        wait_for(lambda: not follower.watch.armed, 10, "the compacted watch to be given up")
        for _ in range(5):
            view = round_of(follower, view)
        assert follower.reads == 2
        assert view is not None and view.state is not None and view.state["step"] == 3
        assert follower.watch.armed and not follower.due()
    finally:
        client.close()
        follower.close()


def test_a_watch_that_cannot_be_created_leaves_every_round_reading(
    etcd_settings: EtcdSettings, capfd: pytest.CaptureFixture[str]
) -> None:
    c = Coordinator(etcd_settings, "demo", "node-c", 10)
    c.connect()
    revision = c.snapshot().revision
    c.close()  # every request now fails
    watch = JobWatch(f"{c.prefix}nodes/{c.node_id}")
    watch.reading()
    for _ in range(3):
        watch.arm(c, revision + 1)  # a round's attempt: reported, never raised
        assert not watch.armed and watch.due(0.0)
    out = capfd.readouterr()
    assert (out.out + out.err).count("etcd_watch_failed") == 1, "reported once, not per round"
