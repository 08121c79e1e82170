"""How long does a checkpoint stop training? Asynchronous vs synchronous DCP saves.

Runs the real trainer twice on the same model (at least 50M parameters), data
and save interval: once with ``checkpoint.async = true`` and once with ``false``.
Each save reports ``seconds_blocked`` (training could not proceed: the
synchronous save itself, or for an async save the launch plus any wait for its
background copy before the next parameter update) and ``seconds_total`` (until
the completion marker). Prints both, and the ratio async/sync of the blocked
time, whose target is at most 0.10.

    .venv/bin/python bench/checkpoint_stall.py [--layers 8 --dim 512 --vocab 32000] [--step-delay S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def params(vocab: int, dim: int, layers: int, hidden: int) -> int:
    per_block = 4 * dim * dim + 3 * dim * hidden + 2 * dim
    return 2 * vocab * dim + layers * per_block + dim


def run(mode: str, args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    overrides = {
        "model.vocab_size": args.vocab,
        "model.dim": args.dim,
        "model.n_layers": args.layers,
        "model.n_heads": 8,
        "model.max_seq_len": args.seq,
        "train.seq_len": args.seq,
        "train.batch_size": args.batch,
        "train.steps": args.steps,
        "train.warmup_steps": 1,
        "checkpoint.dir": json.dumps(str(workdir / mode)),
        "checkpoint.interval_steps": args.interval,
        "checkpoint.keep": 1,
        "checkpoint.async": "true" if mode == "async" else "false",
    }
    argv = [sys.executable, "-m", "trainer", "--config", str(ROOT / "examples" / "single.toml")]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())}
    if args.step_delay:  # both modes alike: steps long enough for a save to end in between
        env["PHALANX_CHAOS_DELAY"] = str(args.step_delay)
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed:\n{proc.stderr[-2000:]}")
    lines = (proc.stdout + proc.stderr).splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    saves = [e for e in events if e["event"] == "checkpoint_saved"]
    if len(saves) < 2:
        counts = {
            name: sum(e["event"] == f"checkpoint_{name}" for e in events)
            for name in ("saved", "skipped", "failed", "exists")
        }
        failed = [e.get("error", "") for e in events if e["event"] == "checkpoint_failed"]
        sys.exit(
            f"the {mode} run timed no save ({counts}; a skipped save fell due while the "
            "previous one was still being written: steps shorter than a save, so give the "
            "saves more time with --step-delay or --interval)"
            + (f"; the first failure: {failed[0]}" if failed else "")
        )
    # The last save is the final one at the end of training, which nothing overlaps.
    return [
        {"blocked": e["seconds_blocked"], "total": e["seconds_total"], "bytes": e["bytes"]}
        for e in saves[:-1]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--interval", type=int, default=3)
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="seconds slept at each step's start in both modes (PHALANX_CHAOS_DELAY), so "
        "that a save ends before the next falls due where steps are shorter than a save",
    )
    args = parser.parse_args()
    hidden = 32 * ((int(8 * args.dim / 3) + 31) // 32)
    n = params(args.vocab, args.dim, args.layers, hidden)
    if n < 50_000_000:
        sys.exit(f"the model has {n / 1e6:.1f}M parameters; the benchmark needs at least 50M")
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-") as tmp:
        results = {}
        for mode in ("async", "sync"):  # each said as it ends: a time limit may cut the next
            began = time.monotonic()
            results[mode] = run(mode, args, Path(tmp))
            said = ", ".join(f"{s['blocked']:.3f}" for s in results[mode])
            took = time.monotonic() - began
            print(f"{mode}: run took {took:.0f} s; blocked s per timed save: {said}", flush=True)
    cpus = os.cpu_count()
    print(
        f"machine: {platform.node()} {platform.machine()}, {cpus} CPUs, Python {platform.python_version()}"
    )
    size_mb = results["sync"][0]["bytes"] / 1e6
    print(
        f"model: {n / 1e6:.1f}M parameters, checkpoint {size_mb:.0f} MB, {len(results['sync'])} timed saves per mode"
    )
    print(f"{'mode':<6} {'blocked median s':>17} {'blocked max s':>14} {'total median s':>15}")
    medians = {}
    for mode, saves in results.items():
        blocked = [s["blocked"] for s in saves]
        total = [s["total"] for s in saves]
        medians[mode] = statistics.median(blocked)
        print(
            f"{mode:<6} {medians[mode]:>17.4f} {max(blocked):>14.4f} {statistics.median(total):>15.4f}"
        )
    ratio = medians["async"] / medians["sync"]
    verdict = "met" if ratio <= 0.10 else "NOT met"
    print(f"ratio async/sync blocked: {ratio:.3f} (target <= 0.10: {verdict})")


if __name__ == "__main__":
    main()
