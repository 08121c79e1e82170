"""Fixtures for integration tests: real processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.coordination.coordinator import Coordinator, EtcdSettings
from tests.support.coordinators import MakeCoordinator
from tests.support.etcd_control import ControlledEtcd
from tests.support.netns import Network


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[ControlledEtcd]:
    """A fresh single-member etcd on loopback, stopped after the test."""
    server = ControlledEtcd(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_settings(etcd: ControlledEtcd) -> EtcdSettings:
    """Client settings for :func:`etcd`, with a short per-request deadline."""
    return EtcdSettings(endpoints=[etcd.endpoint], timeout_s=2.0)


@pytest.fixture
def make_coordinator(etcd_settings: EtcdSettings) -> Iterator[MakeCoordinator]:
    """Coordinators of job "demo" with a live session, closed (lease revoked) after the test:
    ``make_coordinator(node_id, ttl=10, settings=None)``; `settings` default to
    :func:`etcd_settings`."""
    made: list[Coordinator] = []

    def factory(node_id: str, ttl: int = 10, settings: EtcdSettings | None = None) -> Coordinator:
        c = Coordinator(settings or etcd_settings, "demo", node_id, ttl)
        c.connect()
        assert c.ensure_session() is True
        made.append(c)
        return c

    yield factory
    for c in made:
        c.close()


@pytest.fixture
def etcd_endpoint(etcd: ControlledEtcd) -> str:
    """host:port of :func:`etcd`, for daemons started with etcd.endpoints."""
    return etcd.endpoint


@pytest.fixture
def network() -> Iterator[Network]:
    """A bridge of network-namespace hosts (tests.support.netns), torn down after the test."""
    net = Network()
    try:
        yield net
    finally:
        net.close()


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    """Context managers a test's setup enters, exited after the test (the bad-input tables)."""
    with contextlib.ExitStack() as s:
        yield s
