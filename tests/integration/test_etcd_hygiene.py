"""The embedded etcd bounds its store: periodic auto-compaction and an explicit backend quota.

Without compaction every record update stays in etcd's history until the backend quota
fills and etcd refuses writes (NOSPACE); issue 35 estimated two hours to fill the default
2 GB at 1,000 nodes. What etcd itself reports is checked: its metrics and its start-up log.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc  # type: ignore[import-untyped]  # no stubs; not in the mypy overrides
import pyetcd
import pytest

from daemon.coordination import etcd_server
from daemon.coordination.etcd_server import (
    AUTO_COMPACTION_RETENTION,
    QUOTA_BACKEND_BYTES,
    EmbeddedEtcd,
)
from tests.support.coordinators import wait_for
from tests.support.etcd_control import ControlledEtcd
from tests.support.etcd_metrics import counter

pytestmark = pytest.mark.integration

ETCD_DEFAULT_QUOTA = 2 << 30  # what etcd 3.5 enforces with --quota-backend-bytes=0


def start_config(etcd: EmbeddedEtcd) -> dict[str, object]:
    """The configuration etcd logs when it starts ("starting an etcd server")."""
    for line in etcd.log_path.read_text().splitlines():
        if line.startswith("{") and '"starting an etcd server"' in line:
            entry: dict[str, object] = json.loads(line)
            return entry
    raise AssertionError(f"no start-up line in {etcd.log_path}")


def test_the_embedded_etcd_has_its_quota_and_compacts_periodically(etcd: ControlledEtcd) -> None:
    assert QUOTA_BACKEND_BYTES != ETCD_DEFAULT_QUOTA  # else a lost flag would go unseen
    assert counter(etcd, "etcd_server_quota_backend_bytes") == QUOTA_BACKEND_BYTES
    config = start_config(etcd)
    assert config["auto-compaction-mode"] == "periodic"
    minutes = int(AUTO_COMPACTION_RETENTION.removesuffix("m"))
    assert config["auto-compaction-retention"] == f"{minutes}m0s"


def test_history_older_than_the_retention_is_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 1 s retention, the history of a key written over and over is compacted
    within seconds: etcd's gauge of the last compacted revision moves past the first
    writes, and reading at one of them is refused."""
    monkeypatch.setattr(etcd_server, "AUTO_COMPACTION_RETENTION", "1s")
    with EmbeddedEtcd(tmp_path / "etcd") as etcd:
        host, port = etcd.endpoint.rsplit(":", 1)
        client = pyetcd.client(host=host, port=int(port), timeout=5)
        try:
            assert counter(etcd, "etcd_debugging_mvcc_compact_revision") < 1  # none yet
            deadline = time.monotonic() + 20
            while counter(etcd, "etcd_debugging_mvcc_compact_revision") < 3:
                assert time.monotonic() < deadline, "etcd never compacted its history"
                client.put("/phalanx/itest/nodes/a", str(time.monotonic()))
                time.sleep(0.2)
            with pytest.raises(grpc.RpcError, match="required revision has been compacted"):
                client.get_response("/phalanx/itest/nodes/a", revision=2)
        finally:
            client.close()
    wait_for(lambda: "completed auto periodic compaction" in etcd.log_path.read_text(), 5, "log")
