"""Growth (issue 16): two `phalanx run` daemons train, a third joins mid-run, and each
group's share of the global batch and its step time should fall to 2/3 of what they
were with two groups.

    python -m bench.growth [--workloads fixed-rate,compute] [--steps 240]

For each workload it runs an embedded etcd and daemons node-a and node-b, starts
node-c once they have committed `--before` steps together, and reads every
`train_step` event. It prints, per group, the items it trained per step and its
median step time with two and with three participants, their ratio, and the ratio
expected from the shares.

* ``fixed-rate``: bench/fixed_rate_workload.py, whose forward holds each rank for a
  fixed time per item (each group's own accelerator, in effect).
* ``compute``: the built-in Llama (dim 128, 2 layers) on the CPU. On a 2-core machine
  three groups share two cores, so their step time cannot fall with their share;
  the figure shows how much of it does.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.peer_procs import ROOT, Event, Tail, child_env, scratch, spawn
from bench.peer_settings import job_toml
from bench.peer_systems import daemon_argv
from daemon.children import kill_tree
from daemon.coordination.etcd_server import EmbeddedEtcd

NODES = ("node-a", "node-b", "node-c")
BATCH, MICRO = 12, 2  # two groups: 6 items (3 micro-batches) each; three: 4 items (2)

WORKLOADS: dict[str, dict[str, dict[str, Any]]] = {
    "fixed-rate": {
        "workload": {"spec": "bench.fixed_rate_workload:spec", "python_path": [str(ROOT)]},
        "workload.options": {"ms_per_item": 20.0},
    },
    "compute": {
        "model": {"vocab_size": 256, "dim": 128, "n_layers": 2, "n_heads": 4, "max_seq_len": 64},
    },
}


def job_file(workload: str, steps: int) -> str:
    sections: dict[str, dict[str, Any]] = {
        "job": {"name": f"growth-{workload}", "min_replicas": 1, "max_replicas": 3},
        "node": {"nproc": 1, "advertise_host": "127.0.0.1"},
        **WORKLOADS[workload],
        "train": {
            "steps": steps,
            "seq_len": 64,
            "batch_size": MICRO,
            "global_batch_size": BATCH,
            "log_every": 1,
        },
    }
    return job_toml("bench/growth.py", sections)


def start(workdir: Path, node: str, job: Path, etcd: str, extra: list[str]) -> Any:
    argv = daemon_argv(job, node, etcd, workdir / node, extra)
    return spawn(argv, workdir / f"{node}.log", child_env())


def run(
    workdir: Path, workload: str, steps: int, before: int, extra: list[str]
) -> dict[str, list[Event]]:
    """The train_step events of each node, from a run where node-c joins after `before`
    steps of node-a and node-b together."""
    job = workdir / "job.toml"
    workdir.mkdir(parents=True, exist_ok=True)
    job.write_text(job_file(workload, steps))
    etcd = EmbeddedEtcd(workdir / "etcd").start()
    daemons: dict[str, Any] = {}
    tail = Tail()
    events: dict[str, list[Event]] = {n: [] for n in NODES}

    def poll() -> None:
        for node, proc in daemons.items():
            events[node] += [e for e in tail.events(workdir / f"{node}.log") if "event" in e]
            if proc.poll() is not None and not any(
                e["event"] == "train_done" for e in events[node]
            ):
                raise RuntimeError(f"{node}'s daemon exited; see {workdir / node}.log")

    def together() -> int:
        return sum(
            1 for e in events["node-b"] if e["event"] == "train_step" and e.get("participants") == 2
        )

    try:
        for node in NODES[:2]:
            daemons[node] = start(workdir, node, job, etcd.endpoint, extra)
        while together() < before:
            poll()
            time.sleep(0.5)
        daemons["node-c"] = start(workdir, "node-c", job, etcd.endpoint, extra)
        while not all(any(e["event"] == "train_done" for e in events[n]) for n in NODES):
            poll()
            time.sleep(0.5)
    finally:
        kill_tree([p.pid for p in daemons.values()])
        for p in daemons.values():
            p.wait()
        etcd.stop()
    return {n: [e for e in es if e["event"] == "train_step"] for n, es in events.items()}


def report(workload: str, steps: dict[str, list[Event]]) -> list[str]:
    """Per group: items per step and median step time with two and with three groups in
    the quorum (steps with a share; the first three of each leave out the change)."""
    lines = [
        f"{workload}:",
        f"  {'group':8} {'steps 2 / 3':>12} {'items/step 2 -> 3':>18} "
        f"{'median step s 2 -> 3':>22} {'ratio':>7} {'expected':>9}",
    ]
    for node, es in steps.items():
        by_count: dict[int, list[Event]] = {}
        for e in es:
            if e["items"][0] != e["items"][1] and int(e["step"]) > 3:
                by_count.setdefault(int(e["participants"]), []).append(e)
        share = {
            c: int(statistics.median(e["items"][1] - e["items"][0] for e in v))
            for c, v in by_count.items()
        }
        median = {
            c: statistics.median(float(e["step_seconds"]) for e in v[3:])
            for c, v in by_count.items()
            if len(v) > 6
        }
        two, three = median.get(2), median.get(3)
        counts = f"{len(by_count.get(2, []))} / {len(by_count.get(3, []))}"
        shares = f"{share.get(2, '-')} -> {share.get(3, '-')}"
        times = " -> ".join("-" if t is None else f"{t:.3f}" for t in (two, three))
        ratio = f"{three / two:.3f}" if two and three else "-"
        expected = f"{share[3] / share[2]:.3f}" if 2 in share and 3 in share else "-"
        lines.append(f"  {node:8} {counts:>12} {shares:>18} {times:>22} {ratio:>7} {expected:>9}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="fixed-rate,compute")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--before", type=int, default=60, help="steps of two groups before node-c")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--set", dest="settings", action="append", default=[], help="a daemon setting, KEY=VALUE"
    )
    args = parser.parse_args(argv)
    names = [w for w in args.workloads.split(",") if w]
    bad = [w for w in names if w not in WORKLOADS]
    if bad:
        print(f"--workloads: unknown {bad}; known: {sorted(WORKLOADS)}", file=sys.stderr)
        return 2
    print(
        f"machine: {platform.machine()}, {platform.python_version()}, global batch {BATCH}, micro-batch {MICRO}"
    )
    with scratch("phalanx-growth-", args.keep) as tmp:
        for name in names:
            steps = run(tmp / name, name, args.steps, args.before, args.settings)
            print("\n".join(report(name, steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
