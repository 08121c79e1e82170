"""Where a training step's time goes: plain torchrun DDP, bare torchft and Phalanx,
side by side (issues 14 and 52, failure-free overhead).

    python -m bench.step_profile [--warmup 20] [--seconds 40] [--rate 40] [--rows 8]

Runs bench/peers.py's torchrun DDP world, then its two bare torchft groups, then its
two Phalanx daemons on the same model, data and thread settings, without failures
(`--rows`: rows per rank per step, for a shorter or longer step). Once each is warm,
`py-spy` samples every rank's main thread (wall time: waiting counts, `--idle`) for
`--seconds`; each sample is put in the first phase below whose frame it is inside,
and a phase's share of the samples times the measured step time gives its
milliseconds per step. The last two columns are Phalanx minus bare torchft and
Phalanx minus DDP.

Sampling costs CPU, more for a process with more threads (a Phalanx rank runs
torchft's): at 200 samples/s Phalanx made 0.72x torchrun's steps/s while sampled,
at 40/s 1.07x, so keep the rate low and read the table as shares of a step.

Needs py-spy (in the dev extras: `pip install -e .[dev]`) and root or ptrace rights.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.pacing import PACING_LINE
from bench.peer_measures import rate
from bench.peer_phases import POLL_S, wait_quiet, wait_ready
from bench.peer_procs import BIN, scratch
from bench.peer_settings import ROWS_ENV, rows
from bench.peer_systems import BareTorchft, Phalanx, System, Torchrun

# (phase, frame substrings): a sample belongs to the first phase one of whose frames
# holds one of the substrings. Only samples inside the step loop are counted.
LOOPS = {
    "torchrun": "main (bench/peer_ddp.py",
    "torchft": "main (bench/peer_torchft.py",
    "phalanx": "train (trainer/run.py",
}
PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("checkpoint", ("save (bench/peer_ddp.py", "trainer/checkpoint")),
    ("quorum: start", ("start_step (trainer/ft/replication.py", "start_quorum (torchft/")),
    ("quorum: wait", ("quorum (trainer/ft/replication.py", "_quorum_or_drain")),
    ("replica digest", ("_compare_replicas",)),
    ("gradient all-reduce", ("sync_gradients", "allreduce (torchft/", "wait (torchft/")),
    ("loss across groups", ("average_across_groups", "_group_total")),
    ("backward", ("backward (torch/_tensor.py",)),
    ("forward and data", ("trainer/forward_backward.py", "gradients (bench/peer_worker.py")),
    ("clip", ("clip_grad_norm",)),
    ("commit vote", ("should_commit",)),
    ("optimizer", ("torch/optim/",)),
    ("heartbeat file", ("trainer/contracts/heartbeat.py",)),
    (
        "reporting: logs, metrics",
        (
            "__call__ (trainer/run.py",
            "trainer/metrics.py",
            "trainer/logs.py",
            "write (bench/peer_worker.py",
        ),
    ),
]
OTHER = "other step code"


def phase_of(frames: list[str]) -> str:
    for phase, marks in PHASES:
        if any(m in f for f in frames for m in marks):
            return phase
    return OTHER


def read_raw(path: Path, loop: str) -> Counter[str]:
    """Samples per phase from py-spy's raw (collapsed) output: `f1;f2;...;fn count`."""
    out: Counter[str] = Counter()
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        if any(loop in f for f in frames):
            out[phase_of(frames)] += int(count)
    return out


