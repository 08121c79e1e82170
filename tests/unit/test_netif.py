"""daemon.config.netif: the interface that carries the advertised address (for GLOO_SOCKET_IFNAME)."""

from __future__ import annotations

import socket

from daemon.config.netif import interface_for


def _a_non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a source address
        except OSError:
            return None
        address: str = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_loopback_and_unknown_names_leave_the_defaults() -> None:
    assert interface_for("127.0.0.1") is None
    assert interface_for("localhost") is None
    assert interface_for("no-such-host.invalid") is None


def test_a_local_address_names_its_interface() -> None:
    address = _a_non_loopback_address()
    assert address is not None, "this machine has no IPv4 address besides loopback"
    name = interface_for(address)
    assert name is not None and name != "lo"
    assert name in {n for _, n in socket.if_nameindex()}
