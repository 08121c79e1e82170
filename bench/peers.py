"""Phalanx side by side with plain torchrun DDP and bare torchft: throughput, recovery
from SIGKILLed ranks, and goodput, on one model, one data source and one thread per rank.

Systems (bench/peer_systems.py), each two ranks on this machine:

* ``torchrun``: ``torchrun --nproc_per_node 2`` DDP over gloo, a synchronous DCP save
  every 20 steps; a dead worker restarts the world from the newest save.
* ``torchft``: a ``torchft_lighthouse`` (Phalanx's default lighthouse settings) and two
  one-process replica groups with a ``torchft.Manager``; the benchmark relaunches a
  group as soon as it sees it dead, and torchft heals it from its peer.
* ``phalanx``: an embedded etcd and two ``phalanx run`` daemons (one rank each) with
  the project's default lighthouse, node and ft settings.

Each repeat of each system is one run: a warm-up (not measured) from the moment every
group has committed, and on until nothing is warming up (Phalanx: every standby ready),
a failure-free window (steps/s), then a chaos window in which one rank, alternating
between ranks/groups, is SIGKILLed every --kill-every seconds, a tail that waits (up to
--tail s) until the last kill can be measured, and a second failure-free window (--after
s) once nothing warms up again. The failure-free rate is that of both windows together:
this machine's speed drifts by up to a quarter within minutes, and a rate measured on
one side of the chaos window alone moved goodput by as much. How each measure
is counted is printed with the results (see COUNTING).

    .venv/bin/python -m bench.peers [--repeats N] [--window S] [--kill-every S] \\
        [--warmup S] [--chaos S] [--systems torchrun,torchft,phalanx] [--rows N] [--json PATH]
    .venv/bin/python -m bench.peers --chaos 0 --after 0 --rows 2   # failure-free, short steps
    .venv/bin/python -m bench.peers --soak 600    # Phalanx only, no failures
    .venv/bin/python -m bench.peers --paired 8    # kill cycles beside kill-free ones

``--paired N`` measures goodput a second way (bench/peer_paired.py): after the warm-up,
N pairs of --kill-every second cycles, a SIGKILL at the start of one and none in the
other, the pairs alternating which comes first; the kill cycles' work over the kill-free
cycles' work. The failure-free reference then comes from the minutes around each kill,
not from windows minutes away at the ends of the chaos, so the machine's drift weighs
less on it.

``phalanx-cold`` (not run unless named in --systems) is Phalanx with
``node.standby = false``: every restart starts its rank cold.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from bench import peer_cpu, peer_report
from bench.peer_measures import (
    Kill,
    RunResult,
    after_kills,
    goodput,
    measure_kill,
    pooled_rate,
    rate,
    settled,
)
from bench.peer_paired import paired
from bench.peer_phases import (
    POLL_S,
    SYSTEMS,
    cpu_window,
    estimate_s,
    every_run,
    kill_count,
    kill_now,
    make,
    report_failed,
    run_until,
    say,
    wait_quiet,
    wait_ready,
)
from bench.peer_settings import ROWS_ENV, rows
from bench.peer_systems import Phalanx, System


def chaos(system: System, start: float, args: argparse.Namespace, tag: str) -> list[Kill]:
    """The chaos window: kill number k is due at start + k * kill_every; a kill whose
    target is not up (a group still restarting) is retried until half an interval late."""
    end = start + args.chaos
    kills: list[Kill] = []
    for index in range(kill_count(args)):
        due = start + index * args.kill_every
        run_until(system, due)
        patience = min(due + args.kill_every / 2, end) - time.time()
        kill = kill_now(system, index, patience)
        if kill is None:
            say(f"  [{tag}] kill {index + 1} skipped: no live target")
            continue
        kills.append(kill)
        say(f"  [{tag}] kill {index + 1}: {kill.label} at +{kill.t - start:.1f}s")
    run_until(system, end)
    return kills


def run_once(name: str, workdir: Path, args: argparse.Namespace, tag: str) -> RunResult:
    system = make(name, workdir, args)
    launched = time.time()
    try:
        system.start()
        ready = wait_ready(system, args.start_timeout)
        system.t0 = ready
        say(f"  [{tag}] every group committing {ready - launched:.1f}s after launch")
        w0 = wait_quiet(system, ready + args.warmup, args, tag)
        w1 = w0 + args.window
        cpu = [cpu_window(system, w1)]
        kills = chaos(system, w1, args, tag)
        c1 = w1 + args.chaos
        while time.time() < c1 + args.tail and not settled(system.timelines, kills):
            system.poll()
            time.sleep(POLL_S)
        a0 = wait_quiet(system, c1, args, tag) if args.after > 0 else time.time()
        a1 = a0 + args.after
        if args.after > 0:
            cpu.append(cpu_window(system, a1))
        system.poll()
        horizon = time.time()
    finally:
        system.stop()
    lines = system.timelines
    net = len(lines) == 1  # one world: its net progress (steps redone do not count)
    windows = [(w0, w1), (a0, a1)]
    rates = {g: pooled_rate(c, windows, net) for g, c in lines.items()}
    measures = [measure_kill(lines, k, horizon, system.milestones) for k in kills]
    phases = {
        "ready": ready,
        "window": w0,
        "chaos": w1,
        "chaos_end": c1,
        "after": a0,
        "after_end": a1,
        "horizon": horizon,
    }
    result = RunResult(name, rates, goodput(lines, rates, w1, c1), measures, phases, system.notes)
    result.after_kills = after_kills(lines, rates, kills, args.kill_every)
    result.cpu = peer_cpu.shares(cpu)
    before = sum(pooled_rate(c, windows[:1], net) for c in lines.values())
    if args.after > 0 and before > 0:
        result.drift = sum(pooled_rate(c, windows[1:], net) for c in lines.values()) / before
    say(f"  [{tag}] {peer_report.one_line(result)}")
    return result


def soak(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Phalanx alone, no failures: any sign that a healthy group was evicted."""
    system = Phalanx(workdir, None)
    try:
        system.start()
        ready = wait_ready(system, args.start_timeout)
        run_until(system, ready + args.warmup)
        system.count_after = time.time()
        quorums_before = system.quorum_changes()
        say(f"  [soak] warm-up done; watching {args.soak:.0f}s")
        run_until(system, system.count_after + args.soak)
        system.poll()
        quorums_after = system.quorum_changes()
    finally:
        system.stop()
    rates = {
        g: rate(c, system.count_after, system.count_after + args.soak)
        for g, c in system.timelines.items()
    }
    changes = None
    if quorums_before is not None and quorums_after is not None:
        changes = quorums_after - quorums_before
    return {
        "seconds": args.soak,
        "rates": rates,
        "counts": system.counts,
        "quorum_changes": changes,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds, not measured")
    parser.add_argument(
        "--window", type=float, default=60.0, help="failure-free seconds before the chaos"
    )
    parser.add_argument(
        "--after", type=float, default=60.0, help="failure-free seconds after the chaos (0: none)"
    )
    parser.add_argument(
        "--quiet-timeout",
        type=float,
        default=120.0,
        help="most seconds to wait for a system to finish warming up before a failure-free window",
    )
    parser.add_argument("--chaos", type=float, default=240.0, help="seconds with kills")
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills")
    parser.add_argument(
        "--tail",
        type=float,
        default=60.0,
        help="most seconds to wait after the chaos window for the last kill to be measurable",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS[:3]))
    parser.add_argument("--save-every", type=int, default=20, help="torchrun: DCP save interval")
    parser.add_argument("--start-timeout", type=float, default=180.0)
    parser.add_argument("--soak", type=float, default=0.0, help="seconds: Phalanx only, no kills")
    parser.add_argument(
        "--paired",
        type=int,
        default=0,
        help="pairs of --kill-every s cycles, one with a kill and one without (bench/peer_paired.py)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        help=f"rows per rank per step (default {rows()}): a shorter or longer step, as "
        f"{ROWS_ENV} sets it for every system's workers",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the logs and checkpoints")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        parser.error(f"--systems takes a comma-separated subset of {','.join(SYSTEMS)}")
    if args.rows is not None:
        if args.rows < 1:
            parser.error("--rows must be at least 1")
        os.environ[ROWS_ENV] = str(args.rows)  # the workers and the job file read it
    if args.kill_every <= 0 or args.repeats < 1 or args.paired < 0:
        parser.error(
            "--kill-every must be positive, --repeats at least 1 and --paired not negative"
        )
    return args


def interrupted(signum: int, _frame: object) -> NoReturn:
    for sig in (signal.SIGTERM, signal.SIGINT):  # a second Ctrl-C must not cut the cleanup short
        signal.signal(sig, signal.SIG_IGN)
    say(f"\n{signal.Signals(signum).name}: stopping every process")
    raise SystemExit(128 + signum)  # unwinds through every finally: no process is left


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a background job ignores it
        signal.signal(sig, interrupted)
    root = Path(tempfile.mkdtemp(prefix="phalanx-peers-"))
    say(peer_report.machine_line())
    say(peer_report.workload_line())
    say(f"files: {root}{'' if args.keep else ' (removed at the end; --keep keeps them)'}")
    out: dict[str, Any] = {
        "machine": peer_report.machine(),
        "args": vars(args) | {"json": str(args.json)},
    }
    try:
        if args.soak > 0:
            out["soak"] = soak(root / "soak", args)
            peer_report.print_soak(out["soak"])
        elif args.paired > 0:
            out |= paired(root, args)
        else:
            say(peer_report.phases_line(args, kill_count(args)))
            say(f"expected duration: about {estimate_s(args) / 60:.0f} min")
            failed: list[str] = out.setdefault("failed", [])
            runs = every_run(root, args, run_once, failed)
            out |= peer_report.print_results({k: v for k, v in runs.items() if v})
            report_failed(args, failed)
    finally:
        if args.json:
            args.json.write_text(json.dumps(out, indent=2, default=str))
        if args.keep:
            say(f"files kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if out.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
