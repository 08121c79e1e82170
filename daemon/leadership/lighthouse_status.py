"""Which members of the lighthouse's last quorum stopped heartbeating: read from its status page.

A group whose host lost power, or was cut off, sends no reset: its peers' collectives
wait for it until ``ft.timeout_s`` (30 s), while the lighthouse knows within
``lighthouse.heartbeat_timeout_ms`` that it stopped heartbeating. torchft 0.2.0 says
so only on its HTML status page (``GET /status``: the previous quorum's members, each
``<b>replica id</b>``, and ``replica id: seen N s ago`` per heartbeat), so the leader
reads that page from the lighthouse's loopback port once a round and announces the
members it lost (``Coordinator.announce_lost``); every daemon then tells its ranks
(``PHALANX_NOTICE``), which abandon the step that waits on them. The page is read,
never trusted for anything else: a page that does not parse names nobody.
"""

from __future__ import annotations

import math
import re
import urllib.request

READ_TIMEOUT_S = 0.2  # on loopback; a lighthouse that slow is not read this round

_MEMBER = re.compile(r"<b>\s*([^<\s]+)\s*</b>")
_SEEN = re.compile(r"^\s*(\S+): seen ([0-9.eE+-]+)s ago\s*$", re.MULTILINE)


def read_status(port: int) -> str | None:
    """The lighthouse's status page from its loopback `port`, None when it does not answer."""
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/status", timeout=READ_TIMEOUT_S
        ) as response:
            return str(response.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def lost_members(page: str, heartbeat_timeout_s: float) -> list[str]:
    """Members of the previous quorum last seen more than `heartbeat_timeout_s` ago (or not
    at all), sorted; [] for a page without a previous quorum or one that does not parse."""
    start, end = page.find("Previous Quorum"), page.find("Heartbeats")
    if start < 0 or end < start:
        return []
    members = _MEMBER.findall(page[start:end])
    seen: dict[str, float] = {}
    for replica, age in _SEEN.findall(page[end:]):
        try:
            seen[replica] = float(age)
        except ValueError:
            continue
    return sorted({m for m in members if seen.get(m, math.inf) > heartbeat_timeout_s})
