"""`phalanx run` refuses bad input before it starts anything.

Each case runs the real command and expects exit code 2 and one line on stderr,
``error: ...`` naming the field or file, with no traceback, no process started or
left behind, no run_dir created, and (where the case points etcd.endpoints at a
real etcd) no key written under /phalanx/.
"""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from daemon.config import MAX_DRAIN_GRACE_S, load_daemon_config
from daemon.config.preflight import LOCK_FILE, cuda_present
from daemon.coordination.coordinator import Coordinator, EtcdSettings
from tests.support.harness import DAEMON_JOB, free_port, start_daemon, wait_for
from tests.support.refusals import (
    Case,
    Setup,
    a_file,
    assert_refused,
    assert_refused_before_start,
    honouring_modes,
    override,
    path_setting,
    phalanx_keys,
    phalanx_run,
    read_only_dir,
    sets,
)

pytestmark = pytest.mark.integration

NO_CUDA = pytest.mark.skipif(cuda_present(), reason="this machine has a GPU driver")


def listening_port(stack: contextlib.ExitStack) -> int:
    server = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
    port: int = server.getsockname()[1]
    return port


def not_utf8(tmp: Path, _: contextlib.ExitStack) -> Case:
    job = tmp / "latin1.toml"
    job.write_bytes(DAEMON_JOB.read_bytes() + b'\n[data]\npath = "caf\xe9.txt"\n')
    return Case(f"job file {job} is not UTF-8", ["--config", str(job)])


def http_port_in_use(_: Path, stack: contextlib.ExitStack) -> Case:
    port = listening_port(stack)
    return Case(f"node.http_port {port} is already in use", sets(f"node.http_port={port}"))


def proxy_port_in_use(_: Path, stack: contextlib.ExitStack) -> Case:
    port = listening_port(stack)
    return Case(
        f"node.lighthouse_proxy_port {port} is already in use",
        sets(f"node.lighthouse_proxy_port={port}"),
    )


def same_port(first: str, second: str) -> Setup:
    def setup(_: Path, __: contextlib.ExitStack) -> Case:
        port = free_port()
        return Case(
            f"node.{first} and node.{second} are both {port}",
            sets(f"node.{first}={port}", f"node.{second}={port}"),
        )

    return setup


def under_a_file(tmp: Path) -> Path:
    return a_file(tmp) / "run"


def on_sysfs(_: Path) -> Path:
    return Path("/sys/phalanx-test/run")  # a pseudo file system: refused even to root


def password_file(content: bytes, mode: int = 0o600) -> Setup:
    def setup(tmp: Path, _: contextlib.ExitStack) -> Case:
        pw = tmp / "etcd-password"
        pw.write_bytes(content)
        pw.chmod(mode)
        return Case(f"etcd.password_file {pw}", sets("etcd.user=u", f'etcd.password_file="{pw}"'))

    return setup


def password_in_clear(tmp: Path, _: contextlib.ExitStack) -> Case:
    """A password for an etcd on another host (TEST-NET-1: never dialled) without TLS."""
    pw = tmp / "etcd-password"
    pw.write_text("s3cret\n")
    return Case(
        "etcd at 192.0.2.10:2379 is plain HTTP",
        sets("etcd.user=u", f'etcd.password_file="{pw}"', 'etcd.endpoints=["192.0.2.10:2379"]'),
    )


def node_id_flag(node_id: str) -> Setup:
    return lambda _, __: Case(f"--node-id {node_id!r}", ["--node-id", node_id])


def endpoints(*entries: str) -> Setup:
    return override("etcd.endpoints", f"etcd.endpoints={json.dumps(list(entries))}")


def environment(names: str, **env: str) -> Setup:
    return lambda _, __: Case(names, env=env)


def case(name: str, setup: Setup, with_etcd: bool, *marks: pytest.MarkDecorator) -> Any:
    """One parameter: `with_etcd` points etcd.endpoints at a real etcd (else the embedded default)."""
    return pytest.param(setup, with_etcd, id=name, marks=marks)


