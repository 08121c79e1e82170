"""Which address this node advertises when its hostname means "this machine" only.

In containers and many VMs the hostname resolves to 127.0.0.1 (/etc/hosts). A node
that advertised it would tell peers on other machines to dial their own loopback:
issue 34 saw every node of three register the same loopback name, one train every
step alone and the others fail to join any quorum, all ending with exit 0.

So when the advertised name resolves to loopback but etcd is on another machine, the
daemon advertises the address of its interface that reaches etcd instead (the source
address the kernel picks for a UDP socket connected to the etcd endpoint; connecting
a UDP socket sends no packet), or ``node.bind_host`` when that is one address of this
machine. A loopback ``node.advertise_host`` set explicitly while etcd is remote is bad
input. With etcd embedded or on loopback every node runs on this machine (the demo,
most tests) and nothing changes.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.config.etcd_settings import split_endpoint
from daemon.config.netif import resolve
from daemon.config.sections import DaemonConfig
from trainer.config import ConfigError

WILDCARDS = ("0.0.0.0", "::")


class EtcdUnresolved(OSError):
    """No etcd endpoint resolves (DNS may not be up yet): transient, exit 1."""


@dataclass(frozen=True)
class Choice:
    """The address to advertise in place of a loopback name, and why (for the log)."""

    address: str
    reason: str


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def remote_endpoints(endpoints: Sequence[str]) -> list[tuple[str, str, int]]:
    """(endpoint, address, port) of each etcd endpoint on another machine; an endpoint
    whose name does not resolve is left out (EtcdUnresolved when none resolves)."""
    remote: list[tuple[str, str, int]] = []
    failures: list[OSError] = []
    for endpoint in endpoints:
        host, port = split_endpoint(endpoint)
        try:
            address = resolve(host.strip("[]"))
        except OSError as e:
            failures.append(e)
            continue
        if not is_loopback(address):
            remote.append((endpoint, address, port))
    if failures and len(failures) == len(endpoints):
        raise EtcdUnresolved(
            f"no etcd.endpoints entry resolves ({endpoints[0]}: {failures[0]}), so the address "
            "that reaches etcd cannot be chosen; fix their DNS entries or set node.advertise_host."
        )
    return remote


def source_address(address: str, port: int) -> str | None:
    """The local address the kernel would send from to reach ``address:port`` (no packet
    is sent); None without a route, or when that address is loopback or unspecified."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, port))
        except OSError:
            return None
        local = str(s.getsockname()[0])
    return None if is_loopback(local) or local in WILDCARDS else local


def choose(
    advertised: str,
    explicit: bool,
    endpoints: Sequence[str],
    bind_host: str | None = None,
) -> Choice | None:
    """The address to advertise instead of `advertised`, or None to keep it.

    `explicit`: node.advertise_host was set (a loopback one is then refused, not
    replaced). Raises ConfigError (exit 2) for a loopback address that cannot be
    replaced, OSError when a name does not resolve (DNS may not be up yet: exit 1).
    """
    if not endpoints or not is_loopback(resolve(advertised)):
        return None
    remote = remote_endpoints(endpoints)
    if not remote:
        return None  # etcd on this machine: so is every node (the demo, the tests)
    endpoint = remote[0][0]
    if explicit:
        raise ConfigError(
            f"node.advertise_host {advertised!r} is a loopback address but etcd at {endpoint} "
            "is on another machine, whose nodes cannot reach this one there; set "
            "node.advertise_host to an address of this machine that the other nodes reach, "
            "or unset it to advertise the address that reaches etcd."
        )
    if bind_host and bind_host not in WILDCARDS and not is_loopback(bind_host):
        why = f"the hostname {advertised!r} resolves to loopback; node.bind_host is {bind_host}"
        return Choice(bind_host, why)
    for endpoint, address, port in remote:
        local = source_address(address, port)
        if local is not None:
            why = (
                f"the hostname {advertised!r} resolves to loopback and etcd at {endpoint} is "
                f"on another machine; {local} is this machine's address on the route to it"
            )
            return Choice(local, why)
    raise ConfigError(
        f"node.advertise_host is unset and the hostname {advertised!r} resolves to loopback, "
        f"but no address of this machine routes to etcd at {endpoint}; set "
        "node.advertise_host to an address of this machine that the other nodes reach."
    )


def choose_advertise_host(cfg: DaemonConfig) -> Choice | None:
    """:func:`choose` for a job file (the advertised name, whether it was set, etcd's
    endpoints and node.bind_host)."""
    explicit = cfg.node.advertise_host is not None
    return choose(cfg.advertise_host, explicit, cfg.etcd.endpoints, cfg.node.bind_host)
