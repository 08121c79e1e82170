"""The tables bench/scale.py prints: one per size (baseline, new and their ratio per
measure) and one of projections, each naming what it was computed from."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from bench.scale_measures import Projection, UnitCosts
from bench.scale_run import RunResult

Getter = Callable[[RunResult], float | None]


def _window(key: str) -> Getter:
    return lambda r: r.window.get(key)


def _join(key: str) -> Getter:
    return lambda r: r.join.get(key)


def _failover(kind: str, key: str) -> Getter:
    def get(r: RunResult) -> float | None:
        value = r.failover.get(kind, {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    return get


def _logged(event: str) -> Getter:
    return lambda r: float(r.events.get(event, 0))


HEAD: list[tuple[str, Getter]] = [
    ("all registered (s after start)", lambda r: r.registered_s),
    ("all RUNNING, every slot held (s)", lambda r: r.running_s),
    ("join: etcd requests per node", _join("join requests per node")),
    ("join: Txn per node", _join("join Txn per node")),
    ("join: Range per node", _join("join Range per node")),
    ("etcd requests/s per node (all kinds)", _window("requests")),
]
STREAM_ROWS: list[tuple[str, Getter]] = [
    ("  LeaseKeepAlive messages", _window("msgs LeaseKeepAlive")),
    ("  LeaseKeepAlive streams opened", _window("streams LeaseKeepAlive")),
    ("  Watch messages (create/cancel)", _window("msgs Watch")),
    ("  Watch streams opened", _window("streams Watch")),
]
TAIL: list[tuple[str, Getter]] = [
    ("watch events/s per node (sent by etcd)", _window("watch events")),
    ("etcd sent kB/s (all clients)", _window("sent kB/s total")),
    ("etcd received kB/s (all clients)", _window("received kB/s total")),
    ("etcd CPU (% of one core)", _window("etcd cpu %")),
    ("  the same by the unit costs (model check)", _window("etcd cpu % by the unit costs")),
    ("  etcd CPU per request (us, all work)", _window("etcd us per request")),
    ("coordination CPU per node (% of a core)", _window("coord cpu % per node")),
    ("machine busy (% of all cores)", _window("machine busy %")),
    ("  other processes (% of one core)", _window("other cpu %")),
    ("node rounds/s", _window("rounds/s per node")),
    ("  time in a round (ms)", _window("round ms")),
    ("  a round's lateness (ms)", _window("late ms per round")),
    ("history: put MB/hour (all nodes)", _window("history MB/h total")),
    ("history: put kB/hour per node", _window("history kB/h per node")),
    ("etcd revisions/s", _window("revisions/s")),
    ("etcd RSS (MB)", _window("etcd RSS MB")),
    ("simulator RSS per node (MB)", _window("worker RSS MB per node")),
    ("etcd db size (MB)", _window("etcd db MB")),
    ("lease TTL (s)", lambda r: float(r.ttl)),
    ("expiry: new leader after last keepalive (s)", _failover("expiry", "leader_after_keepalive_s")),
    ("expiry: its lighthouse after last keepalive", _failover("expiry", "lighthouse_after_keepalive_s")),
    ("expiry: new leader after the stall (s)", _failover("expiry", "leader_s")),
    ("expiry: all RUNNING again (s)", _failover("expiry", "all_running_again_s")),
    ("revoke: new leader (s)", _failover("revoke", "leader_s")),
    ("revoke: its lighthouse published (s)", _failover("revoke", "lighthouse_s")),
    ("revoke: all RUNNING again (s)", _failover("revoke", "all_running_again_s")),
]  # fmt: skip


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if magnitude >= 0.01 or value == 0 else f"{value:.1e}"


def _ratio(new: float | None, base: float | None) -> str:
    if new is None or base is None or base == 0:
        return "-"
    return f"{new / base:.2f}"


def rows_for(runs: Sequence[RunResult]) -> list[tuple[str, Getter]]:
    """The table's rows: the unary kinds any run saw, and the warnings any run logged."""
    kinds = sorted({k for r in runs for k, v in r.window.items() if k.startswith("unary ") and v})
    unary = [(f"  {k[len('unary ') :]}", _window(k)) for k in kinds]
    events = sorted({e for r in runs for e in r.events})
    logged = [(f"logged {e} (count)", _logged(e)) for e in events]
    return [*HEAD, *unary, *STREAM_ROWS, *TAIL, *logged]


