"""How bench/peers.py drives a system through its phases: start it, wait until every
group commits and nothing warms up, run it until a time, kill a target, and read where
the CPU went meanwhile. Shared by the main comparison and the paired runs."""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench import peer_cpu
from bench.peer_measures import Kill
from bench.peer_settings import GROUPS
from bench.peer_systems import BareTorchft, Phalanx, System, Torchrun

SYSTEMS = ("torchrun", "torchft", "phalanx", "phalanx-cold")  # cold: node.standby = false
POLL_S = 0.1
DEFAULT_MAX_RESTARTS = 5  # daemon.config NodeConfig.max_restarts

R = TypeVar("R")


def say(text: str) -> None:
    print(text, flush=True)


def make(name: str, workdir: Path, args: argparse.Namespace) -> System:
    if name == "torchrun":
        return Torchrun(workdir, args.save_every)
    if name == "torchft":
        return BareTorchft(workdir)
    kills_per_node = math.ceil(kill_count(args) / 2)
    standby = name == "phalanx"
    # The default restart budget (5 in 600 s) would end a node killed more often than that.
    if kills_per_node <= DEFAULT_MAX_RESTARTS:
        return Phalanx(workdir, None, standby)
    say(f"  {name}: node.max_restarts={kills_per_node} ({kills_per_node} kills per node)")
    return Phalanx(workdir, kills_per_node, standby)


def kill_count(args: argparse.Namespace) -> int:
    if args.paired > 0:
        return int(args.paired)
    return math.ceil(args.chaos / args.kill_every) if args.kill_every > 0 else 0


def wait_ready(system: System, timeout: float) -> float:
    started = time.time()
    while not system.ready():
        if time.time() - started > timeout:
            raise RuntimeError(f"{system.name}: not every group committed within {timeout:.0f}s")
        system.poll()
        time.sleep(POLL_S)
    return time.time()


def run_until(system: System, end: float) -> None:
    while time.time() < end:
        system.poll()
        time.sleep(POLL_S)


def wait_quiet(system: System, not_before: float, args: argparse.Namespace, tag: str) -> float:
    """Run until `not_before` and then until nothing of the system is still warming up
    (Phalanx: every standby ready), at most --quiet-timeout seconds more; return when."""
    run_until(system, not_before)
    limit = time.time() + args.quiet_timeout
    while not system.quiet() and time.time() < limit:
        system.poll()
        time.sleep(POLL_S)
    if not system.quiet():
        note = f"still warming up {args.quiet_timeout:.0f}s after {not_before - system.t0:.0f}s"
        system.notes.append(note)
        say(f"  [{tag}] {note}; measuring anyway")
    return time.time()


def ranks(system: System) -> list[int]:
    """Every live rank: kill targets 0 .. GROUPS - 1 cover each rank (DDP) or group once."""
    return [p for index in range(GROUPS) for p in system.victim(index)[2]]


def cpu_window(system: System, end: float) -> Counter[str]:
    """Run until `end`; where the machine's CPU went meanwhile (:func:`peer_cpu.window`)."""
    start = peer_cpu.snapshot()
    run_until(system, end)
    return peer_cpu.window(start, peer_cpu.snapshot(), ranks(system))


def kill_now(system: System, index: int, patience: float) -> Kill | None:
    """Kill target `index`, retrying for `patience` seconds while it is not up."""
    give_up = time.time() + patience
    while True:
        system.poll()
        kill = system.kill(index)
        if kill is not None or time.time() >= give_up:
            return kill
        time.sleep(POLL_S)


def estimate_s(args: argparse.Namespace) -> float:
    """About how long the comparison takes (start-up ~10 s and a short tail per run)."""
    if args.paired > 0:
        per_run = 10 + args.warmup + 2 * args.paired * args.kill_every
    else:
        per_run = 10 + args.warmup + args.window + args.chaos + min(args.tail, 10) + args.after
    return float(per_run * args.repeats * len(args.systems))


def every_run(
    root: Path,
    args: argparse.Namespace,
    run: Callable[[str, Path, argparse.Namespace, str], R],
    failed: list[str],
) -> dict[str, list[R]]:
    """`run` for each of --systems, --repeats times, interleaved (a slow spell of the
    machine hits every system); a run that fails is added to `failed` and the rest go on."""
    runs: dict[str, list[R]] = {name: [] for name in args.systems}
    for repeat in range(args.repeats):
        for name in args.systems:
            tag = f"{name} #{repeat + 1}"
            try:
                runs[name].append(run(name, root / f"{name}-{repeat + 1}", args, tag))
            except RuntimeError as e:
                say(f"  [{tag}] FAILED: {e}")
                failed.append(f"{tag}: {e}")
    return runs


def report_failed(args: argparse.Namespace, failed: list[str]) -> None:
    """Say which runs failed, and keep the files: their logs are what explains them."""
    if failed:
        args.keep = True
        say(f"\n{len(failed)} run(s) failed: " + "; ".join(failed))
