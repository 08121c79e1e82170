"""What issue 54 adds to the step loop: a baseline revision's step log against the working
tree's, side by side in one invocation (A B A B), each in its own process.

Per step, the loop now times the quorum wait (two clock reads in torchft's group, which
``clock`` below prices) and its step log carries the step's seconds and, when not zero,
the quorum wait and the save and evaluation before it: one small dict and a few more
JSON fields on a line it wrote anyway. Everything else the goodput accounting does
runs in the daemon. Each side logs `--steps` committed steps (train.log_every 10, so
one in ten is a full ``train_step``) as a rank does, JSON to /dev/null, and reports
microseconds per step (the median and the fastest of the rounds: the machine's noise
is larger than what is measured, so read the fastest too); the ratio is new over
baseline.

    python -m bench.step_log_cost [--baseline REV] [--steps 20000] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "cc98533"  # main before issue 54

# Run inside each side's process: its trainer package is first on sys.path.
PROBE = """
import json, os, sys, time
from trainer import logs
from trainer.step_log import StepLogger
from trainer.step_report import StepReport
logs.configure(json_output=True, stream=open(os.devnull, "w"))
fields = set(StepReport.__dataclass_fields__)
log = StepLogger(10)
extra = {"quorum_s": 0.0004} if "quorum_s" in fields else {}
steps = int(sys.argv[1])
reports = [
    StepReport(step=n, committed=True, loss=1.0, lr=0.1, grad_norm=1.0, participants=2,
               quorum_id=1, seconds=0.25, tokens=64, items=range(8 * n, 8 * n + 8), **extra)
    for n in range(1, steps + 1)
]
began = time.perf_counter()
for r in reports:
    log(r)
import trainer
took = 1e6 * (time.perf_counter() - began) / steps
print(json.dumps({"us_per_step": took, "trainer": trainer.__file__}))
"""


def side(tree: Path, steps: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(steps)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert str(said["trainer"]).startswith(str(tree)), f"{tree}: imported {said['trainer']}"
    return float(said["us_per_step"])


def clock_ns(reads: int = 1_000_000) -> float:
    """What one time.monotonic() costs here, in ns (torchft's group adds two a step)."""
    began = time.perf_counter()
    for _ in range(reads):
        time.monotonic()
    return 1e9 * (time.perf_counter() - began) / reads


def baseline_tree(rev: str, into: Path) -> Path:
    archive = into / "base.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", rev, "trainer"], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "base", filter="data")
    return into / "base"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the baseline")
    p.add_argument("--steps", type=int, default=50_000, help="steps logged per run")
    p.add_argument("--rounds", type=int, default=7, help="A B rounds")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        base = baseline_tree(args.baseline, Path(scratch))
        runs: dict[str, list[float]] = {"baseline": [], "new": []}
        for _ in range(args.rounds):
            runs["baseline"].append(side(base, args.steps))
            runs["new"].append(side(ROOT, args.steps))
    medians = {k: statistics.median(v) for k, v in runs.items()}
    fastest = {k: min(v) for k, v in runs.items()}
    clock = clock_ns()
    added = medians["new"] - medians["baseline"] + 2 * clock / 1000
    head = git("rev-parse", "--short", "HEAD")
    print(f"step log, us per step (median of {args.rounds}; baseline {args.baseline}, new {head})")
    for name, of in (("median", medians), ("fastest", fastest)):
        print(
            f"  {name}: baseline {of['baseline']:.2f}  new {of['new']:.2f}  "
            f"new/baseline {of['new'] / of['baseline']:.3f}"
        )
    print(f"  time.monotonic(): {clock:.0f} ns; the loop's added work per step: {added:.2f} us")
    if args.json:
        doc = {
            "baseline": args.baseline,
            "commit": head,
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "steps": args.steps,
            "runs_us_per_step": runs,
            "median_us_per_step": medians,
            "fastest_us_per_step": fastest,
            "monotonic_ns": clock,
            "added_us_per_step": added,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
