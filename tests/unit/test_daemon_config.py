"""The daemon's pure job-file checks: bounds, node ids, ports, endpoints, etcd files."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
import yaml

from daemon.config import (
    MAX_DRAIN_GRACE_S,
    STOP_MARGIN_S,
    DaemonConfig,
    check_node_id,
    load_daemon_config,
)
from daemon.config.etcd_settings import read_password, split_endpoint
from daemon.coordination.etcd_client import EtcdSettings
from trainer.chaos import parse, parse_delay
from trainer.config import ConfigError, read_job_file, validate

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "daemon_job.toml"


def _systemd_seconds(span: str) -> float:
    """A systemd time span such as ``60s``, ``90`` or ``1min 30s``, in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+)\s*([a-z]*)", span)
    assert parts and "".join(n + u for n, u in parts) == span.replace(" ", ""), span
    return float(sum(int(n) * units[u] for n, u in parts))


def test_drain_grace_bound_leaves_a_margin_below_the_shipped_stop_timeouts() -> None:
    """MAX_DRAIN_GRACE_S must stay STOP_MARGIN_S below what systemd and Kubernetes give the daemon."""
    unit = (ROOT / "ops" / "systemd" / "phalanx.service").read_text()
    (span,) = re.findall(r"^TimeoutStopSec=(.+)$", unit, re.MULTILINE)
    docs = list(yaml.safe_load_all((ROOT / "ops" / "k8s" / "statefulset.yaml").read_text()))
    (sts,) = [d for d in docs if d and d.get("kind") == "StatefulSet"]
    grace = float(sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
    assert STOP_MARGIN_S >= 10
    for what, seconds in (("TimeoutStopSec", _systemd_seconds(span.strip())), ("pod", grace)):
        assert seconds >= MAX_DRAIN_GRACE_S + STOP_MARGIN_S, (what, seconds)
    # ... and the shipped job files stay within the bound.
    for job in (ROOT / "ops" / "systemd" / "job.toml", ROOT / "daemon" / "demo_job.toml"):
        cfg = validate(DaemonConfig, read_job_file(job), str(job))
        assert cfg.node.drain_grace_s <= MAX_DRAIN_GRACE_S
        assert cfg.etcd.timeout_s < cfg.etcd.lease_ttl_s


def test_shipped_local_job_files_load() -> None:
    for job in (JOB, ROOT / "daemon" / "demo_job.toml", ROOT / "examples" / "single.toml"):
        load_daemon_config(job)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("node.hang_timeout_s=4.9", "node.hang_timeout_s"),
        ("node.hang_timeout_s=86401", "node.hang_timeout_s"),
        ("etcd.lease_ttl_s=1", "etcd.lease_ttl_s"),
        ("etcd.lease_ttl_s=301", "etcd.lease_ttl_s"),
        ("etcd.timeout_s=4.0", "etcd.timeout_s"),  # daemon_job.toml: lease_ttl_s = 4
        ("etcd.timeout_s=9.5", "etcd.timeout_s"),
        (f"node.drain_grace_s={MAX_DRAIN_GRACE_S + 0.5}", "node.drain_grace_s"),
        ('etcd.endpoints=["127.0.0.1:65536"]', "etcd.endpoints"),
        ('etcd.endpoints=["127.0.0.1:0"]', "etcd.endpoints"),
        ('etcd.endpoints=["127.0.0.1:port"]', "etcd.endpoints"),
        ('etcd.endpoints=["127.0.0.1:\uff12\uff13"]', "etcd.endpoints"),  # full-width digits
    ],
)
def test_out_of_bounds_values_are_refused(override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(field)) as err:
        load_daemon_config(JOB, [override])
    assert str(err.value).startswith(f"{JOB}: ") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override",
    [
        "node.hang_timeout_s=5",
        "node.hang_timeout_s=86400",
        "etcd.lease_ttl_s=300",
        "etcd.timeout_s=3.9",
        f"node.drain_grace_s={MAX_DRAIN_GRACE_S}",
        'etcd.endpoints=["https://etcd-0.example:2379/", "[::1]:1", "h:65535"]',
    ],
)
def test_values_at_the_bounds_are_accepted(override: str) -> None:
    load_daemon_config(JOB, [override])


