"""The daemon's Prometheus metrics, read from the node's published status at scrape time.

A custom collector rather than module-level gauges: the status the supervisor publishes
each tick (:class:`daemon.node_state.status.NodeStatus`) is the single source of truth,
and a scrape sees one tick's whole.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from daemon import __version__
from daemon.accounting import ORDER, Activity, IncidentLog, Kind
from daemon.node_state.status import NodeStatus

RESTART_REASONS = ("rank_exit", "hang")


class _NodeCollector(Collector):
    def __init__(self, status: Callable[[], NodeStatus]) -> None:
        self.status = status
        # The activities' seconds as last shown: a status published a moment late (the
        # ledger switched, the tick not yet published) never shows less (a counter).
        self._shown: dict[Activity, float] = dict.fromkeys(ORDER, 0.0)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily]:
        v = self.status()
        base = {"phalanx_job": v.job_name, "node": v.node}
        names, values = list(base), list(base.values())

        info = InfoMetricFamily(
            "phalanx_node", "Static facts about this Phalanx daemon.", labels=names
        )
        info.add_metric(values, {"version": __version__})
        yield info

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        yield gauge(
            "phalanx_is_leader",
            "1 if this daemon is the elected leader (runs the lighthouse).",
            float(v.leader),
        )
        yield gauge(
            "phalanx_replica_group",
            "Replica-group slot this node holds (-1 when none).",
            -1.0 if v.slot is None else float(v.slot),
        )
        yield gauge(
            "phalanx_node_rank",
            "This node's seat in its replica group (GROUP_RANK; 0 where a group is one node).",
            float(v.node_rank),
        )
        yield gauge(
            "phalanx_group_generation",
            "The generation of a group that spans nodes that the ranks run under (0: none).",
            float(v.generation or 0),
        )
        yield gauge(
            "phalanx_spare",
            "1 while this node waits as a spare: every seat of every group is held.",
            float(v.spare),
        )
        yield gauge(
            "phalanx_ranks_running",
            "Rank processes of this node that are alive.",
            float(len(v.pids)),
        )
        yield gauge(
            "phalanx_min_replicas",
            "job.min_replicas: replica groups a step needs to commit.",
            float(v.min_replicas),
        )
        job = v.job
        if job is not None:  # absent until etcd was read
            yield gauge(
                "phalanx_job_replica_groups",
                "Replica-group slots held in the job, as this daemon last read etcd.",
                float(len(job.groups)),
            )
        yield gauge("phalanx_etcd_up", "1 if the last etcd request succeeded.", float(v.etcd_up))
        lighthouse_up = v.lighthouse_up
        yield gauge(
            "phalanx_lighthouse_up",
            "1 if a lighthouse address is known (and, on the leader, its process is alive).",
            float(lighthouse_up),
        )

        hang = GaugeMetricFamily(
            "phalanx_hang_timeout_seconds",
            "How long a rank may make no progress in each phase before it counts as hung "
            "(the step's is learned from step times once enough were seen).",
            labels=[*names, "phase"],
        )
        for phase, seconds in sorted(v.hang_timeouts.items()):
            hang.add_metric([*values, phase], seconds)
        yield hang
        yield gauge(
            "phalanx_hang_timeout_learned",
            "1 once the steady-step hang timeout is learned from step times (else the ceiling).",
            float(v.hang_learned),
        )
        yield gauge(
            "phalanx_step_time_quantile_seconds",
            "The quantile (hang.step_quantile) of step times the step's timeout came from.",
            math.nan if v.step_time_quantile_s is None else v.step_time_quantile_s,
        )
        if v.health is not None:  # absent until the first check has run
            healthy = GaugeMetricFamily(
                "phalanx_node_healthy",
                "1 if this node passed the health check, 0 if it failed (the reason is on "
                "/status); an unhealthy node claims no seat.",
                labels=[*names, "check"],
            )
            for c in v.health.checks:
                healthy.add_metric([*values, c.name], float(c.ok))
            yield healthy

        restarts = CounterMetricFamily(
            "phalanx_group_restarts",
            "Restarts of this node's replica group, by reason.",
            labels=[*names, "reason"],
        )
        for reason in sorted({*RESTART_REASONS, *v.restarts}):
            restarts.add_metric([*values, reason], float(v.restarts.get(reason, 0)))
        yield restarts
        over = CounterMetricFamily(
            "phalanx_job_started_over",
            "Times this node's group trained step 1 again after the job had reached a later "
            "step: no group with state, no checkpoint to load (its steps since were lost).",
            labels=names,
        )
        over.add_metric(values, float(v.started_over))
        yield over
        errors = CounterMetricFamily("phalanx_etcd_errors", "Failed etcd requests.", labels=names)
        errors.add_metric(values, float(v.etcd_errors))
        yield errors
        yield gauge(
            "phalanx_node_ranks",
            "Ranks this node runs (node.nproc), one accelerator each: its seconds times this "
            "are accelerator-seconds.",
            float(v.nproc),
        )
        if v.ledger is not None:
            spent = CounterMetricFamily(
                "phalanx_activity_seconds",
                "Seconds of this daemon's life by what they went to (they add up to it); "
                "training is goodput, the rest badput by cause (docs/metrics.md). A step "
                "in flight is counted when it ends.",
                labels=[*names, "activity"],
            )
            for activity, seconds in v.ledger.totals(time.monotonic()).items():
                shown = self._shown[activity] = max(self._shown[activity], seconds)
                spent.add_metric([*values, activity.value], shown)
            yield spent
        if v.incidents is not None:
            yield from _incidents(v.incidents, names, values)


def _incidents(
    log: IncidentLog, names: list[str], values: list[str]
) -> Iterator[CounterMetricFamily]:
    """The incidents this node recorded (daemon.accounting.incidents), by kind, once over."""
    seen = {kind: (n, cost) for kind, n, cost in log.counts}
    count = CounterMetricFamily(
        "phalanx_incidents",
        "Failures this node recorded and saw the end of, by kind (docs/metrics.md, "
        '"Incidents"): one per failure, by the node it struck.',
        labels=[*names, "kind"],
    )
    cost = CounterMetricFamily(
        "phalanx_incident_cost_group_seconds",
        "What those failures cost: from each failure to its recovery, times the replica "
        "groups it stopped.",
        labels=[*names, "kind"],
    )
    for kind in Kind:
        n, seconds = seen.get(kind, (0, 0.0))
        count.add_metric([*values, kind.value], float(n))
        cost.add_metric([*values, kind.value], seconds)
    yield count
    yield cost


class DaemonMetrics:
    """One /metrics for the node: the daemon's own collector plus its ranks' files.

    The ranks' directory is wiped when the daemon starts. When a rank exits the
    supervisor marks it dead (its live gauges go); counters and histograms of
    exited ranks stay, so totals such as heals stay monotonic across restarts.
    """

    def __init__(self, status: Callable[[], NodeStatus], ranks_dir: Path | None) -> None:
        """`status`: the node's published status; `ranks_dir`: where its ranks write their
        metrics (PROMETHEUS_MULTIPROC_DIR), None when metrics are off."""
        from prometheus_client.multiprocess import MultiProcessCollector

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(status))
        if ranks_dir is not None:
            directory = ranks_dir
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            MultiProcessCollector(self.registry, path=str(directory))  # type: ignore[no-untyped-call]

    def render(self) -> bytes:
        return generate_latest(self.registry)
