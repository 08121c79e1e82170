"""One run of bench/scale.py: N simulated nodes of one tree against a fresh etcd.

Phases: node 0 starts alone and leads; the other N-1 start together (t = 0) and the
run waits until all N are registered and every slot is held by a RUNNING node; after
``settle`` seconds, the steady-state window; then two leader failovers, each followed
by a wait until everyone runs again:

* expiry: node 0's worker stalls (SIGSTOP: no keepalive, no round), etcd expires its
  lease after the TTL; measured from the stall and from its last confirmed keepalive
  to a new leader key and to that leader's ``lighthouse`` key;
* revoke: the bench revokes the current leader's lease with its own client; measured
  from the revoke to the new leader key and lighthouse key.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyetcd

from bench.scale_fleet import HZ, Fleet, Tree, snapshot
from bench.scale_measures import DB_BYTES, RSS, Snapshot, rates, total
from daemon.coordination.etcd_server import EmbeddedEtcd
from daemon.supervision.supervisor import TICK_S

QUIET_ROUNDS = 1.25  # rounds per TICK_S that count as a node's loop at rest

JOB = "scale"
POLL_S = 0.01  # failover polls
STATS_EVERY_S = 0.5
SATURATED_PCT = 90.0


@dataclass
class Options:
    window: float = 20.0
    settle: float = 5.0
    settle_max: float = 120.0  # then measure anyway (settle())
    procs: int = 0  # 0: chosen from N
    spares: int = 0
    ttl: int | None = None  # None: the daemon's default etcd.lease_ttl_s
    join_timeout: float = 120.0
    failover: bool = True
    ramp: bool = False  # start the workers one after another (a size too big to join at once)


@dataclass
class RunResult:
    side: str
    label: str
    nodes: int
    procs: int
    ttl: int
    daemon_dirs: list[str] = field(default_factory=list)
    registered_s: float | None = None
    running_s: float | None = None
    join: dict[str, float] = field(default_factory=dict)  # totals per node over the join
    window: dict[str, float] = field(default_factory=dict)  # rates (see scale_measures)
    failover: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def say(text: str) -> None:
    print(text, flush=True)


def procs_for(nodes: int, asked: int) -> int:
    return asked if asked > 0 else max(2, min(8, -(-(nodes - 1) // 50)))


def job_file(path: Path, endpoint: str, slots: int, ttl: int | None) -> Path:
    etcd = f'endpoints = ["{endpoint}"]' + (f"\nlease_ttl_s = {ttl}" if ttl else "")
    path.write_text(
        f'[job]\nname = "{JOB}"\nmin_replicas = 1\nmax_replicas = {slots}\n\n'
        f"[etcd]\n{etcd}\n\n"
        '[node]\nnproc = 1\ndevice = "cpu"\nadvertise_host = "127.0.0.1"\nstandby = false\n'
        "http_port = 0\nlighthouse_port = 0\nlighthouse_proxy_port = 0\n"
    )
    return path


def wait_until(
    fleet: Fleet, done: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while True:
        s = fleet.stats()
        if done(s):
            return s
        if time.monotonic() > deadline:
            return None
        time.sleep(STATS_EVERY_S)


def all_running(nodes: int, slots: int) -> Callable[[dict[str, Any]], bool]:
    want = min(nodes, slots)
    return lambda s: s["registered"] == nodes and s["states"].get("running", 0) == want


def running_at_least(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda s: bool(s["states"].get("running", 0) >= count)


def _holder(value: bytes | None) -> str | None:
    try:
        return str(json.loads(value or b"{}").get("node"))
    except (ValueError, AttributeError):
        return None


def new_term(client: Any, old_epoch: int, since: float, timeout: float) -> dict[str, Any]:
    """Poll until a leader key of a later term exists, then its lighthouse key; seconds
    from `since` (monotonic) to each."""
    prefix = f"/phalanx/{JOB}/"
    out: dict[str, Any] = {}
    deadline = since + timeout
    while time.monotonic() < deadline:
        value, meta = client.get(prefix + "leader")
        if value is not None and meta.create_revision > old_epoch:
            if "leader_s" not in out:
                out["leader_s"] = time.monotonic() - since
                out["new_leader"], out["epoch"] = _holder(value), meta.create_revision
            lh, lh_meta = client.get(prefix + "lighthouse")
            if lh is not None and lh_meta.mod_revision > out["epoch"]:
                out["lighthouse_s"] = time.monotonic() - since
                return out
        time.sleep(POLL_S)
    out["timed_out"] = timeout
    return out


def leader_key(client: Any) -> tuple[str | None, int, int]:
    value, meta = client.get(f"/phalanx/{JOB}/leader")
    if value is None:
        return None, 0, 0
    return _holder(value), int(meta.create_revision), int(meta.lease_id)


def fail_over_by_expiry(fleet: Fleet, client: Any, ttl: int) -> dict[str, Any]:
    holder, epoch, _ = leader_key(client)
    if holder != "node-00000":
        return {"skipped": f"the leader is {holder}, not the stalled worker's node-00000"}
    worker = fleet.workers[0]
    worker.stalled = True
    reply = worker.ask("stall")  # it answers, then stops itself
    stalled_at, confirmed = reply["stalled_at"], reply["confirmed"][0]
    out = new_term(client, epoch, stalled_at, timeout=3 * ttl + 10)
    worker.resume()
    out["ttl_s"] = ttl
    if confirmed is not None:
        out["since_keepalive_s"] = stalled_at - confirmed
        for key in ("leader_s", "lighthouse_s"):
            if key in out:
                out[f"{key[:-2]}_after_keepalive_s"] = out[key] + stalled_at - confirmed
    return out


def fail_over_by_revoke(client: Any) -> dict[str, Any]:
    holder, epoch, lease = leader_key(client)
    if holder is None:
        return {"skipped": "no leader"}
    started = time.monotonic()
    client.revoke_lease(lease)
    out = new_term(client, epoch, started, timeout=30.0)
    out["old_leader"] = holder
    return out


def recover(fleet: Fleet, nodes: int, slots: int, since: float, timeout: float) -> float | None:
    s = wait_until(fleet, all_running(nodes, slots), timeout)
    return None if s is None else time.monotonic() - since


def run(tree: Tree, nodes: int, opts: Options, workdir: Path) -> RunResult:
    workdir.mkdir(parents=True, exist_ok=True)
    slots = max(1, nodes - opts.spares)
    procs = procs_for(nodes, opts.procs)
    result = RunResult(tree.side, tree.label, nodes, procs, opts.ttl or 0)
    with EmbeddedEtcd(workdir / "etcd") as etcd:
        job = job_file(workdir / "job.toml", etcd.endpoint, slots, opts.ttl)
        host, port = etcd.endpoint.rsplit(":", 1)
        client = pyetcd.client(host=host, port=int(port))
        fleet = Fleet(tree, job, workdir / "nodes", nodes, procs)
        try:
            _phases(fleet, etcd, client, result, slots, opts)
        finally:
            fleet.stop()
            result.events = dict(fleet.events().most_common())
            client.close()
    return result


def _phases(
    fleet: Fleet, etcd: EmbeddedEtcd, client: Any, r: RunResult, slots: int, opts: Options
) -> None:
    n = r.nodes
    fleet.ready(timeout=60.0 + n / 5)
    r.daemon_dirs = sorted(fleet.daemon_dirs)
    fleet.workers[0].ask("go")
    if wait_until(fleet, lambda s: "node-00000" in s["leaders"], 30.0) is None:
        r.notes.append("node-00000 did not lead within 30 s")
    _, _, lease = leader_key(client)
    r.ttl = int(client.get_lease_info(lease).grantedTTL) if lease else r.ttl
    before = snapshot(etcd, fleet, with_stats=False)
    t0 = time.monotonic()
    if opts.ramp:  # one worker's nodes at a time, each wave once the last runs
        r.notes.append("ramped start: one worker's nodes joined at a time")
        started = 1
        for w in fleet.workers[1:]:
            w.send("go")
            w.wait(30.0)
            started += int(w.count)
            wait_until(fleet, running_at_least(started), 120.0)
    else:
        for w in fleet.workers[1:]:
            w.send("go")
        for w in fleet.workers[1:]:
            w.wait(30.0)
    where = ", ".join(r.daemon_dirs)
    say(f"    {r.side}: {n} nodes in {len(fleet.workers)} workers (daemon from {where}) started")
    joined = wait_until(fleet, all_running(n, slots), opts.join_timeout)
    if joined is None:
        s = fleet.stats()
        r.notes.append(
            f"not all RUNNING within {opts.join_timeout:g}s: {s['registered']} registered, "
            f"{s['states'].get('running', 0)} running of {min(n, slots)} slots"
        )
    else:
        r.registered_s = joined["last_registered"] - t0
        r.running_s = joined["last_running"] - t0
        after = snapshot(etcd, fleet, with_stats=False)
        span = after.t - before.t
        join = rates(before, after, n, HZ)
        r.join = {
            "join requests per node": join["requests"] * span,
            "join sent B per node": join["sent B/s per node"] * span,
            "join Txn per node": join.get("unary Txn", 0.0) * span,
            "join Range per node": join.get("unary Range", 0.0) * span,
        }
        say(f"    {r.side}: all RUNNING after {r.running_s:.1f}s")
    time.sleep(opts.settle)
    waited = settle(fleet, n, opts.settle_max)
    if waited is not None:
        r.notes.append(f"the nodes' rounds came back to their tick {waited:.0f}s after the settle")
    w0 = snapshot(etcd, fleet)
    time.sleep(opts.window)
    w1 = snapshot(etcd, fleet)
    r.window = rates(w0, w1, n, HZ, os.cpu_count() or 1)
    _resources(r.window, w1)
    r.window["worker RSS MB per node"] = fleet.rss_bytes() / 1e6 / n
    r.notes += saturation(r.window)
    say(f"    {r.side}: window of {w1.t - w0.t:.1f}s measured")
    if not opts.failover or joined is None:
        return
    since = time.monotonic()
    r.failover["expiry"] = fail_over_by_expiry(fleet, client, r.ttl)
    r.failover["expiry"]["all_running_again_s"] = recover(fleet, n, slots, since, 60.0)
    say(f"    {r.side}: failover after expiry {r.failover['expiry']}")
    since = time.monotonic()
    r.failover["revoke"] = fail_over_by_revoke(client)
    r.failover["revoke"]["all_running_again_s"] = recover(fleet, n, slots, since, 60.0)
    say(f"    {r.side}: failover after revoke {r.failover['revoke']}")


def settle(fleet: Fleet, n: int, most_s: float) -> float | None:
    """Wait until the nodes' rounds are back to about one per TICK_S (their watches have
    drained the join's events, which N nodes on one machine receive N times over); the
    seconds waited, None at once. Gives up after `most_s`."""
    start = time.monotonic()
    while time.monotonic() - start < most_s:
        a = fleet.stats()
        time.sleep(2.0)
        b = fleet.stats()
        if (b["ticks"] - a["ticks"]) / 2.0 / n <= QUIET_ROUNDS / TICK_S:
            waited = time.monotonic() - start
            return None if waited < 2.5 else waited
    return most_s


def saturation(window: dict[str, float]) -> list[str]:
    """Notes on a window in which the simulator could not keep up."""
    notes = []
    busy = window.get("machine busy %", 0.0)
    if busy >= SATURATED_PCT:
        notes.append(
            f"the machine was {busy:.0f}% busy: rates that follow the nodes' loops (reads, "
            "rounds) are capped by this machine's CPU here, so they are lower bounds"
        )
    rounds, spent = window.get("rounds/s per node", 0.0), window.get("round ms", 0.0)
    if spent > 1e3 * TICK_S / 2:
        notes.append(
            f"a round took {spent:.0f} ms on average ({rounds:.1f} rounds/s per node): "
            "the nodes' loops were slowed by the CPU (the GIL included)"
        )
    return notes


def _resources(window: dict[str, float], end: Snapshot) -> None:
    window["etcd RSS MB"] = total(end.metrics, RSS) / 1e6
    window["etcd db MB"] = total(end.metrics, DB_BYTES) / 1e6