def profile(system: System, loop: str, args: argparse.Namespace) -> tuple[Counter[str], float]:
    """Samples per phase over every rank, and the steps per second while sampling."""
    system.start()
    try:
        system.t0 = wait_ready(system, 180)
        wait_quiet(system, system.t0 + args.warmup, args, system.name)
        pids = sorted({p for i in range(2) for p in system.victim(i)[2]})
        outs = [system.workdir / f"profile-{pid}.txt" for pid in pids]
        record = [args.py_spy, "record", "--duration", str(args.seconds), "--rate", str(args.rate)]
        record += ["--format", "raw", "--idle", "--nonblocking"]
        spy = [
            subprocess.Popen(
                [*record, "--pid", str(pid), "--output", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for pid, out in zip(pids, outs, strict=True)
        ]
        t0 = time.time()
        while any(s.poll() is None for s in spy):
            system.poll()
            time.sleep(POLL_S)
        t1 = time.time()
        for s in spy:
            if s.returncode != 0:
                err = s.stderr.read().decode(errors="replace") if s.stderr else ""
                raise RuntimeError(f"py-spy failed on {system.name}: {err.strip()[-300:]}")
        samples: Counter[str] = Counter()
        for out in outs:
            samples.update(read_raw(out, loop))
        steps_per_s = rate(system.timelines[system.groups[0]], t0, t1)
        if steps_per_s <= 0:
            raise RuntimeError(f"{system.name}: no step committed while sampled")
        return samples, steps_per_s
    finally:
        system.stop()


def per_step_ms(results: dict[str, tuple[Counter[str], float]]) -> dict[str, dict[str, float]]:
    """Milliseconds per step of each phase, per system; "step (measured)" the whole step."""
    ms: dict[str, dict[str, float]] = {}
    for name, (samples, steps_per_s) in results.items():
        total = sum(samples.values()) or 1
        ms[name] = {p: 1000 / steps_per_s * n / total for p, n in samples.items()}
        ms[name][STEP] = 1000 / steps_per_s
    return ms


STEP = "step (measured)"


def table(results: dict[str, tuple[Counter[str], float]]) -> list[str]:
    """Each phase's milliseconds per step, and Phalanx minus each other system."""
    names = list(results)
    others = [n for n in names if n != "phalanx"] if "phalanx" in names else []
    ms = per_step_ms(results)
    head = "".join(f"{n + ' ms':>14}" for n in names)
    lines = [f"{'phase':28}" + head + "".join(f"{'-' + o:>12}" for o in others)]
    for phase in [p for p, _ in PHASES] + [OTHER, STEP]:
        row = [ms[n].get(phase, 0.0) for n in names]
        if not any(row):
            continue
        diffs = [ms["phalanx"].get(phase, 0.0) - ms[o].get(phase, 0.0) for o in others]
        lines.append(
            f"{phase:28}"
            + "".join(f"{v:14.1f}" for v in row)
            + "".join(f"{d:+12.1f}" for d in diffs)
        )
    rates = {n: results[n][1] for n in names}
    lines.append("steps/s: " + ", ".join(f"{n} {r:.2f}" for n, r in rates.items()))
    for o in others:
        lines.append(f"ratio phalanx/{o} steps/s while sampled: {rates['phalanx'] / rates[o]:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before sampling")
    parser.add_argument("--seconds", type=int, default=40, help="seconds sampled")
    parser.add_argument("--rate", type=int, default=40, help="samples per second per rank")
    parser.add_argument(
        "--quiet-timeout",
        type=float,
        default=180.0,
        help="most seconds to wait after --warmup for standbys to be ready (Phalanx)",
    )
    parser.add_argument("--rows", type=int, help=f"rows per rank per step (default {rows()})")
    parser.add_argument("--systems", default=",".join(LOOPS), help="a subset of " + ",".join(LOOPS))
    parser.add_argument("--json", type=Path, help="also write the milliseconds per step here")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    if not names or any(n not in LOOPS for n in names):
        parser.error(f"--systems takes a comma-separated subset of {','.join(LOOPS)}")
    if args.rows is not None:
        if args.rows < 1:
            parser.error("--rows must be at least 1")
        os.environ[ROWS_ENV] = str(args.rows)  # every system's workers read it
    args.py_spy = shutil.which("py-spy") or str(BIN / "py-spy")
    if not Path(args.py_spy).exists():
        print(
            "py-spy is not installed: pip install -e .[dev] (it is in the dev extras).",
            file=sys.stderr,
        )
        return 2
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"{args.seconds} s sampled at {args.rate}/s per rank after {args.warmup:.0f} s; "
          f"{rows()} rows per rank per step")  # fmt: skip
    print(PACING_LINE)
    with scratch("phalanx-profile-", args.keep) as tmp:
        systems: dict[str, System] = {
            "torchrun": Torchrun(tmp / "torchrun", save_every=20),
            "torchft": BareTorchft(tmp / "torchft"),
            "phalanx": Phalanx(tmp / "phalanx", None),
        }
        results = {n: profile(systems[n], LOOPS[n], args) for n in names}
        print("\n".join(table(results)))
    if args.json:
        figures = {"rows": rows(), "rate": args.rate, "seconds": args.seconds}
        figures |= {"ms_per_step": per_step_ms(results), "machine": platform.machine()}
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
