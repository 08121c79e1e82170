"""Helpers shared by the multi-host tests (each host a network namespace, tests.support.netns)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from daemon.coordination.etcd_server import find_etcd_binary
from tests.support import netns
from tests.support.harness import DAEMON_JOB, Daemon, Proc, start, wait_for
from tests.support.netns import Host

NEEDS_NAMESPACES = pytest.mark.skipif(
    netns.unavailable() is not None, reason=str(netns.unavailable())
)


def etcd_on(host: Host, data: Path) -> Proc:
    """One etcd member on `host`, clients served on the host's address (port 2379)."""
    url = f"http://{host.address}:2379"
    argv = host.argv(
        [
            find_etcd_binary(),
            f"--data-dir={data / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=default=http://127.0.0.1:2380",
            # The timing of ops/k8s/etcd.yaml: it grants the 1 s leader lease.
            "--heartbeat-interval=100",
            "--election-timeout=750",
        ]
    )
    return start(argv, data, "etcd")


def reaches(src: Host, dst: Host, port: int) -> bool:
    """Whether a TCP connect from `src` to `dst`'s address succeeds within 1 s."""
    code = f"import socket; socket.create_connection(('{dst.address}', {port}), timeout=1)"
    return src.run([sys.executable, "-c", code]).returncode == 0


@contextlib.contextmanager
def hostname_is_loopback(hosts: Sequence[Host]) -> Iterator[str]:
    """Inside each of `hosts`, this machine's hostname resolves to 127.0.0.1 (as in many
    containers and VMs): ``ip netns exec`` bind-mounts /etc/netns/<ns>/hosts over
    /etc/hosts. Yields the hostname; the files go afterwards."""
    name = socket.gethostname()
    made = [Path("/etc/netns") / h.netns for h in hosts]
    try:
        for directory in made:
            directory.mkdir(parents=True)
            (directory / "hosts").write_text(f"127.0.0.1 localhost {name}\n::1 localhost\n")
        yield name
    finally:
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)


def job_without_advertise_host(directory: Path) -> Path:
    """The daemon tests' job file without its node.advertise_host (the docs' cluster
    examples set none)."""
    lines = DAEMON_JOB.read_text().splitlines()
    kept = [line for line in lines if not line.startswith("advertise_host")]
    assert len(kept) == len(lines) - 1, "daemon_job.toml no longer sets advertise_host"
    path = directory / "job-no-advertise.toml"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(kept) + "\n")
    return path


def wait_all_commit_together(daemons: Sequence[Daemon], timeout: float = 180) -> None:
    """Until every daemon's group committed a step with all of them in the quorum."""
    n = len(daemons)
    wait_for(
        lambda: all(
            any(e.get("participants") == n for e in d.events("train_step")) for d in daemons
        ),
        timeout,
        f"{n} hosts' groups to commit a step together",
    )
