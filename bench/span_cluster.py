"""Two replica groups of two nodes each, every node a network namespace host and etcd on
one more, every setting at its default but the job's size, the ranks unpaced: the
cluster ``bench/span_quiet.py`` and ``bench/span_split.py`` run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.pacing import UNPACED
from bench.spare_takeover import JOB, tear_down, together_after
from tests.support.harness import Daemon, Proc, start_daemon, wait_for
from tests.support.multihost import etcd_on
from tests.support.netns import Host, Network


@dataclass
class SpanCluster:
    net: Network
    daemons: list[Daemon]
    host_of: dict[str, Host]  # node id -> its host


@contextmanager
def two_by_two(work: Path) -> Iterator[SpanCluster]:
    """The cluster, once both groups commit a step together; torn down on leaving."""
    config = work / "job.toml"
    work.mkdir(parents=True)
    config.write_text(JOB.format(nodes=2))
    net = Network()
    cluster = SpanCluster(net, [], {})
    etcd: Proc | None = None
    try:
        etcd_host = net.add_host("etcd")
        etcd = etcd_on(etcd_host, work)
        endpoints = [f"{etcd_host.address}:2379"]
        for i in range(4):
            host, name = net.add_host(f"h{i}"), f"node-{i}"
            cluster.host_of[name] = host
            cluster.daemons.append(
                start_daemon(work, name, endpoints, config=config, host=host, env=UNPACED)
            )
        daemons = cluster.daemons
        wait_for(lambda: together_after(daemons, 1, 0.0), 300, "both groups to commit together")
        yield cluster
    finally:
        tear_down(cluster.daemons, etcd, net)
