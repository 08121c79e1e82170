"""etcd's own Prometheus counters, read from its metrics URL: what a test counts requests by."""

from __future__ import annotations

import urllib.request

from daemon.coordination.etcd_server import EmbeddedEtcd


def scrape(etcd: EmbeddedEtcd) -> str:
    """etcd's metrics page as it is now: counters read from one scrape agree in time."""
    with urllib.request.urlopen(f"{etcd.metrics_url}/metrics", timeout=5) as r:
        text: str = r.read().decode()
    return text


def counter(etcd: EmbeddedEtcd, name: str, method: str | None = None) -> int:
    """The sum of `name`'s samples (only those with grpc_method=`method`, when given)."""
    return counter_in(scrape(etcd), name, method)


def counter_in(text: str, name: str, method: str | None = None) -> int:
    """:func:`counter` read from a :func:`scrape`'s text."""
    needle = f'grpc_method="{method}"' if method else ""
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if (line.startswith(name + "{") or line.startswith(name + " ")) and needle in line
    )


def calls(etcd: EmbeddedEtcd, method: str) -> int:
    """Unary calls of `method` (Range, Txn, Put, ...) etcd has handled."""
    return counter(etcd, "grpc_server_handled_total", method)
