"""The leader lease's TTL as etcd grants it (daemon/coordination/leader_lease.py).

etcd grants no lease shorter than 1.5 of its election timeouts. The etcds Phalanx starts
grant the default 1 s; one at etcd's own default timing (1000 ms) grants 2 s, which the
leader then keeps alive at that lease's cadence, saying once why a leader change will
take longer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.coordination import EtcdSettings
from daemon.coordination.etcd_server import EmbeddedEtcd
from daemon.coordination.leader_lease import DEFAULT_LEADER_TTL_S, LeaderLease, leader_refresh_s

pytestmark = pytest.mark.integration


class DefaultTimingEtcd(EmbeddedEtcd):
    """An etcd of the user's own: etcd's default heartbeat and election timeout."""

    def _args(self) -> list[str]:
        timing = ("--heartbeat-interval=", "--election-timeout=")
        return [a for a in super()._args() if not a.startswith(timing)]


def granted(settings: EtcdSettings) -> tuple[int, float]:
    lease = LeaderLease(settings, "demo", DEFAULT_LEADER_TTL_S)
    try:
        lease.current()
        session = lease._session
        assert session is not None and lease.held
        return session.ttl, session.every_s
    finally:
        lease.close()


def test_the_leader_lease_is_one_second_where_etcd_grants_it_and_two_where_it_does_not(
    tmp_path: Path, etcd_settings: EtcdSettings, capfd: pytest.CaptureFixture[str]
) -> None:
    assert granted(etcd_settings) == (1, leader_refresh_s(1))  # the embedded etcd: 500 ms
    assert "leader_lease_longer" not in "".join(capfd.readouterr())
    own = DefaultTimingEtcd(tmp_path / "own")
    own.start()
    try:
        settings = EtcdSettings(endpoints=[own.endpoint], timeout_s=2.0)
        assert granted(settings) == (2, leader_refresh_s(2))
    finally:
        own.stop()
    out = "".join(capfd.readouterr())
    assert out.count("leader_lease_longer") == 1 and "--election-timeout=750" in out