def size_table(nodes: int, runs: Mapping[str, RunResult]) -> str:
    """Baseline, new and new/baseline for one size (one column when a side is missing)."""
    base, new = runs.get("baseline"), runs.get("new")
    shown = [r for r in (base, new) if r is not None]
    head = ", ".join(f"{r.side} = {r.label} ({r.procs + 1} workers)" for r in shown)
    lines = [f"N = {nodes} (measured: {head})"]
    width = 46
    titles = [r.side for r in shown] + (["new/base"] if base and new else [])
    lines.append(f"{'':<{width}}" + "".join(f"{t:>12}" for t in titles))
    for label, get in rows_for(shown):
        values = [get(r) for r in shown]
        if all(v is None for v in values):
            continue
        cells = [_fmt(v) for v in values]
        if base and new:
            cells.append(_ratio(get(new), get(base)))
        lines.append(f"{label:<{width}}" + "".join(f"{c:>12}" for c in cells))
    for r in shown:
        lines += [f"  note ({r.side}): {note}" for note in r.notes]
    return "\n".join(lines)


def costs_table(c: UnitCosts) -> str:
    rows = [
        ("a write (record transaction)", c.write_s),
        ("a lease refresh on a new stream", c.keepalive_s),
        ("a lease refresh on an open stream", c.keepalive_msg_s),
        ("a read: fixed", c.read_s),
        ("a read: per record of the prefix", c.read_per_record_s),
        ("one watch event to one watcher", c.event_s),
    ]
    lines = ["etcd unit costs, CPU microseconds (measured here, one kind at a time)"]
    lines += [f"  {label:<44}{_fmt(1e6 * v):>12}" for label, v in rows]
    lines.append(f"  {'etcd idle (% of a core)':<44}{_fmt(100 * c.idle_cores):>12}")
    return "\n".join(lines)


PROJECTED: list[tuple[str, Callable[[Projection], float | None]]] = [
    ("etcd requests/s per node", lambda p: p.rates.get("requests")),
    ("  Range", lambda p: p.rates.get("unary Range")),
    ("  Txn", lambda p: p.rates.get("unary Txn")),
    ("  LeaseKeepAlive messages", lambda p: p.rates.get("msgs LeaseKeepAlive")),
    ("watch events/s per node", lambda p: p.rates.get("watch events")),
    ("coordination CPU per node (% of a core)", lambda p: p.rates.get("coord cpu % per node")),
    ("etcd cores, steady state (unit costs)", lambda p: p.etcd_cores),
    ("etcd egress (MB/s)", lambda p: p.egress_mb_s),
    ("history growth (MB/hour)", lambda p: p.history_mb_h),
    ("mass join: etcd CPU-seconds (unit costs)", lambda p: p.join_etcd_s),
]


def projection_table(projections: Mapping[str, Sequence[Projection]], sources: str) -> str:
    """Projections by side; says they are projections and from what."""
    lines = [
        "PROJECTION, not measured: every per-node rate from the largest size measured, times "
        "(N / that size) ** b,",
        f"  b fitted through the two largest sizes measured ({sources}; 0 with one size); "
        "etcd's cores are the unit costs",
        "  above times the projected rates (each Range read as the whole job: N records). "
        "Rates capped by this machine's",
        "  CPU at the measured sizes (see the notes) project as capped.",
    ]
    for side, projs in projections.items():
        lines.append(f"{side:<46}" + "".join(f"{'N=' + str(p.nodes):>12}" for p in projs))
        for label, get in PROJECTED:
            lines.append(f"{'  ' + label:<46}" + "".join(f"{_fmt(get(p)):>12}" for p in projs))
    return "\n".join(lines)
