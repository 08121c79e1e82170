"""How a node keeps its etcd lease: how often the keepalive confirms it, and how close to
its expiry a node stops trusting it and fences itself (``daemon.fencing``)."""

from __future__ import annotations


def fence_margin_s(ttl_s: float) -> float:
    """How long before the lease can expire a node fences itself."""
    return max(1.0, ttl_s / 5.0)


def refresh_every_s(ttl_s: float) -> float:
    """How often the keepalive thread confirms the lease (``daemon.coordination.keepalive``),
    and how old the confirmation may get before the daemon's round asks about the session: at
    most once a second, and four times within the time the confirmation may age before the
    node fences itself (ttl less the margin), so a slow answer or two never fences a node.
    Each refresh is one message on the daemon's one keepalive stream."""
    return min(1.0, (ttl_s - fence_margin_s(ttl_s)) / 4.0)