CASES = [
    case("job-file-not-utf8", not_utf8, False),
    case("http-port-in-use", http_port_in_use, True),
    case("proxy-port-in-use", proxy_port_in_use, False),
    case("http-port-is-lighthouse-port", same_port("http_port", "lighthouse_port"), True),
    case("proxy-port-is-http-port", same_port("http_port", "lighthouse_proxy_port"), False),
    case(
        "proxy-port-is-lighthouse-port", same_port("lighthouse_port", "lighthouse_proxy_port"), True
    ),
    case(
        "run-dir-under-a-file",
        path_setting("node.run_dir", under_a_file, "node.run_dir {path} cannot"),
        False,
    ),
    case(
        "run-dir-is-a-file",
        path_setting("node.run_dir", a_file, "node.run_dir {path} is a file"),
        True,
    ),
    case(
        "run-dir-on-sysfs",
        path_setting(
            "node.run_dir", on_sysfs, "node.run_dir {path} is on the sysfs pseudo file system"
        ),
        False,
    ),
    case(
        "run-dir-read-only",
        honouring_modes(path_setting("node.run_dir", read_only_dir, "node.run_dir {path}")),
        False,
    ),
    case("password-not-utf8", password_file(b"\xff\xfe"), True),
    case("password-empty", password_file(b"\n"), False),
    case("password-unreadable", honouring_modes(password_file(b"secret", mode=0)), True),
    case("password-in-clear", password_in_clear, False),
    case(
        "bind-host-not-here",
        override("node.bind_host 192.0.2.10 cannot be bound", 'node.bind_host="192.0.2.10"'),
        True,
    ),
    case(
        "advertised-address-not-here",
        override(
            "node.advertise_host '192.0.2.10' resolves to 192.0.2.10",
            'node.advertise_host="192.0.2.10"',
        ),
        False,
    ),
    case("node-id-dotdot", node_id_flag(".."), True),
    case("node-id-dot", node_id_flag("."), False),
    case("node-id-slash", node_id_flag("a/b"), True),
    case("node-id-space", node_id_flag("a b"), False),
    case("node-id-control", node_id_flag("a\x1bb"), True),
    case("node-id-in-job-file", override("node.id 'x/y'", 'node.id="x/y"'), True),
    case("node-id-tab-in-job-file", override("node.id 'x\\ty'", 'node.id="x\\ty"'), False),
    case("fp8-on-cpu", override("parallel.fp8 = true needs a GPU", "parallel.fp8=true"), False),
    case(
        "cp-torch-attention-on-cpu",
        override(
            "parallel.cp_attention = 'torch' runs only on CUDA",
            "node.nproc=2",
            "parallel.cp=2",
            'parallel.cp_attention="torch"',
        ),
        False,
    ),
    case(
        "cp-seq-len-not-divisible",
        override("train.seq_len (30)", "node.nproc=2", "parallel.cp=2", "train.seq_len=30"),
        False,
    ),
    case("hang-timeout-low", override("node.hang_timeout_s", "node.hang_timeout_s=1"), True),
    case("hang-timeout-high", override("node.hang_timeout_s", "node.hang_timeout_s=1e5"), False),
    case("lease-ttl-low", override("etcd.lease_ttl_s", "etcd.lease_ttl_s=1"), True),
    case("lease-ttl-high", override("etcd.lease_ttl_s", "etcd.lease_ttl_s=301"), False),
    case("etcd-timeout-not-below-ttl", override("etcd.timeout_s", "etcd.timeout_s=4.0"), True),
    case(
        "drain-grace-above-stop-timeouts",
        override("node.drain_grace_s", f"node.drain_grace_s={MAX_DRAIN_GRACE_S + 1}"),
        True,
    ),
    case("endpoint-port-over-65535", endpoints("127.0.0.1:70000"), False),
    case("endpoint-port-zero", endpoints("127.0.0.1:0"), False),
    case("endpoint-port-not-a-number", endpoints("127.0.0.1:2379x"), False),
    case("chaos-malformed", environment("PHALANX_CHAOS", PHALANX_CHAOS="forward@soon"), True),
    case("chaos-unknown-point", environment("PHALANX_CHAOS", PHALANX_CHAOS="nowhere@1"), False),
    case("chaos-delay", environment("PHALANX_CHAOS_DELAY", PHALANX_CHAOS_DELAY="x"), True),
    case(
        "chaos-in-node-env", override("node.env", 'node.env={PHALANX_CHAOS="start@0:boom"}'), False
    ),
    case("node-device-cuda", override("node.device", "node.device=cuda"), True, NO_CUDA),
    case(
        "parallel-device-cuda",
        override("parallel.device", 'parallel.device="cuda"'),
        False,
        NO_CUDA,
    ),
]


