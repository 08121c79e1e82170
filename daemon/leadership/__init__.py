"""The leader's duties: the election through etcd, and the torchft lighthouse that the
leader runs (its process, launcher, health probe, and the gate in front of it).
"""

from __future__ import annotations

from daemon.leadership.election import Leadership
from daemon.leadership.lighthouse import (
    LAUNCHER,
    Forwarder,
    LighthouseError,
    LighthouseProcess,
    lighthouse_binary,
    lighthouse_command,
    parse_address,
)

__all__ = [
    "LAUNCHER",
    "Forwarder",
    "Leadership",
    "LighthouseError",
    "LighthouseProcess",
    "lighthouse_binary",
    "lighthouse_command",
    "parse_address",
]
