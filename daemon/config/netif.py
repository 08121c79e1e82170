"""Which address a name binds to, and which network interface carries it.

:func:`resolve` turns the advertised name into the address the node's listeners
bind (``node.bind_host``'s default): a listener on the advertised address is
reachable where peers dial it, and nowhere else.

:func:`interface_for` is for gloo's and NCCL's socket choice:
torch's gloo backend picks its interface from the hostname unless
``GLOO_SOCKET_IFNAME`` names one; where the hostname resolves to loopback (the
usual /etc/hosts) every rank then advertises 127.0.0.1 to peers on other hosts.
The daemon knows the address it advertises, so it names that address's interface.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None  # no IPv4 address on this interface
    return socket.inet_ntoa(packed[20:24])


def resolve(host: str) -> str:
    """`host` as one address (IPv4 first; a literal address as it is); OSError if it does not resolve."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def interface_for(host: str) -> str | None:
    """The local interface holding `host`'s IPv4 address; None for loopback, an address
    not on this machine, or a name that does not resolve (then the defaults stand)."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    if ipaddress.ip_address(address).is_loopback:
        return None
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == address:
            return name
    return None
