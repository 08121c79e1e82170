"""Which processes listen where (``ss`` output), for the exposure tests."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

WILDCARDS = frozenset({"0.0.0.0", "::", "*"})


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    proto: str  # tcp or udp
    address: str  # without brackets or %interface
    port: int

    @property
    def on_every_interface(self) -> bool:
        return self.address in WILDCARDS


def parse_ss(output: str) -> list[Listener]:
    """Listeners from ``ss -Hltunp`` lines (one per owning process)."""
    found = []
    for line in output.splitlines():
        fields = line.split()
        if len(fields) < 7:
            continue
        address, _, port = fields[4].rpartition(":")
        address = address.strip("[]").split("%", 1)[0]
        for command, pid in re.findall(r'\("([^"]*)",pid=(\d+),', line):
            found.append(Listener(int(pid), command, fields[0], address, int(port)))
    return found


def listeners(prefix: Sequence[str] = ()) -> list[Listener]:
    """Every TCP/UDP listener ``ss`` sees; `prefix` runs it elsewhere (``ip netns exec NS``)."""
    argv = [*prefix, "ss", "-Hltunp"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    return parse_ss(done.stdout)
