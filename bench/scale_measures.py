"""The measures of bench/scale.py as pure functions: etcd's Prometheus text read into
counters, two snapshots made into rates per node, and projections to sizes this machine
cannot run (no processes, no etcd).

Counters come from etcd's own ``/metrics`` (etcd 3.5):

* ``grpc_server_handled_total`` by ``grpc_method`` (unary calls: Range, Txn, Put,
  LeaseGrant, LeaseRevoke, ...), summed over result codes;
* ``grpc_server_msg_received_total`` for the streams' messages (LeaseKeepAlive: one per
  refresh; Watch: creates and cancels) and ``grpc_server_started_total`` for the streams
  opened;
* ``etcd_debugging_mvcc_events_total``: events etcd sent to watchers (one per event per
  watcher);
* ``etcd_network_client_grpc_sent_bytes_total`` / ``..._received_bytes_total``;
* ``etcd_debugging_mvcc_total_put_size_in_bytes`` (keys and values put: the history's
  growth until a compaction) and ``etcd_debugging_mvcc_current_revision``.

CPU comes from ``/proc/<pid>/stat`` (utime + stime, in clock ticks).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
Sample = dict[tuple[str, Labels], float]

STREAMS = ("LeaseKeepAlive", "Watch")
EVENTS = "etcd_debugging_mvcc_events_total"
SENT = "etcd_network_client_grpc_sent_bytes_total"
RECEIVED = "etcd_network_client_grpc_received_bytes_total"
PUT_BYTES = "etcd_debugging_mvcc_total_put_size_in_bytes"
REVISION = "etcd_debugging_mvcc_current_revision"
DB_BYTES = "etcd_mvcc_db_total_size_in_bytes"
RSS = "process_resident_memory_bytes"


def _labels(text: str) -> Labels:
    """``a="x",b="y"`` (etcd's label values hold no quotes or commas) as sorted pairs."""
    pairs = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            pairs.append((key.strip(), value.strip().strip('"')))
    return tuple(sorted(pairs))


def parse_prometheus(text: str) -> Sample:
    """Prometheus text exposition as ``{(name, labels): value}``; comments skipped."""
    out: Sample = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, brace, rest = head.partition("{")
        try:
            out[(name.strip(), _labels(rest.rstrip("}")) if brace else ())] = float(value)
        except ValueError:
            continue
    return out


def total(sample: Mapping[tuple[str, Labels], float], name: str, **match: str) -> float:
    """The sum of `name`'s series whose labels include `match`."""
    want = set(match.items())
    return sum(v for (n, labels), v in sample.items() if n == name and want <= set(labels))


def unary_methods(sample: Mapping[tuple[str, Labels], float]) -> list[str]:
    """The unary gRPC methods etcd has answered at least once."""
    methods = {
        dict(labels).get("grpc_method", "")
        for name, labels in sample
        if name == "grpc_server_handled_total" and dict(labels).get("grpc_type") == "unary"
    }
    return sorted(m for m in methods if m)


def proc_ticks(stat: str) -> int:
    """utime + stime from the text of ``/proc/<pid>/stat`` (the name may hold spaces)."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def machine_busy(before: Sequence[int], after: Sequence[int]) -> float:
    """The busy share (0..1) of all cores between two ``/proc/stat`` first lines."""
    delta = [b - a for a, b in zip(before, after, strict=False)][:8]
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)
    return 1.0 - idle / sum(delta) if sum(delta) > 0 else 0.0


@dataclass(frozen=True)
class Snapshot:
    t: float  # monotonic seconds
    metrics: Sample
    etcd_ticks: int
    worker_ticks: int
    machine: tuple[int, ...] = ()
    extra: dict[str, float] = field(default_factory=dict)  # ticks, rounds ... from workers


def rates(before: Snapshot, after: Snapshot, nodes: int, hz: float) -> dict[str, float]:
    """Per node per second unless the name says otherwise; CPU in % of one core."""
    span = after.t - before.t
    if span <= 0 or nodes <= 0:
        raise ValueError("a window needs a positive length and at least one node")

    def delta(name: str, **match: str) -> float:
        return total(after.metrics, name, **match) - total(before.metrics, name, **match)

    out: dict[str, float] = {}
    requests = 0.0
    for method in unary_methods(after.metrics):
        value = delta("grpc_server_handled_total", grpc_method=method) / span / nodes
        out[f"unary {method}"] = value
        requests += value
    for method in STREAMS:
        msgs = delta("grpc_server_msg_received_total", grpc_method=method) / span / nodes
        out[f"msgs {method}"] = msgs
        out[f"streams {method}"] = (
            delta("grpc_server_started_total", grpc_method=method) / span / nodes
        )
        requests += msgs
    out["requests"] = requests
    out["watch events"] = delta(EVENTS) / span / nodes
    out["sent kB/s total"] = delta(SENT) / span / 1e3
    out["received kB/s total"] = delta(RECEIVED) / span / 1e3
    out["sent B/s per node"] = delta(SENT) / span / nodes
    out["etcd cpu %"] = 100.0 * (after.etcd_ticks - before.etcd_ticks) / hz / span
    out["coord cpu % per node"] = (
        100.0 * (after.worker_ticks - before.worker_ticks) / hz / span / nodes
    )
    if requests > 0:  # everything etcd did, over the requests it answered
        out["etcd us per request"] = 1e4 * out["etcd cpu %"] / (requests * nodes)
    out["history MB/h total"] = delta(PUT_BYTES) / span * 3600 / 1e6
    out["history kB/h per node"] = delta(PUT_BYTES) / span * 3600 / 1e3 / nodes
    out["revisions/s"] = delta(REVISION) / span
    if before.machine and after.machine:
        out["machine busy %"] = 100.0 * machine_busy(before.machine, after.machine)
    ticks = after.extra.get("ticks", 0.0) - before.extra.get("ticks", 0.0)
    if ticks > 0:
        out["rounds/s per node"] = ticks / span / nodes
        busy = after.extra.get("busy_s", 0.0) - before.extra.get("busy_s", 0.0)
        late = after.extra.get("late_s", 0.0) - before.extra.get("late_s", 0.0)
        out["round ms"] = 1e3 * busy / ticks
        out["late ms per round"] = 1e3 * late / ticks
    return out


# ------------------------------------------------------------------------ projections


def exponent(points: Iterable[tuple[int, float]]) -> float:
    """b in value ~ N**b, through the two largest sizes with a positive value (0 with
    fewer: the value per node is taken as constant)."""
    usable = dict(sorted((n, v) for n, v in points if v > 0 and n > 0))
    if len(usable) < 2:
        return 0.0
    (n1, v1), (n2, v2) = sorted(usable.items())[-2:]
    return math.log(v2 / v1) / math.log(n2 / n1)


def project(points: Sequence[tuple[int, float]], n: int) -> float:
    """The value at `n` from the largest measured size and :func:`exponent`."""
    if not points:
        return 0.0
    n0, v0 = max(points)
    return v0 * math.pow(n / n0, exponent(points))


def fit_unit_costs(rows: Iterable[tuple[float, float, float]]) -> tuple[float, float]:
    """etcd CPU (cores) ~ a * requests/s + c * sent bytes/s, least squares with a, c >= 0,
    over (requests/s, sent bytes/s, cores) rows; (a, c)."""
    data = [(x, y, z) for x, y, z in rows if z >= 0]
    sxx = sum(x * x for x, _, _ in data)
    syy = sum(y * y for _, y, _ in data)
    sxy = sum(x * y for x, y, _ in data)
    sxz = sum(x * z for x, _, z in data)
    syz = sum(y * z for _, y, z in data)
    det = sxx * syy - sxy * sxy
    if det > 1e-12 * max(sxx * syy, 1e-300):
        a, c = (sxz * syy - syz * sxy) / det, (syz * sxx - sxz * sxy) / det
        if a >= 0 and c >= 0:
            return a, c
    # One regressor alone, through the origin: the one that leaves the smaller residual.
    only_a = (sxz / sxx, 0.0) if sxx > 0 else (0.0, 0.0)
    only_c = (0.0, syz / syy) if syy > 0 else (0.0, 0.0)

    def residual(fit: tuple[float, float]) -> float:
        return sum((z - fit[0] * x - fit[1] * y) ** 2 for x, y, z in data)

    best = min((only_a, only_c), key=residual)
    return (max(best[0], 0.0), max(best[1], 0.0))


@dataclass(frozen=True)
class Projection:
    nodes: int
    requests: float  # per node per second
    watch_events: float  # per node per second
    sent_per_node: float  # bytes per second
    coord_cpu: float  # % of one core per node
    history_per_node: float  # kB per hour
    etcd_cores: float  # from the unit costs
    egress_mb_s: float
    history_mb_h: float
    join_etcd_s: float | None  # etcd CPU-seconds a mass join needs (None: no join measured)
    exponents: dict[str, float]


def projection(
    measured: Sequence[tuple[int, Mapping[str, float]]],
    n: int,
    costs: tuple[float, float],
) -> Projection:
    """Size `n` from one side's measured windows ``[(N, rates), ...]``: each per-node
    rate by :func:`project`, etcd's cores by the unit costs `costs` (:func:`fit_unit_costs`),
    and the mass join's etcd CPU from the join's requests and bytes per node."""
    keys = {
        "requests": "requests",
        "watch_events": "watch events",
        "sent": "sent B/s per node",
        "cpu": "coord cpu % per node",
        "history": "history kB/h per node",
        "join": "join requests per node",
        "join_sent": "join sent B per node",
    }
    points = {  # a size that lacks a measure (a join that never completed) is left out
        k: [(size, r[name]) for size, r in measured if name in r] for k, name in keys.items()
    }
    value = {k: project(p, n) for k, p in points.items()}
    a, c = costs
    joined = any(v > 0 for _, v in points["join"])
    return Projection(
        nodes=n,
        requests=value["requests"],
        watch_events=value["watch_events"],
        sent_per_node=value["sent"],
        coord_cpu=value["cpu"],
        history_per_node=value["history"],
        etcd_cores=n * (a * value["requests"] + c * value["sent"]),
        egress_mb_s=n * value["sent"] / 1e6,
        history_mb_h=n * value["history"] / 1e3,
        join_etcd_s=n * (a * value["join"] + c * value["join_sent"]) if joined else None,
        exponents={k: exponent(p) for k, p in points.items()},
    )
