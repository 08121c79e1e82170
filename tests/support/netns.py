"""Hosts for multi-host tests: each a Linux network namespace with its own address.

A :class:`Network` is a bridge in the test's own namespace and a /24 of private
addresses made for this run; each :class:`Host` is a namespace joined to the
bridge by a veth pair, with its own loopback. The test process (in the root
namespace) reaches every host through the bridge's address, so the harness can
read each daemon's /status, and nothing leaves the machine: the bridge has no
uplink and no route is added outside the namespaces.

Partitions are blackhole routes inside the namespaces (:meth:`Network.cut`,
both directions) or a host's link taken down (:meth:`Network.isolate`); both are
undone by :meth:`Network.heal` / :meth:`Network.rejoin`.

Needs root (or CAP_NET_ADMIN) and iproute2; :func:`unavailable` says why not,
for a skip.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_NETWORKS = itertools.count()  # each Network of this process gets its own names and /24


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    probe = f"phx-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    name: str
    netns: str
    address: str
    veth: str  # the bridge-side end of this host's link

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host (``ip netns exec`` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(argv), env=env, stdout=stdout, stderr=stderr, cwd=cwd)

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=30)


@dataclass
class Network:
    """A bridge and its hosts; close() removes every namespace and link it made."""

    hosts: dict[str, Host] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Names and a /24 (10.X.Y.0/24) from the pid and a per-process count, so neither a
        # second network of this run (the last one's links may still be going away) nor a
        # parallel suite meets them. Interface names stay within Linux's 15 characters.
        pid, n = os.getpid(), next(_NETWORKS)
        self.tag = f"{pid % 10000:04d}{n % 100:02d}"
        self.prefix = f"10.{200 + pid % 50}.{(pid // 50 + n) % 250}"
        self.bridge = f"phxbr{self.tag}"
        self.gateway = f"{self.prefix}.1"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 10
        netns, veth = f"phx{self.tag}-{name}", f"phx{self.tag}v{index}"
        address = f"{self.prefix}.{index}"
        _ip("netns", "add", netns)
        host = Host(name, netns, address, veth)
        self.hosts[name] = host  # close() removes it even if a step below fails
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return host

    def add_address(self, host: Host, address: str) -> None:
        """Give `host` one more address (a /32 on its link)."""
        _ip("-n", host.netns, "addr", "add", f"{address}/32", "dev", "eth0")

    # ------------------------------------------------------------ partitions

    def cut(self, a: Host, b: Host) -> None:
        """Drop all traffic between `a` and `b` (both directions); others still reach both."""
        _ip("-n", a.netns, "route", "add", "blackhole", f"{b.address}/32")
        _ip("-n", b.netns, "route", "add", "blackhole", f"{a.address}/32")

    def heal(self, a: Host, b: Host) -> None:
        _ip("-n", a.netns, "route", "del", "blackhole", f"{b.address}/32", check=False)
        _ip("-n", b.netns, "route", "del", "blackhole", f"{a.address}/32", check=False)

    def isolate(self, host: Host) -> None:
        """Take `host`'s link down: it reaches nobody, nobody reaches it (the test included)."""
        _ip("link", "set", host.veth, "down")

    def rejoin(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    def close(self) -> None:
        for host in self.hosts.values():
            _ip("link", "del", host.veth, check=False)  # both ends go at once
            _ip("netns", "del", host.netns, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()
