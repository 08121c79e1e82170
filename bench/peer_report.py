"""What bench/peers.py prints: the machine, the workload, ratios first, then a table of
min/median/max per system and measure, where the recovery time goes, and how each
measure is counted."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from importlib import metadata
from typing import Any

from bench import peer_cpu
from bench.peer_cpu import IDLE, RANKS, STEAL
from bench.peer_measures import (
    MEASURES,
    RunResult,
    Spread,
    median_or_none,
    milestone_medians,
    over_kills,
    over_repeats,
    ratio,
)
from bench.peer_settings import GROUPS, MODEL, rows, train, trainer_config

COUNTING = """\
How each measure is counted:
  failure-free steps/s  committed steps per second in the failure-free windows, the one
                        before the chaos and the one after it taken together (the machine's
                        speed drifts; "after/before" in each run's line shows by how much).
                        Each starts once nothing is warming up (phalanx: every standby
                        ready), as in a long job. torchrun: the
                        world's steps (each one 2 ranks x R rows). torchft, phalanx: each
                        replica group's committed steps (R rows each; the two groups step
                        together), and the mean of the two groups; the throughput ratio
                        compares that mean with torchrun's world steps/s (2 x R rows a step
                        both). R: the rows per rank per step (--rows; {rows} in this run).
  recovery s            SIGKILL -> the first committed step, by a process started after the
                        kill, of the killed rank's group (torchrun: of the world).
  steps redone          last step committed before the kill - (first step committed after
                        it - 1), at least 0 (torchrun: back to its newest DCP save;
                        torchft, phalanx: 0 when the group heals to the current step).
  survivors' longest    the longest gap between consecutive commits of the group not
  pause s               killed, from its last commit before the kill through two commits
                        after the killed group's recovery; torchrun has no survivor: the
                        world's pause (last commit before the kill -> first after it).
  goodput               useful steps in the chaos window / (failure-free rate x window).
                        torchrun: net progress of the world's step over the window (steps
                        redone do not count) / (its failure-free steps/s x window).
                        torchft, phalanx: new data trained by both groups in the window, in
                        group-steps of R rows (a torchft commit is one; a Phalanx commit is
                        its share of the 2 x R-row global batch: 1 with both groups up, 2 alone,
                        0 while it heals) / ((sum of the groups' failure-free steps/s) x window).
  min/median/max        over repeats; for a per-kill measure, each repeat's median over its
                        kills; k.min/k.med/k.max/n pool every kill of every repeat."""


def params() -> int:
    m = trainer_config().model
    block = 2 * m.dim * m.dim + 2 * m.dim * m.kv_heads * (m.dim // m.n_heads)
    block += 3 * m.dim * m.hidden + 2 * m.dim
    return 2 * m.vocab_size * m.dim + m.n_layers * block + m.dim


def machine() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for package in ("torch", "torchft"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "host": platform.node(),
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
    }


def machine_line() -> str:
    m = machine()
    return (
        f"machine: {m['host']} {m['arch']}, {m['cpus']} CPUs, Python {m['python']}, "
        f"torch {m['torch']}, torchft {m['torchft']}"
    )


def workload_line() -> str:
    return (
        f"workload: built-in Llama (dim {MODEL['dim']}, {MODEL['n_layers']} layers, vocab "
        f"{MODEL['vocab_size']}, {MODEL['n_heads']} heads, {params() / 1e6:.2f}M parameters), "
        f"synthetic bigram data, seq {train()['seq_len']}, {rows()} rows per rank per step, AdamW, "
        f"{GROUPS} ranks, one thread per rank"
    )


def phases_line(args: argparse.Namespace, kills: int) -> str:
    return (
        f"phases: warm-up {args.warmup:g}s (and until nothing warms up), failure-free "
        f"{args.window:g}s, chaos {args.chaos:g}s with a SIGKILL every {args.kill_every:g}s "
        f"({kills} kills, alternating ranks/groups), failure-free {args.after:g}s once settled; "
        f"{args.repeats} repeat(s), systems interleaved"
    )


def one_line(r: RunResult) -> str:
    rates = ", ".join(f"{v:.2f}" for v in r.rates.values())
    kills = "; ".join(
        f"{k.label}: recovery {_f(k.recovery_s)}s redone {_f(k.redone, 0)} pause {_f(k.pause_s)}s"
        for k in r.kills
    )
    drift = f" (after/before {r.drift:.2f})" if r.drift is not None else ""
    return f"steps/s {rates}{drift}; goodput {_f(r.goodput, 3)}; {kills or 'no kills'}"


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(
        c.ljust(w) if i < 2 else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def _cells(s: Spread, digits: int) -> list[str]:
    return [_f(s.min, digits), _f(s.median, digits), _f(s.max, digits)]


def print_results(runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    """Print ratios, the table and the recovery breakdown; return them for the JSON."""
    med: dict[str, dict[str, float | None]] = {
        name: {m: over_repeats(rs, m).median for m, _ in MEASURES} for name, rs in runs.items()
    }
    ratios = {
        "phalanx/torchrun throughput": ratio(
            med.get("phalanx", {}).get("steps_per_s"), med.get("torchrun", {}).get("steps_per_s")
        ),
        "phalanx/torchrun recovery": ratio(
            med.get("phalanx", {}).get("recovery_s"), med.get("torchrun", {}).get("recovery_s")
        ),
        "phalanx/torchft throughput": ratio(
            med.get("phalanx", {}).get("steps_per_s"), med.get("torchft", {}).get("steps_per_s")
        ),
        "phalanx/torchft recovery": ratio(
            med.get("phalanx", {}).get("recovery_s"), med.get("torchft", {}).get("recovery_s")
        ),
    }
    ratios |= {f"goodput {name}": med[name]["goodput"] for name in runs}
    print("\nratios (medians over repeats):")
    for key, value in ratios.items():
        print(f"  {key:<30} {_f(value, 3)}")
    widths = [9, 27, 7, 7, 7, 7, 7, 7, 4]
    print()
    print(
        _row(["system", "measure", "min", "median", "max", "k.min", "k.med", "k.max", "n"], widths)
    )
    table: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        table[name] = {}
        for key, title in MEASURES:
            digits = 0 if key == "redone" else 3 if key == "goodput" else 2
            s = over_repeats(rs, key)
            cells = [name, title, *_cells(s, digits)]
            per_kill = key not in ("steps_per_s", "goodput")
            k = over_kills(rs, key) if per_kill else Spread(0, None, None, None)
            cells += [*_cells(k, digits), str(k.n)] if per_kill else ["", "", "", ""]
            print(_row(cells, widths))
            table[name][key] = {"repeats": asdict(s), "kills": asdict(k) if per_kill else None}
    print("\nwhere the recovery time goes (median seconds after the SIGKILL, over kills):")
    breakdown = {name: milestone_medians(rs) for name, rs in runs.items()}
    for name, marks in breakdown.items():
        rec = median_or_none(k.recovery_s for r in runs[name] for k in r.kills)
        steps = ", ".join(f"{label} {seconds:.2f}" for label, seconds in marks.items())
        print(f"  {name:<9} {steps or '-'}; first commit {_f(rec)}")
    profiles = print_after_kills(runs)
    cpu = print_cpu(runs)
    print()
    print(COUNTING.replace("{rows}", str(rows())))
    return {
        "ratios": ratios,
        "table": table,
        "recovery_breakdown": breakdown,
        "after_kills": profiles,
        "cpu": cpu,
        "runs": {name: [r.as_json() for r in rs] for name, rs in runs.items()},
    }


def print_after_kills(runs: dict[str, list[RunResult]], bin_s: float = 2.0) -> dict[str, Any]:
    """Where goodput goes: useful work per bin after a kill over the failure-free rate's
    (mean over every kill of every repeat), and the seconds of work lost per kill."""
    print(
        f"\nwhere goodput goes (useful work per {bin_s:g} s after a kill / failure-free; mean over kills):"
    )
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        profiles = [r.after_kills for r in rs if r.after_kills]
        if not profiles:
            continue
        width = min(len(p) for p in profiles)
        mean = [round(sum(p[i] for p in profiles) / len(profiles), 2) for i in range(width)]
        lost = round(sum((1 - x) * bin_s for x in mean), 2)
        out[name] = {"bins": mean, "lost_s_per_kill": lost}
        print(f"  {name:<9} {' '.join(f'{x:.2f}' for x in mean)}; lost {lost:.2f} s per kill")
    return out


def print_cpu(runs: dict[str, list[RunResult]]) -> dict[str, dict[str, float]]:
    """Where the machine's CPU went in the failure-free windows (bench.peer_cpu), each
    kind's median share over the repeats."""
    print("\nwhere the CPU goes in the failure-free windows (share of the machine; median):")
    out: dict[str, dict[str, float]] = {}
    for name, rs in runs.items():
        kinds = {k for r in rs for k in r.cpu}
        med = {k: statistics.median(r.cpu.get(k, 0.0) for r in rs if r.cpu) for k in kinds}
        if not med:
            continue
        outside = statistics.median(peer_cpu.outside_ranks(r.cpu) for r in rs if r.cpu)
        per_step = statistics.median(ranks_ms_per_step(r) for r in rs if r.cpu)
        out[name] = med | {"outside ranks": outside, "ranks ms per step": per_step}
        rest = (RANKS, IDLE, STEAL)
        parts = ", ".join(f"{k} {v:.3f}" for k, v in med.items() if k not in rest and v >= 0.0005)
        print(
            f"  {name:<12} ranks {med.get(RANKS, 0):.3f}; outside the ranks {outside:.3f}"
            f" ({parts or 'nothing'}); idle {med.get(IDLE, 0):.3f}; steal {med.get(STEAL, 0):.3f};"
            f" the ranks' CPU per step {per_step:.0f} ms"
        )
    if "phalanx" in out and "torchft" in out:
        print_split(out["phalanx"], out["torchft"])
    return out


def ranks_ms_per_step(r: RunResult) -> float:
    """CPU milliseconds all of a system's ranks spent per step of the job (a torchrun
    world step or a step of both groups: 2 x R rows each): the ranks' share of the
    machine over its failure-free steps/s."""
    cpus = os.cpu_count() or 1
    return 1000.0 * r.cpu.get(RANKS, 0.0) * cpus / r.steps_per_s if r.steps_per_s else 0.0


def print_split(phalanx: dict[str, float], torchft: dict[str, float]) -> None:
    """Phalanx / bare torchft throughput as the product of what its ranks got of the
    machine and how much CPU they spent per step (medians, so the product is near the
    measured ratio, not equal to it)."""
    share = phalanx.get(RANKS, 0.0) / max(torchft.get(RANKS, 0.0), 1e-9)
    cost = torchft["ranks ms per step"] / max(phalanx["ranks ms per step"], 1e-9)
    print(
        f"  phalanx / torchft: the ranks' share of the machine {share:.3f} x their CPU per step"
        f" (torchft's / Phalanx's) {cost:.3f} = {share * cost:.3f}"
    )


def print_soak(doc: dict[str, Any]) -> None:
    rates = ", ".join(f"{v:.2f}" for v in doc["rates"].values())
    print(f"\nsoak: Phalanx alone, {doc['seconds']:g}s without failures; steps/s per group {rates}")
    counts = doc["counts"]
    for what in (
        "step_skipped",
        "train_step with participants < 2",
        "group_failed",
        "group_restarted",
    ):
        print(f"  {what:<36} {counts.get(what, 0)}")
    changes = doc["quorum_changes"]
    print(f"  {'lighthouse quorum changes':<36} {'-' if changes is None else changes}")
    evicted = any(counts.values()) or bool(changes)
    print(f"  healthy group evicted: {'YES' if evicted else 'no sign of it'}")
