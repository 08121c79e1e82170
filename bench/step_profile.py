"""Where a training step's time goes: plain torchrun DDP against Phalanx, side by side
(issue 14, failure-free overhead).

    python -m bench.step_profile [--warmup 20] [--seconds 40] [--rate 40]

Runs bench/peers.py's torchrun DDP world and then its two Phalanx daemons on the same
model, data and thread settings, without failures. Once each is warm, `py-spy`
samples every rank's main thread (wall time: waiting counts, `--idle`) for
`--seconds`; each sample is put in the first phase below whose frame it is inside,
and a phase's share of the samples times the measured step time gives its
milliseconds per step. The last column is Phalanx minus DDP.

Sampling costs CPU, more for a process with more threads (a Phalanx rank runs
torchft's): at 200 samples/s Phalanx made 0.72x torchrun's steps/s while sampled,
at 40/s 1.07x, so keep the rate low and read the table as shares of a step.

Needs py-spy (in the dev extras: `pip install -e .[dev]`) and root or ptrace rights.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.peer_measures import rate
from bench.peer_procs import BIN, scratch
from bench.peer_systems import Phalanx, System, Torchrun

POLL_S = 0.2

# (phase, frame substrings): a sample belongs to the first phase one of whose frames
# holds one of the substrings. Only samples inside the step loop are counted.
LOOPS = {"phalanx": "train (trainer/run.py", "torchrun": "main (bench/peer_ddp.py"}
PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("checkpoint", ("save (bench/peer_ddp.py", "trainer/checkpoint")),
    ("quorum: start", ("start_step (trainer/ft/replication.py",)),
    ("quorum: wait", ("quorum (trainer/ft/replication.py", "_quorum_or_drain")),
    ("replica digest", ("_compare_replicas",)),
    ("gradient all-reduce", ("sync_gradients",)),
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
        started = time.time()
        while not system.ready():
            if time.time() - started > 180:
                raise RuntimeError(f"{system.name}: no commit within 180 s")
            system.poll()
            time.sleep(POLL_S)
        end = time.time() + args.warmup
        while time.time() < end:
            system.poll()
            time.sleep(POLL_S)
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


def table(results: dict[str, tuple[Counter[str], float]]) -> list[str]:
    names = list(results)
    ms: dict[str, dict[str, float]] = {}
    for name, (samples, steps_per_s) in results.items():
        total = sum(samples.values()) or 1
        ms[name] = {p: 1000 / steps_per_s * n / total for p, n in samples.items()}
    lines = [f"{'phase':28}" + "".join(f"{n + ' ms':>14}" for n in names) + f"{'difference':>12}"]
    order = [p for p, _ in PHASES] + [OTHER]
    for phase in order:
        row = [ms[n].get(phase, 0.0) for n in names]
        if not any(row):
            continue
        diff = row[-1] - row[0] if len(row) > 1 else 0.0
        lines.append(f"{phase:28}" + "".join(f"{v:14.1f}" for v in row) + f"{diff:+12.1f}")
    steps = [1000 / results[n][1] for n in names]
    lines.append(
        f"{'step (measured)':28}"
        + "".join(f"{v:14.1f}" for v in steps)
        + f"{steps[-1] - steps[0]:+12.1f}"
    )
    rates = [results[n][1] for n in names]
    lines.append("steps/s: " + ", ".join(f"{n} {r:.2f}" for n, r in zip(names, rates, strict=True)))
    if len(rates) == 2:
        lines.append(f"ratio phalanx/torchrun steps/s while sampled: {rates[1] / rates[0]:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before sampling")
    parser.add_argument("--seconds", type=int, default=40, help="seconds sampled")
    parser.add_argument("--rate", type=int, default=40, help="samples per second per rank")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args(argv)
    args.py_spy = shutil.which("py-spy") or str(BIN / "py-spy")
    if not Path(args.py_spy).exists():
        print(
            "py-spy is not installed: pip install -e .[dev] (it is in the dev extras).",
            file=sys.stderr,
        )
        return 2
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"{args.seconds} s sampled at {args.rate}/s per rank after {args.warmup:.0f} s")  # fmt: skip
    with scratch("phalanx-profile-", args.keep) as tmp:
        results = {
            "torchrun": profile(Torchrun(tmp / "torchrun", save_every=20), LOOPS["torchrun"], args),
            "phalanx": profile(Phalanx(tmp / "phalanx", None), LOOPS["phalanx"], args),
        }
        print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
