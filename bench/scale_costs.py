"""etcd's unit costs on this machine, for bench/scale.py's projections: the CPU etcd
spends on one request of each kind the daemons send, measured one kind at a time
against a fresh embedded etcd (its ``/proc/<pid>/stat``, less its idle rate).

* a write: a compare-and-swap transaction putting a node record (about 270 bytes) on a
  lease, as ``Coordinator.register`` does;
* a lease refresh on a stream of its own (``pyetcd``'s ``refresh_lease``, as
  ``_Session.refresh`` sends it), and one on a stream that stays open;
* a prefix read of M records (M = 10, 100, 1,000), fitted as ``r0 + r1 * M``;
* one event sent to one watcher (W clients, each watching the prefix on its own
  connection as every daemon does), the writes' own cost taken off.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyetcd
from pyetcd import etcdrpc
from pyetcd import transactions as txn

from bench.scale_fleet import HZ, ticks_of
from bench.scale_measures import UnitCosts, fit_line
from daemon.coordination.etcd_server import EmbeddedEtcd

RECORD = "x" * 270
SETTLE_S = 0.3  # etcd commits its backend every 100 ms: let a phase's work finish
# Enough of each for some 0.3 s of etcd CPU: /proc counts it in 10 ms ticks.
READS = {10: 2000, 100: 1000, 1000: 200}  # prefix size -> reads
WRITES = KEEPALIVES = 1200
STREAMED = 6000  # refreshes on one open stream
WATCHERS, EVENTS = 100, 400


class _Meter:
    """etcd's CPU seconds over a phase, less what it spends idle in that time."""

    def __init__(self, pid: int, idle_per_s: float) -> None:
        self.pid, self.idle = pid, idle_per_s

    def __enter__(self) -> _Meter:
        self.t, self.ticks = time.monotonic(), ticks_of(self.pid)
        return self

    def __exit__(self, *_: object) -> None:
        time.sleep(SETTLE_S)
        span = time.monotonic() - self.t
        self.cpu_s = max(0.0, (ticks_of(self.pid) - self.ticks) / HZ - self.idle * span)


def _client(etcd: EmbeddedEtcd) -> Any:
    host, port = etcd.endpoint.rsplit(":", 1)
    return pyetcd.client(host=host, port=int(port))


def _idle(pid: int, seconds: float = 2.0) -> float:
    before = ticks_of(pid)
    time.sleep(seconds)
    return (ticks_of(pid) - before) / HZ / seconds


def _writes(c: Any, pid: int, idle: float) -> float:
    lease = c.lease(60)
    keys = [f"/cal/w/nodes/{i}" for i in range(50)]
    last = {k: "" for k in keys}
    for k in keys:
        c.put(k, RECORD, lease=lease)
        last[k] = RECORD
    with _Meter(pid, idle) as m:
        for i in range(WRITES):
            k = keys[i % len(keys)]
            value = f"{RECORD[:-8]}{i:08d}"
            c.transaction(
                compare=[txn.Value(k) == last[k]], success=[txn.Put(k, value, lease)], failure=[]
            )
            last[k] = value
    return m.cpu_s / WRITES


def _keepalives(c: Any, pid: int, idle: float) -> tuple[float, float]:
    """A refresh on a stream of its own, and one on a stream that stays open."""
    lease = c.lease(60)
    with _Meter(pid, idle) as alone:
        for _ in range(KEEPALIVES):
            list(c.refresh_lease(lease.id))
    request = etcdrpc.LeaseKeepAliveRequest(ID=lease.id)
    with _Meter(pid, idle) as shared:
        for _ in c.leasestub.LeaseKeepAlive(iter([request] * STREAMED), 60):
            pass
    return alone.cpu_s / KEEPALIVES, shared.cpu_s / STREAMED


def _reads(c: Any, pid: int, idle: float) -> tuple[float, float]:
    points = []
    for size, count in READS.items():
        prefix = f"/cal/r{size}/"
        for i in range(size):
            c.put(f"{prefix}nodes/{i}", RECORD)
        with _Meter(pid, idle) as m:
            for _ in range(count):
                c.get_prefix_response(prefix)
        points.append((float(size), m.cpu_s / count))
    return fit_line(points)


def _events(etcd: EmbeddedEtcd, c: Any, pid: int, idle: float, write_s: float) -> float:
    seen = threading.Semaphore(0)
    watchers = [_client(etcd) for _ in range(WATCHERS)]

    def count(response: Any) -> None:
        for _ in getattr(response, "events", None) or ():
            seen.release()

    for w in watchers:
        w.add_watch_prefix_callback("/cal/e/", count)
    time.sleep(0.5)
    with _Meter(pid, idle) as m:
        for i in range(EVENTS):
            c.put(f"/cal/e/nodes/{i % 50}", RECORD)
        deadline = time.monotonic() + 30
        for _ in range(EVENTS * WATCHERS):
            if not seen.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
    for w in watchers:
        w.close()
    return max(0.0, m.cpu_s - EVENTS * write_s) / (EVENTS * WATCHERS)


def measure(workdir: Path) -> UnitCosts:
    """Each unit cost against one fresh etcd (about 15 s)."""
    with EmbeddedEtcd(workdir / "etcd") as etcd:
        pid = etcd.pid
        assert pid is not None
        c = _client(etcd)
        try:
            idle = _idle(pid)
            write = _writes(c, pid, idle)
            keepalive, keepalive_msg = _keepalives(c, pid, idle)
            r0, r1 = _reads(c, pid, idle)
            event = _events(etcd, c, pid, idle, write)
        finally:
            c.close()
    return UnitCosts(
        write_s=write,
        keepalive_s=keepalive,
        keepalive_msg_s=keepalive_msg,
        read_s=max(r0, 0.0),
        read_per_record_s=max(r1, 0.0),
        event_s=event,
        idle_cores=idle,
    )
