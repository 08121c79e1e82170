"""Where the machine's CPU goes in the failure-free windows of ``bench.peers``.

Each system's ranks share the machine with whatever else the system runs: torchrun's
agent; bare torchft's lighthouse; Phalanx's daemons, etcd, lighthouse, zygotes and
standbys. On a machine with as many cores as ranks (this benchmark's two), every
CPU-second spent outside the ranks is one the ranks do not get, so it shows up in the
throughput ratio. A snapshot reads ``/proc`` for every descendant of the benchmark
process and the machine's counters; two snapshots around a window give each kind of
process's share of the machine's CPU time over it (steal is the hypervisor's share).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from daemon.children import descendants

RANKS, IDLE, STEAL = "ranks", "idle", "steal"


@dataclass(frozen=True)
class Snapshot:
    machine: tuple[int, ...]  # /proc/stat's first line: user nice system idle iowait ...
    procs: dict[int, tuple[int, str]]  # pid -> (user + system ticks, kind)


def kind(cmdline: Sequence[str]) -> str:
    """What a process of a benchmarked system is, from its command line."""
    if not cmdline:
        return "other"
    text = " ".join(cmdline)
    if Path(cmdline[0]).name == "etcd":
        return "etcd"
    if "daemon.cli" in text:  # before "lighthouse": its --set flags name lighthouse ports
        return "daemons"
    if "lighthouse" in text:
        return "lighthouse"
    if "torchrun" in text:
        return "torchrun agent"
    if "--zygote" in text or "-m trainer" in text:
        return "zygotes and standbys"  # a zygote's forks keep its command line
    return "other"


def _proc(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[11]) + int(fields[12]), kind([a for a in cmdline.split("\0") if a])


def snapshot(root: int | None = None) -> Snapshot:
    """The machine's counters and every descendant of `root` (this process by default)."""
    with open("/proc/stat") as f:
        machine = tuple(int(x) for x in f.readline().split()[1:])
    procs = {}
    for pid in descendants(os.getpid() if root is None else root):
        seen = _proc(pid)
        if seen is not None:
            procs[pid] = seen
    return Snapshot(machine, procs)


def window(before: Snapshot, after: Snapshot, ranks: Iterable[int]) -> Counter[str]:
    """Ticks over (before, after] by kind, the ranks' pids counted as ``ranks``; the
    machine's total under ``""``, its idle and iowait under ``idle``, steal under ``steal``."""
    rank_pids = set(ranks)
    out: Counter[str] = Counter()
    for pid, (ticks, what) in after.procs.items():
        old = before.procs.get(pid)
        out[RANKS if pid in rank_pids else what] += ticks - (old[0] if old else 0)
    delta = [b - a for a, b in zip(before.machine, after.machine, strict=False)]
    out[""] += sum(delta[:8])  # user..steal; guest time is already in user
    out[IDLE] += delta[3] + delta[4]
    out[STEAL] += delta[7] if len(delta) > 7 else 0
    return out


def shares(windows: Iterable[Counter[str]]) -> dict[str, float]:
    """Each kind's share of the machine's CPU time over all the windows together."""
    total: Counter[str] = Counter()
    for w in windows:
        total.update(w)
    machine = total.pop("", 0)
    if machine <= 0:
        return {}
    return {k: v / machine for k, v in sorted(total.items(), key=lambda kv: -kv[1]) if v > 0}


def outside_ranks(cpu: dict[str, float]) -> float:
    """The share of the machine the system's own processes took besides its ranks."""
    return sum(v for k, v in cpu.items() if k not in (RANKS, IDLE, STEAL))
