"""Fixtures for integration tests: real processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.coordination import EtcdSettings
from daemon.etcd_server import EmbeddedEtcd


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    """A fresh single-member etcd on loopback, stopped after the test."""
    server = EmbeddedEtcd(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_settings(etcd: EmbeddedEtcd) -> EtcdSettings:
    """Client settings for :func:`etcd`, with a short per-request deadline."""
    return EtcdSettings(endpoints=[etcd.endpoint], timeout_s=2.0)


@pytest.fixture
def etcd_endpoint(etcd: EmbeddedEtcd) -> str:
    """host:port of :func:`etcd`, for daemons started with etcd.endpoints."""
    return etcd.endpoint