@pytest.mark.parametrize(("setup", "with_etcd"), CASES)
def test_bad_input_is_refused_before_anything_starts(
    setup: Setup,
    with_etcd: bool,
    tmp_path: Path,
    stack: contextlib.ExitStack,
    request: pytest.FixtureRequest,
) -> None:
    endpoint = str(request.getfixturevalue("etcd_endpoint")) if with_etcd else None
    assert_refused_before_start(setup(tmp_path, stack), tmp_path, endpoint)
    assert not Path("/sys/phalanx-test").exists()


def test_a_second_daemon_on_the_same_run_dir_is_refused(tmp_path: Path) -> None:
    """The first daemon (embedded etcd) holds its run_dir; a second with the same job file,
    node id and ports is refused naming the run_dir and the holder, and the first carries on."""
    first = start_daemon(tmp_path, "twin", None, overrides=["train.steps=100000"])
    run_dir = tmp_path / "twin"
    try:
        wait_for(lambda: (run_dir / "etcd.endpoint").exists(), 30, "the embedded etcd")
        wait_for(first.status, 30, "the first daemon's /status")
        assert (run_dir / LOCK_FILE).read_text().strip() == str(first.pid)
        endpoint = (run_dir / "etcd.endpoint").read_text()
        second = phalanx_run(
            [
                "--config",
                str(DAEMON_JOB),
                "--node-id",
                "twin",
                *sets(f'node.run_dir="{run_dir}"', f"node.http_port={first.http_port}"),
            ],
            tmp_path,
        )
        line = assert_refused(second, f"node.run_dir {run_dir} is in use")
        assert f"(pid {first.pid})" in line
        assert first.proc.popen.poll() is None
        assert (run_dir / "etcd.endpoint").read_text() == endpoint
        assert (run_dir / LOCK_FILE).read_text().strip() == str(first.pid)
        wait_for(lambda: first.step() > 0, 90, "the first daemon to train on")
        assert first.proc.popen.poll() is None and not first.events("node_failed")
    finally:
        first.stop()


def test_a_node_on_another_device_type_is_refused_at_join(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """The job's groups train on cuda (a node registered that spec); this node is set to
    train on cpu. Its groups would meet theirs in one quorum with
    other devices and dtypes, so it is refused at join, naming both and the setting."""
    spec = load_daemon_config(DAEMON_JOB, []).spec()
    gpu = Coordinator(EtcdSettings([etcd_endpoint], timeout_s=2.0), "itest", "gpu-node", 30)
    try:
        gpu.connect()
        assert gpu.ensure_session() is True
        gpu.check_spec({**spec, "device": "cuda"})
        gpu.register({"host": "gpu-host"})
        keys = sorted(phalanx_keys(etcd_endpoint))
        result = phalanx_run(
            [
                "--config",
                str(DAEMON_JOB),
                *sets(
                    'node.id="cpu-node"',
                    'node.device="cpu"',
                    f'node.run_dir="{tmp_path / "run"}"',
                    f"node.http_port={free_port()}",
                    f"node.lighthouse_port={free_port()}",
                    f"etcd.endpoints={json.dumps([etcd_endpoint])}",
                ),
            ],
            tmp_path,
        )
        # Refused at join, like another job file: the daemon has started (its log is
        # JSON on stderr) but started no rank and wrote nothing to etcd.
        assert result.code == 2, result.stderr
        failed = [json.loads(line) for line in result.stderr.splitlines() if "node_failed" in line]
        error = failed[0]["error"]
        assert "trains on cuda and this node would train on cpu" in error, error
        assert 'node.device = "cuda"' in error
        assert "Traceback" not in result.stderr + result.stdout
        assert result.started == set(), f"processes started: {result.started}"
        assert sorted(phalanx_keys(etcd_endpoint)) == keys
    finally:
        gpu.close(revoke=True)