def test_split_endpoint() -> None:
    assert split_endpoint("10.0.0.1:2379") == ("10.0.0.1", 2379)
    assert split_endpoint("https://etcd.example:2379/") == ("etcd.example", 2379)
    for bad in ["", "nohost", ":2379", "h:", "h:0", "h:65536", "h:-1", "h:²"]:
        with pytest.raises(ValueError, match="host:port"):
            split_endpoint(bad)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http_port", "lighthouse_port"),
        ("http_port", "lighthouse_proxy_port"),
        ("lighthouse_port", "lighthouse_proxy_port"),
    ],
)
def test_a_nodes_ports_must_differ(first: str, second: str) -> None:
    overrides = ["node.http_port=0", "node.lighthouse_port=0", "node.lighthouse_proxy_port=0"]
    load_daemon_config(JOB, overrides)  # 0 = any free port: never a clash
    with pytest.raises(ConfigError, match=rf"node\.{first} and node\.{second} are both 4000"):
        load_daemon_config(JOB, [*overrides, f"node.{first}=4000", f"node.{second}=4000"])


@pytest.mark.parametrize("good", ["gpu-node-1", "phalanx-0", "n1.cluster.internal", "A_b", "7"])
def test_valid_node_ids(good: str) -> None:
    assert load_daemon_config(JOB, node_id=good).node_id == good
    assert load_daemon_config(JOB, [f'node.id="{good}"']).node_id == good


@pytest.mark.parametrize(
    "bad", ["..", ".", "a/b", "/abs", "a b", "tab\there", "line\nbreak", "bell\x07", "-x", "é"]
)
def test_invalid_node_ids_are_refused_from_the_flag_and_the_job_file(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^--node-id .* choose another node id\.$"):
        load_daemon_config(JOB, node_id=bad)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(JOB))}: node\.id "):
        load_daemon_config(JOB, [f"node.id={json.dumps(bad)}"])


