"""The upkeep's retries during an etcd outage (daemon/supervision/attempts.py): the wait
between tries doubles but never reaches the node lease's TTL, so a node sees a restarted
etcd, which restored its lease, while that lease still lives."""

from __future__ import annotations

import time

import pytest

from daemon.coordination import EtcdUnavailable
from daemon.supervision.attempts import BACKOFF_CAP_S, BACKOFF_FIRST_S, Attempts, backoff_cap


def down() -> None:
    raise EtcdUnavailable("etcd at 10.0.0.1:2379 did not answer within 2 s.")


@pytest.mark.parametrize(("ttl", "cap"), [(4, 1.0), (10, 2.5), (60, BACKOFF_CAP_S), (1, 0.5)])
def test_the_cap_is_a_quarter_of_the_lease_ttl_within_bounds(ttl: int, cap: float) -> None:
    assert backoff_cap(ttl) == cap


def test_waits_double_up_to_the_cap_and_a_success_starts_them_over() -> None:
    attempt = Attempts(["10.0.0.1:2379"], backoff_cap(4))
    waits = []
    for _ in range(6):
        before = time.monotonic()
        assert attempt("snapshot", down) == (False, None)
        waits.append(round(attempt.retry_at - before, 1))
    assert waits == [BACKOFF_FIRST_S, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert not attempt.up and attempt.errors == 6
    assert attempt("snapshot", lambda: 7) == (True, 7)
    assert attempt.up
    attempt("snapshot", down)
    assert round(attempt.retry_at - time.monotonic(), 1) == BACKOFF_FIRST_S
