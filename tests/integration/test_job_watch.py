"""daemon.coordination.job_watch against a real etcd: when a daemon must read its job again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pyetcd
import pytest

from daemon.coordination.coordinator import Coordinator, EtcdSettings
from daemon.coordination.job_watch import MAX_AGE_S, JobWatch
from tests.support.coordinators import reachable, wait_for
from tests.support.etcd_control import ControlledEtcd

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


@contextmanager
def armed_watch(c: Coordinator, woken: threading.Event) -> Iterator[JobWatch]:
    """A watch armed as the daemon arms it (after a read), disarmed at the end."""
    watch = JobWatch(f"{c.prefix}nodes/{c.node_id}", woken.set)
    assert watch.due(0.0), "nothing is watched before the first read"
    watch.reading()
    watch.arm(c, c.snapshot().revision + 1)
    assert watch.armed and not watch.due(0.0)
    try:
        yield watch
    finally:
        watch.disarm(c)


def stays_quiet(watch: JobWatch, woken: threading.Event) -> bool:
    time.sleep(QUIET_S)
    return not watch.due(0.0) and not woken.is_set()


def test_another_nodes_change_wakes_the_daemon_and_its_own_record_does_not(
    pair: tuple[Coordinator, Coordinator],
) -> None:
    a, b = pair
    a.register({"step": 0})
    woken = threading.Event()
    with armed_watch(a, woken) as watch:
        a.register({"step": 1})  # this daemon's own record: it knows what it wrote
        assert stays_quiet(watch, woken), "its own record made the daemon read the job again"
        b.register({"step": 5})
        wait_for(lambda: watch.due(0.0) and woken.is_set(), 10, "node-b's record to be seen")
        assert watch.changes == 1
        watch.reading()
        woken.clear()
        assert stays_quiet(watch, woken)
        assert b.campaign()  # the leader key: a change like any other
        wait_for(lambda: watch.due(0.0), 10, "the leader key to be seen")
        assert watch.due(MAX_AGE_S), "a read this old is due whatever the watch says"
    assert not watch.armed and watch.due(0.0)


def test_a_change_between_the_read_and_the_watch_is_not_missed(
    pair: tuple[Coordinator, Coordinator],
) -> None:
    a, b = pair
    watch = JobWatch(f"{a.prefix}nodes/{a.node_id}")
    revision = a.snapshot().revision
    watch.reading()
    b.set_state("running", 3)  # after the read, before the watch exists
    watch.arm(a, revision + 1)
    try:
        wait_for(lambda: watch.due(0.0), 10, "the earlier change to be delivered")
    finally:
        watch.disarm(a)


def test_the_daemons_own_record_deleted_counts_as_a_change(
    pair: tuple[Coordinator, Coordinator], etcd: ControlledEtcd
) -> None:
    a, _ = pair
    a.register({"step": 0})
    host, port = etcd.endpoint.split(":")
    client = pyetcd.client(host=host, port=int(port), timeout=5)
    with armed_watch(a, threading.Event()) as watch:
        try:
            client.delete(f"{a.prefix}nodes/{a.node_id}")
        finally:
            client.close()
        wait_for(lambda: watch.due(0.0), 10, "the deletion to be seen")


def test_a_restarted_etcd_ends_the_stream_and_every_round_reads_until_rearmed(
    pair: tuple[Coordinator, Coordinator], etcd: ControlledEtcd
) -> None:
    a, _ = pair
    woken = threading.Event()
    with armed_watch(a, woken) as watch:
        etcd.restart()
        wait_for(lambda: not watch.armed, 20, "the watch to notice that its stream ended")
        assert watch.due(0.0) and woken.is_set(), "the loop is woken to read at once"
        wait_for(lambda: reachable(a), 20, "etcd to answer again")
        watch.reading()
        watch.arm(a, a.snapshot().revision + 1)
        assert watch.armed and not watch.due(0.0)


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
