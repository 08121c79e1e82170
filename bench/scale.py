"""Coordination at scale (issue 35): N simulated Phalanx nodes against one real etcd,
today's coordination code (a baseline revision) side by side with the working tree's.

Each node is the daemon's own coordination, minus ranks (bench/scale_node.py): a
``DaemonConfig``, a ``Coordinator``, a ``NodeView`` and an ``EtcdUpkeep`` ticked as
``Supervisor.run`` ticks them; the leader runs torchft's real lighthouse (on a free port,
so a new leader never waits for an old one's). The nodes live in a few worker processes
(bench/scale_fleet.py) against an embedded etcd on loopback, one fresh etcd per run.

For each size N and each side, one run (bench/scale_run.py): the time until all N are
registered and every slot is held by a RUNNING node; over a steady-state window, etcd
requests per second per node by kind, watch events per node, bytes, etcd's CPU, the
workers' CPU per node, history growth (bytes put per hour) and the revision rate, all
from etcd's own metrics and /proc; then the leader failover after a lease expiry (the
leader's process stalled) and after a revoke. Sizes named in ``--project`` are not run:
they are projected from the measured ones (and say so).

    python -m bench.scale --nodes 10,100,300 --window 30 [--project 1000,10000] \\
        [--baseline REV | --no-baseline] [--procs P] [--spares S] [--json PATH]

The baseline's ``daemon/`` and ``trainer/`` come from ``git archive REV`` (default
d6fcabc, main before issue 35's coordination changes); the new side is the working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import scale_costs
from bench.peer_procs import scratch
from bench.scale_fleet import ROOT, Tree
from bench.scale_measures import Projection, UnitCosts, etcd_cores, projection
from bench.scale_report import costs_table, projection_table, size_table
from bench.scale_run import Options, RunResult, run, say
from daemon.coordination.etcd_server import find_etcd_binary

DEFAULT_BASELINE = "d6fcabc"


def sizes(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if any(n < 2 for n in out):
        raise argparse.ArgumentTypeError("every size needs at least 2 nodes")
    return out


def baseline_tree(rev: str, into: Path) -> Tree:
    """The revision's daemon/ and trainer/, extracted under `into`."""
    label = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "daemon", "trainer"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    tar_path = into / "tree.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    tar_path.unlink()
    return Tree("baseline", label, into)


def machine() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    version = subprocess.run(
        [find_etcd_binary(), "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n")[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 1e6, 1),
        "etcd": version,
        "python": platform.python_version(),
    }


def projections(
    results: Sequence[RunResult], targets: Sequence[int], costs: UnitCosts
) -> dict[str, list[Projection]]:
    """Each side's projections, from its runs in which every node came to run."""
    out: dict[str, list[Projection]] = {}
    for side in ("baseline", "new"):
        measured = [
            (r.nodes, {**r.window, **r.join})
            for r in results
            if r.side == side and r.running_s is not None
        ]
        if measured and targets:
            out[side] = [projection(measured, n, costs) for n in targets]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=sizes, default=[10, 100], help="sizes to run (default 10,100)")
    p.add_argument("--project", type=sizes, default=[], help="sizes to project, not run")
    p.add_argument("--window", type=float, default=20.0, help="steady-state window (s)")
    p.add_argument("--settle", type=float, default=5.0, help="wait after all RUNNING (s)")
    p.add_argument(
        "--settle-max", type=float, default=120.0,
        help="then wait at most this long for the nodes' rounds to come back to their tick",
    )  # fmt: skip
    p.add_argument("--procs", type=int, default=0, help="worker processes besides the leader's")
    p.add_argument("--spares", type=int, default=0, help="nodes beyond job.max_replicas")
    p.add_argument("--ttl", type=int, default=None, help="etcd.lease_ttl_s (daemon default)")
    p.add_argument("--join-timeout", type=float, default=120.0, help="give up joining after (s)")
    p.add_argument("--no-failover", action="store_true", help="skip the two leader failovers")
    p.add_argument(
        "--ramp", action="store_true",
        help="start one worker's nodes at a time (measures the steady state of a size "
        "whose simultaneous join this machine cannot carry)",
    )  # fmt: skip
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the baseline")
    p.add_argument("--no-baseline", action="store_true", help="run the working tree only")
    p.add_argument("--json", type=Path, help="write every measure here")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    args = p.parse_args(argv)
    opts = Options(
        window=args.window,
        settle=args.settle,
        settle_max=args.settle_max,
        procs=args.procs,
        spares=args.spares,
        ttl=args.ttl,
        join_timeout=args.join_timeout,
        failover=not args.no_failover,
        ramp=args.ramp,
    )
    facts = machine()
    say(f"machine: {facts}")
    results: list[RunResult] = []
    started = time.monotonic()
    with scratch("phalanx-scale-", args.keep) as root:
        say("  etcd's unit costs (a fresh etcd, one kind of request at a time)")
        costs = scale_costs.measure(root / "costs")
        say("\n" + costs_table(costs) + "\n")
        trees = [] if args.no_baseline else [baseline_tree(args.baseline, root / "baseline")]
        trees.append(Tree("new", "working tree", ROOT))
        for n in args.nodes:
            runs: dict[str, RunResult] = {}
            for tree in trees:
                say(f"  N={n} {tree.side} ({tree.label})")
                t = time.monotonic()
                runs[tree.side] = run(tree, n, opts, root / f"{tree.side}-{n}")
                results.append(runs[tree.side])
                say(f"    {tree.side}: run took {time.monotonic() - t:.0f}s")
            for r in runs.values():
                if r.window:
                    r.window["etcd cpu % by the unit costs"] = 100 * etcd_cores(r.window, n, costs)
            say("\n" + size_table(n, runs) + "\n")
    projected = projections(results, args.project, costs)
    if projected:
        ran = sorted({r.nodes for r in results if r.running_s is not None})
        say(projection_table(projected, f"N = {', '.join(map(str, ran))}") + "\n")
    elif args.project:
        say("no projection: no size ran with every node RUNNING, so none has a steady state\n")
    say(f"total time {time.monotonic() - started:.0f}s")
    if args.json:
        doc = {
            "machine": facts,
            "options": asdict(opts),
            "baseline": args.baseline if not args.no_baseline else None,
            "runs": [asdict(r) for r in results],
            "unit_costs": asdict(costs),
            "projections": {s: [asdict(x) for x in ps] for s, ps in projected.items()},
        }
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
