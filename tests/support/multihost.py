"""Helpers shared by the multi-host tests (each host a network namespace, tests.support.netns)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from daemon.coordination.etcd_server import find_etcd_binary
from tests.support import netns
from tests.support.harness import Proc, start
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
        ]
    )
    return start(argv, data, "etcd")


def reaches(src: Host, dst: Host, port: int) -> bool:
    """Whether a TCP connect from `src` to `dst`'s address succeeds within 1 s."""
    code = f"import socket; socket.create_connection(('{dst.address}', {port}), timeout=1)"
    return src.run([sys.executable, "-c", code]).returncode == 0