def test_the_hostname_is_the_default_node_id(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_daemon_config(JOB).node_id == socket.gethostname()
    monkeypatch.setattr(socket, "gethostname", lambda: "bad host")
    with pytest.raises(ConfigError, match="the hostname 'bad host' is not a valid node id"):
        load_daemon_config(JOB)
    assert load_daemon_config(JOB, node_id="ok").node_id == "ok"
    check_node_id("ok", "node.id")


def test_job_file_that_is_not_utf8(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_bytes(b'[job]\nname = "\xff"\n')
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 14 is invalid\); save it"):
        load_daemon_config(job)


def test_etcd_password_file_problems(tmp_path: Path) -> None:
    pw = tmp_path / "pw"

    def load() -> DaemonConfig:
        return load_daemon_config(JOB, ["etcd.user=u", f'etcd.password_file="{pw}"'])

    pw.write_text(" secret \n")
    assert read_password(load()) == "secret"
    pw.write_bytes(b"\xfe\xff")
    with pytest.raises(ConfigError, match=r"etcd\.password_file .* is not UTF-8"):
        read_password(load())
    pw.write_text("\n")
    with pytest.raises(ConfigError, match=r"etcd\.password_file .* is empty"):
        read_password(load())
    pw.unlink()
    pw.mkdir()
    with pytest.raises(ConfigError, match=r"etcd\.password_file .* is not a file"):
        load()


def test_a_password_never_crosses_a_network_in_clear(tmp_path: Path) -> None:
    """A password goes to a remote etcd only over TLS, unless the job file accepts the risk."""
    pw = tmp_path / "pw"
    pw.write_text("s3cret-value\n")
    auth = ["etcd.user=u", f'etcd.password_file="{pw}"']

    def load(endpoint: str, *more: str) -> DaemonConfig:
        return load_daemon_config(JOB, [*auth, f'etcd.endpoints=["{endpoint}"]', *more])

    for endpoint in ("10.0.0.5:2379", "etcd.example:2379", "http://10.0.0.5:2379"):
        with pytest.raises(ConfigError) as refused:
            load(endpoint)
        message = str(refused.value)
        assert f"etcd at {endpoint} is plain HTTP" in message, message
        assert "etcd.ca_file" in message and "etcd.allow_insecure_password = true" in message
        assert "s3cret" not in message
    # Allowed: TLS (a CA or an https:// endpoint), loopback, or the explicit opt-in.
    (tmp_path / "ca.pem").write_text("")
    load("10.0.0.5:2379", f'etcd.ca_file="{tmp_path / "ca.pem"}"')
    load("https://etcd.example:2379")
    for loopback in ("127.0.0.1:2379", "localhost:2379", "[::1]:2379"):
        load(loopback)
    assert load("10.0.0.5:2379", "etcd.allow_insecure_password=true").etcd.allow_insecure_password
    load_daemon_config(JOB, ['etcd.endpoints=["10.0.0.5:2379"]'])  # no password: nothing to leak


def test_the_etcd_password_is_not_in_any_settings_repr(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-value\n")
    cfg = load_daemon_config(JOB, ["etcd.user=u", f'etcd.password_file="{pw}"'])
    settings = EtcdSettings(endpoints=["127.0.0.1:2379"], user="u", password=read_password(cfg))
    assert settings.password == "s3cret-value"
    for shown in (repr(settings), str(settings), repr(cfg), str(cfg), cfg.model_dump_json()):
        assert "s3cret" not in shown, shown


def test_listeners_bind_the_advertised_address_by_default() -> None:
    """node.bind_host defaults to the address node.advertise_host resolves to; the HTTP
    server and the lighthouse follow it unless set on their own."""
    cfg = load_daemon_config(JOB, ['node.advertise_host="127.0.0.1"'])
    assert cfg.node.bind_host is None and cfg.bind_host == "127.0.0.1"
    assert cfg.http_host == cfg.lighthouse_host == "127.0.0.1"
    named = load_daemon_config(JOB, ['node.advertise_host="localhost"']).pin_bind_host()
    assert named.node.bind_host is None and named.bind_host in ("127.0.0.1", "::1")
    assert named.http_host == named.lighthouse_host == named.bind_host
    wildcard = load_daemon_config(JOB, ['node.bind_host="0.0.0.0"', 'node.http_host="127.0.0.2"'])
    assert (wildcard.bind_host, wildcard.http_host, wildcard.lighthouse_host) == (
        "0.0.0.0",
        "127.0.0.2",
        "0.0.0.0",
    )
    unresolvable = load_daemon_config(JOB, ['node.advertise_host="no-such-host.invalid"'])
    with pytest.raises(OSError):
        unresolvable.pin_bind_host()


def test_chaos_specs_and_delays() -> None:
    for bad in ["forward@²", "forward@+", "forward@1:kill:x", "forward@-1", "forward@3:nan"]:
        with pytest.raises(ValueError, match="PHALANX_CHAOS entry"):
            parse(bad)
    assert [f.action for f in parse("gradients@+20:nan,gradients@4:crash")] == ["nan", "crash"]
    assert parse_delay(None) == parse_delay("") == 0.0
    assert parse_delay("0.05") == 0.05
    for bad in ["soon", "-1", "nan", "inf"]:
        with pytest.raises(ValueError, match="PHALANX_CHAOS_DELAY"):
            parse_delay(bad)


def test_a_group_spanning_nodes_is_laid_out_over_all_its_ranks_and_shares_its_nproc() -> None:
    """job.nodes_per_group x node.nproc is the group's world size; the spec then carries
    node.nproc (every node of such a job needs the same) and the group size."""
    with pytest.raises(ConfigError) as err:
        load_daemon_config(JOB, ["job.nodes_per_group=2"])  # dp_shard*cp*tp*pp = 1
    assert "node.nproc x job.nodes_per_group (2) gives the replica group 2 ranks" in str(err.value)
    cfg = load_daemon_config(JOB, ["job.nodes_per_group=2", "parallel.dp_shard=2"])
    assert cfg.spec()["node.nproc"] == "1" and cfg.spec()["job.nodes_per_group"] == "2"
    assert "node.nproc" not in load_daemon_config(JOB).spec()
