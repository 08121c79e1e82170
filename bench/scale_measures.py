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


def rates(
    before: Snapshot, after: Snapshot, nodes: int, hz: float, cores: int = 0
) -> dict[str, float]:
    """Per node per second unless the name says otherwise; CPU in % of one core (`cores`:
    the machine's, to tell what other processes used)."""
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
        if cores:
            ours = out["etcd cpu %"] + out["coord cpu % per node"] * nodes
            out["other cpu %"] = max(0.0, out["machine busy %"] * cores - ours)
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


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x; (a, b). One point (or one x): the mean, flat."""
    n = len(points)
    if n == 0:
        return 0.0, 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


@dataclass(frozen=True)
class UnitCosts:
    """etcd CPU seconds per unit of work (bench/scale_costs.py measures them)."""

    write_s: float  # a transaction or put of a record (raft, backend): every unary write
    keepalive_s: float  # a lease refresh on a stream opened for it
    keepalive_msg_s: float  # a lease refresh on a stream that stays open
    read_s: float  # a read's fixed cost (also any other small unary request)
    read_per_record_s: float  # and per record of the prefix it reads
    event_s: float  # one event sent to one watcher
    idle_cores: float  # etcd with nothing to do (raft heartbeats)


WRITES = ("Txn", "Put", "DeleteRange", "LeaseGrant", "LeaseRevoke")


def etcd_cores(r: Mapping[str, float], nodes: int, costs: UnitCosts) -> float:
    """etcd's CPU (cores) for `nodes` nodes sending :func:`rates`'s per-node rates `r`,
    at `costs`; every Range is taken to read the whole job (about one record a node)."""
    per_node = 0.0
    for key, rate in r.items():
        if not key.startswith("unary "):
            continue
        method = key[len("unary ") :]
        if method in WRITES:
            per_node += rate * costs.write_s
        elif method == "Range":
            per_node += rate * (costs.read_s + costs.read_per_record_s * nodes)
        else:
            per_node += rate * costs.read_s
    msgs, streams = r.get("msgs LeaseKeepAlive", 0.0), r.get("streams LeaseKeepAlive", 0.0)
    opened = min(msgs, streams)  # a refresh that opened its stream
    per_node += opened * costs.keepalive_s + (msgs - opened) * costs.keepalive_msg_s
    per_node += r.get("msgs Watch", 0.0) * costs.read_s
    per_node += r.get("watch events", 0.0) * costs.event_s
    return costs.idle_cores + nodes * per_node


@dataclass(frozen=True)
class Projection:
    nodes: int
    rates: dict[str, float]  # per node, each projected along its own power law
    etcd_cores: float  # from the unit costs
    egress_mb_s: float
    history_mb_h: float
    join_etcd_s: float | None  # etcd CPU-seconds of a mass join (None: none measured)


def projection(
    measured: Sequence[tuple[int, Mapping[str, float]]], n: int, costs: UnitCosts
) -> Projection:
    """Size `n` from one side's measured windows ``[(N, rates), ...]``: every per-node
    rate by :func:`project` (a size without a measure, such as a join that never
    completed, is left out of that measure), etcd's cores by :func:`etcd_cores`, and the
    mass join's etcd CPU from the join's requests per node."""
    names = {k for _, r in measured for k in r}
    per_node = {
        k: project([(size, r[k]) for size, r in measured if k in r], n) for k in sorted(names)
    }
    join = None
    if "join requests per node" in per_node:
        txns, reads = (
            per_node.get("join Txn per node", 0.0),
            per_node.get("join Range per node", 0.0),
        )
        other = max(0.0, per_node["join requests per node"] - txns - reads)
        read = costs.read_s + costs.read_per_record_s * n
        join = n * (txns * costs.write_s + reads * read + other * costs.read_s)
    return Projection(
        nodes=n,
        rates=per_node,
        etcd_cores=etcd_cores(per_node, n, costs),
        egress_mb_s=n * per_node.get("sent B/s per node", 0.0) / 1e6,
        history_mb_h=n * per_node.get("history kB/h per node", 0.0) / 1e3,
        join_etcd_s=join,
    )
