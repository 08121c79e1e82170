"""Helpers for tests that drive Coordinators against a real etcd."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from daemon.coordination.coordinator import Coordinator, EtcdUnavailable

MakeCoordinator = Callable[..., Coordinator]  # the make_coordinator fixture's factory


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def reachable(c: Coordinator) -> bool:
    try:
        c.snapshot()
    except EtcdUnavailable:
        return False
    return True
