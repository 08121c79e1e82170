"""What the daemon and `phalanx status` do with what they read from etcd, and without etcd.

Records anyone with write access could leave under the job's prefix (a key that is not
UTF-8, a value nested thousands deep) are skipped and reported, never a traceback; a
`phalanx run` whose etcd is unreachable says so within seconds and keeps retrying.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pyetcd
import pytest

from tests.support.etcd_control import ControlledEtcd, EtcdUser
from tests.support.harness import BIN, DAEMON_JOB, free_port, start_daemon, wait_for

pytestmark = pytest.mark.integration

PREFIX = "/phalanx/itest/"
DEEP = "[" * 5000 + "]" * 5000


def put_bad_records(endpoint: str) -> None:
    host, port = endpoint.rsplit(":", 1)
    client = pyetcd.client(host=host, port=int(port), timeout=5)
    try:
        client.put(PREFIX.encode() + b"nodes/caf\xe9", b'{"state": "running"}')
        client.put(f"{PREFIX}nodes/deep", DEEP)
        client.put(f"{PREFIX}checkpoints/latest", '{"a":' * 100 + "1" + "}" * 100)
        client.put(f"{PREFIX}groups/1", DEEP)
        client.put(f"{PREFIX}nodes/fine", json.dumps({"state": "running", "step": 3}))
    finally:
        client.close()


def phalanx_status(endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(BIN / "phalanx"),
            "status",
            "--config",
            str(DAEMON_JOB),
            *("--set", f'etcd.endpoints=["{endpoint}"]'),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_skips_records_it_cannot_read(etcd_endpoint: str) -> None:
    put_bad_records(etcd_endpoint)
    proc = phalanx_status(etcd_endpoint, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)  # stdout is the JSON alone; the warnings went to stderr
    assert [n["id"] for n in doc["nodes"]] == ["fine"] and doc["step"] == 3
    assert doc["checkpoint"] is None and doc["groups"] == {}
    skipped = [json.loads(line) for line in proc.stderr.splitlines()]
    assert {e["event"] for e in skipped} == {"etcd_record_skipped"}
    reasons = {e["key"]: e["reason"] for e in skipped}
    assert reasons[f"{PREFIX}nodes/caf\\xe9"] == "the key is not UTF-8"
    assert "more than 32 levels deep" in reasons[f"{PREFIX}nodes/deep"]
    table = phalanx_status(etcd_endpoint)
    assert table.returncode == 0 and "fine" in table.stdout and "Traceback" not in table.stderr


def test_status_with_a_wrong_password_is_bad_input(etcd: ControlledEtcd, tmp_path: Path) -> None:
    etcd.enable_auth("root-pw", [EtcdUser("ops", "right", PREFIX)])
    secret = tmp_path / "password"
    secret.write_text("not-the-pw-7731\n")
    proc = phalanx_status(
        etcd.endpoint, "--set", "etcd.user=ops", "--set", f'etcd.password_file="{secret}"'
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "not-the-pw-7731" not in proc.stderr


def test_status_without_etcd_is_a_failure_not_bad_input() -> None:
    proc = phalanx_status(f"127.0.0.1:{free_port()}", "--json")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and proc.stderr.startswith("error: "), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_run_skips_records_it_cannot_read(tmp_path: Path, etcd_endpoint: str) -> None:
    """A daemon joins a job whose prefix holds bad records: it reports them and carries on."""
    put_bad_records(etcd_endpoint)
    d = start_daemon(tmp_path, "n1", [etcd_endpoint], overrides=["node.standby=false"])
    try:
        wait_for(lambda: d.events("slot_claimed"), 60, "a slot claimed", interval=0.2)
        wait_for(lambda: d.events("etcd_record_skipped"), 10, "the bad records reported")
        assert d.proc.popen.poll() is None, d.proc.tail()
        assert not d.events("node_failed")
    finally:
        d.stop()
    assert "Traceback" not in d.proc.stderr.read_text()


def test_run_reports_an_unreachable_etcd_and_keeps_retrying(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    d = start_daemon(tmp_path, "n1", [endpoint], overrides=["node.standby=false"])
    try:
        started = time.monotonic()
        event = wait_for(lambda: d.events("etcd_unavailable"), 15, "etcd_unavailable")[0]
        assert time.monotonic() - started < 15
        assert event["endpoints"] == [endpoint] and event["retrying"] is True
        time.sleep(3)  # still retrying, not exited
        assert d.proc.popen.poll() is None, d.proc.tail()
        d.proc.popen.send_signal(signal.SIGTERM)
        code = d.wait(30)
    finally:
        d.stop()
    assert code in (0, 1), d.proc.tail()
    assert "Traceback" not in d.proc.stderr.read_text()
