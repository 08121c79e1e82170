"""How much longer `make test` takes at one commit than at another, measured side by side.

Each side is a clone of this repository at its commit with its own .venv (made by
`make venv`, so each side runs exactly what a fresh checkout runs). The suites run
one after the other, alternating (base, head, base, head, ...), so a slow spell
of a shared machine falls on both; the ratio of the medians is printed.

``--exclude PREFIX`` (a test path prefix such as ``tests/integration/test_x`` or
``tests/integration/test_x.py::test_y``, repeatable) also prints the ratio with
the tests under PREFIX left out of both sides, for tests another change added
(for example the multi-host tests of issue 11 when measuring issue 10).
``--only PATH`` (repeatable) runs just those test files or tests on both sides, to
measure a change to a few tests in a fraction of the time.

    python -m bench.suite_time --base 0ca34ee --exclude tests/integration/test_multihost

Takes as long as 2 x --repeats suites (about 10 to 15 minutes each on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    side: str
    wall_s: float
    pytest_s: float  # sum of the test cases' times (setup + call + teardown)
    kept_s: float  # the same without the excluded tests
    passed: int
    failed: int
    skipped: int


def checkout(rev: str, where: Path) -> Path:
    """A clone of this repository at `rev` with its .venv, made once and reused."""
    sha = git("rev-parse", rev)
    if not (where / ".git").exists():
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(where)], check=True)
    if git("rev-parse", "HEAD", cwd=where) != sha:
        subprocess.run(["git", "-C", str(where), "fetch", "--quiet", str(ROOT), sha], check=True)
        subprocess.run(["git", "-C", str(where), "checkout", "--quiet", sha], check=True)
    subprocess.run(["make", "-C", str(where), "--quiet", "venv"], check=True)
    return where


def git(*args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def run_suite(
    side: str, where: Path, report: Path, exclude: list[str], only: tuple[str, ...] = ()
) -> Run:
    # The alone run writes a report of its own (the Makefile's ALONE_ARGS; a later
    # --junitxml wins): one report for both would keep only the alone run's tests. A side
    # whose Makefile predates ALONE_ARGS has only that one (its tests' sum is then wrong).
    args = " ".join([f"PYTEST_ARGS=-q --junitxml={report}", *only])
    alone = report.with_suffix(".alone.xml")
    started = time.monotonic()
    subprocess.run(
        ["make", "-C", str(where), "--quiet", "test", args, f"ALONE_ARGS=--junitxml={alone}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,  # a failure is counted below; its time still is the suite's time
    )
    wall = time.monotonic() - started
    prefixes = [p.replace(".py", "").replace("::", ".").replace("/", ".") for p in exclude]
    total = kept = 0.0
    passed = failed = skipped = 0
    cases = [
        c for r in (report, alone) if r.exists() for c in ET.parse(r).getroot().iter("testcase")
    ]
    for case in cases:
        seconds = float(case.get("time", "0"))
        total += seconds
        test_id = f"{case.get('classname', '')}.{case.get('name', '')}"
        if not any(test_id.startswith(p) for p in prefixes):
            kept += seconds
        outcome = {child.tag for child in case}
        if outcome & {"failure", "error"}:
            failed += 1
        elif "skipped" in outcome:
            skipped += 1
        else:
            passed += 1
    return Run(side, wall, total, kept, passed, failed, skipped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="0ca34ee", help="the commit to compare with")
    parser.add_argument("--head", default="HEAD", help="the commit measured")
    parser.add_argument("--repeats", type=int, default=2, help="suites per side")
    parser.add_argument("--exclude", action="append", default=[], metavar="PREFIX")
    parser.add_argument("--only", action="append", default=[], metavar="PATH")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/phalanx-suite-time"))
    parser.add_argument("--json", type=Path, help="also write the runs and ratios here")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    sides = {
        "base": checkout(args.base, args.workdir / "base"),
        "head": checkout(args.head, args.workdir / "head"),
    }
    runs: list[Run] = []
    for i in range(args.repeats):
        for side, where in sides.items():
            report = args.workdir / f"{side}-{i}.xml"
            run = run_suite(side, where, report, args.exclude, tuple(args.only))
            runs.append(run)
            print(
                f"{side} run {i + 1}: wall {run.wall_s:.1f} s, tests {run.pytest_s:.1f} s, "
                f"without excluded {run.kept_s:.1f} s "
                f"({run.passed} passed, {run.failed} failed, {run.skipped} skipped)",
                flush=True,
            )
    base, head = git("rev-parse", "--short", args.base), git("rev-parse", "--short", args.head)
    print(f"base {base}, head {head}")
    ratios: dict[str, float] = {}
    for label, field in (("wall", "wall_s"), ("tests", "pytest_s"), ("without excluded", "kept_s")):
        med = {
            side: statistics.median(getattr(r, field) for r in runs if r.side == side)
            for side in sides
        }
        spread = {
            side: [round(getattr(r, field), 1) for r in runs if r.side == side] for side in sides
        }
        if not med["base"]:
            print(f"{label:>17}: no figure on the base side (its report held no test)")
            continue
        ratios[label] = round(med["head"] / med["base"], 4)
        print(
            f"{label:>17}: head/base = {med['head'] / med['base']:.3f} "
            f"(median {med['head']:.1f} s / {med['base']:.1f} s; runs head {spread['head']}, "
            f"base {spread['base']})"
        )
    if args.json is not None:
        measured = {"base": base, "head": head, "only": args.only, "exclude": args.exclude}
        runs_out = [dataclasses.asdict(r) for r in runs]
        args.json.write_text(json.dumps({**measured, "runs": runs_out, "ratios": ratios}, indent=1))
    return 1 if any(r.failed for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
