"""`make gpu-check`: what a lent GPU must show, in one command that prints a table and,
on CUDA, appends it to docs/benchmarks.md.

On CUDA:
* the built-in Llama at 937M parameters, one rank: tokens/s and MFU in bf16, with
  compile, and with FP8 (`parallel.fp8`, its ratio to bf16); torchtitan's own trainer at
  the same shape beside it (bench/gpu_titan.py);
* the asynchronous checkpoint's stall on the GPU (blocked time / a synchronous save's,
  bench/checkpoint_stall.py);
* two replica groups of one rank on the GPU (gloo across groups), one rank SIGKILLed
  and started again: its heal and the survivor's longest pause (bench/gpu_heal.py), cold
  and through two daemons with a standby that warmed the GPU (bench/gpu_heal_warm.py);
* `phalanx demo` on the GPU: the same through the daemons (the device in the spec, the
  demo job's `ft.backend = "gloo"`); its summary gives the heal.

Without CUDA it says so in one line, skips those rows, checks what runs on a CPU (FP8
refused with exit 2, the FP8 conversion of the 937M model on the meta device, a short
run of the trainer, torchtitan's trainer at a tiny shape) and exits 0 when those pass.
`--no-write` leaves the docs alone.

    .venv/bin/python -m bench.gpu_check [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_machine import machine

ROOT = Path(__file__).resolve().parent.parent
SINGLE = ROOT / "examples" / "single.toml"
DOCS = ROOT / "docs" / "benchmarks.md"
BIG = {  # the 937M model of docs/benchmarks.md's first GPU runs
    "model.vocab_size": "32000",
    "model.dim": "2048",
    "model.n_layers": "16",
    "model.n_heads": "16",
    "model.max_seq_len": "2048",
    "train.seq_len": "2048",
    "train.batch_size": "8",
    "train.steps": "40",
    "train.log_every": "1",
    "parallel.device": "cuda",
}
# Dense bf16 peaks (FLOP/s) by a word of the device's name; MFU is n/a for others.
PEAKS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362.05e12}
SKIP_STEPS = 10  # the first steps (allocation, compile) are left out of tokens/s
BF16 = {"parallel.param_dtype": "bfloat16"}
COMPILED = {**BF16, "parallel.compile": "true"}


RESULTS = ROOT / "bench" / "results"
# --rows picks from these
CHECKS = ("cpu", "speed", "titan", "stall", "heal", "standby", "demo")


@dataclass
class Row:
    what: str
    result: str
    ok: bool = True
    data: dict[str, Any] = field(default_factory=dict)  # the row's figures, for the JSON


def trainer(sets: dict[str, str], timeout: float) -> tuple[int, list[dict[str, Any]], str]:
    """One `python -m trainer` run of examples/single.toml with `sets`: its exit code, its
    events and the tail of its stderr."""
    argv = [sys.executable, "-m", "trainer", "--config", str(SINGLE)]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return -1, [], f"timed out after {timeout:.0f}s"
    events = []
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return proc.returncode, events, proc.stderr[-800:]


def tokens_per_s(events: list[dict[str, Any]]) -> float | None:
    rates = [
        float(e["tokens_per_s"])
        for e in events
        if e.get("event") == "train_step" and int(e.get("step", 0)) > SKIP_STEPS
    ]
    return statistics.median(rates) if rates else None


def flops_per_token(events: list[dict[str, Any]]) -> float | None:
    """6 N + 12 L d T, with N from the rank's own count of its parameters."""
    started = [e for e in events if e.get("event") == "rank_started"]
    if not started:
        return None
    n, layers, dim, seq = (
        float(started[0]["params"]),
        int(BIG["model.n_layers"]),
        int(BIG["model.dim"]),
        int(BIG["train.seq_len"]),
    )
    return 6 * n + 12 * layers * dim * seq


def peak_bytes(events: list[dict[str, Any]]) -> int | None:
    done = [e for e in events if e.get("event") == "train_done"]
    return done[-1].get("device_peak_bytes") if done else None


def peak(name: str) -> float | None:
    return next((p for word, p in PEAKS.items() if word in name), None)


def speed_rows(name: str) -> list[Row]:
    """bf16, bf16 + compile, and FP8 with compile in both recipes: tokens/s and MFU; each
    FP8 run's ratio to bf16 + compile. (FP8 without compile ran at 0.48x of eager bf16 on
    an H100 on 2026-11-27: its casts run as separate eager kernels.)"""
    compiled = COMPILED
    runs = {
        "bf16": BF16,
        "bf16 + compile": compiled,
        "fp8 tensorwise + compile": {**compiled, "parallel.fp8": "true"},
        "fp8 rowwise + compile": {
            **compiled,
            "parallel.fp8": "true",
            "parallel.fp8_recipe": '"rowwise"',
        },
    }
    rows, rates = [], {}
    for label, extra in runs.items():
        code, events, tail = trainer({**BIG, **extra}, timeout=600)
        rate, per_token, top = tokens_per_s(events), flops_per_token(events), peak(name)
        if code != 0 or rate is None:
            rows.append(
                Row(f"937M {label}: tokens/s", f"failed (exit {code}): {tail[-300:]}", False)
            )
            continue
        rates[label] = rate
        mfu = rate * per_token / top if per_token and top else None
        said = f", MFU {mfu:.3f}" if mfu is not None else ", MFU n/a"
        data = {"tokens_per_s": rate, "mfu": mfu, "sets": extra}
        data["peak_bytes"] = peak_bytes(events)  # train_done's device_peak_bytes
        rows.append(Row(f"937M {label}: tokens/s", f"{rate:,.0f}{said}", data=data))
    for label in ("fp8 tensorwise + compile", "fp8 rowwise + compile"):
        if "bf16 + compile" in rates and label in rates:
            ratio = rates[label] / rates["bf16 + compile"]
            rows.append(Row(f"{label} / bf16 + compile", f"{ratio:.2f}", data={"ratio": ratio}))
    return rows


def stall_row() -> Row:
    """bench/checkpoint_stall.py's blocked-time ratio, on this machine's GPU. Its model
    likely steps far faster on an H100 than a save takes: unpaced, its asynchronous run timed no
    save (the H100 run of 2026-11-27; a save that falls due while the one before is still
    being written is skipped), so both modes sleep 0.5 s a step and save every 6 steps."""
    argv = [sys.executable, "-m", "bench.checkpoint_stall"]
    argv += ["--step-delay", "0.5", "--interval", "6", "--steps", "31"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    ratio = [line for line in proc.stdout.splitlines() if line.startswith("ratio")]
    if proc.returncode != 0 or not ratio:
        return Row("async checkpoint stall", f"failed: {proc.stderr[-300:]}", False)
    said = ratio[0].removeprefix("ratio ")
    return Row("async checkpoint stall (blocked async / sync)", said, data={"stdout": proc.stdout})


def heal_row() -> Row:
    from bench.gpu_heal import measure

    line, ok = measure("cuda")
    what = "two groups of one rank on the GPU, a rank SIGKILLed and relaunched"
    return Row(what, line, ok, data={"line": line})


def standby_row() -> Row:
    """The same kill through two daemons: node-b's warm standby takes the rank's place."""
    from bench.gpu_heal_warm import measure_warm

    line, ok, figures = measure_warm("cuda")
    return Row("the same kill through two daemons, healed by a warm standby", line, ok, figures)


def demo_row() -> Row:
    """`phalanx demo` with the device left to `auto`: both groups on the one GPU."""
    argv = [str(Path(sys.executable).parent / "phalanx"), "demo"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    summary = [line.strip() for line in proc.stdout.splitlines() if "heal" in line.lower()]
    result = "; ".join(summary[-3:]) or proc.stdout[-300:]
    return Row(
        "phalanx demo on the GPU (two groups, a rank SIGKILLed)",
        result,
        proc.returncode == 0,
        data={"exit": proc.returncode, "stdout_tail": proc.stdout[-3000:]},
    )


def cpu_rows() -> list[Row]:
    """What this command checks anywhere: FP8 refused on a CPU node, the FP8 conversion of
    the 937M model on the meta device, and a short trainer run."""
    phalanx = str(Path(sys.executable).parent / "phalanx")
    argv = [phalanx, "run", "--config", str(SINGLE), "--set", "parallel.fp8=true"]
    argv += ["--set", "node.device=cpu"]
    refused = subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    said = refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""
    rows = [
        Row(
            "parallel.fp8 on a CPU node",
            f"exit {refused.returncode}: {said}",
            refused.returncode == 2 and "parallel.fp8" in said,
        )
    ]
    from torch import nn

    from trainer import workloads
    from trainer.config import TrainerConfig, validate
    from trainer.parallel.fp8 import apply_fp8

    model_sets: dict[str, Any] = {
        k.removeprefix("model."): int(v) for k, v in BIG.items() if k.startswith("model.")
    }
    cfg = validate(TrainerConfig, {"model": model_sets, "parallel": {"fp8": True}}, "gpu-check")
    model = workloads.build_meta(workloads.load(cfg), "the built-in model")
    converted = apply_fp8(model, cfg.parallel, sharded=True)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    rows.append(
        Row(
            "fp8 conversion of the 937M model (meta device)",
            f"{len(converted)} of {linears} Linear layers in float8, output layer kept",
            bool(converted) and "output" not in converted,
        )
    )
    code, events, tail = trainer({"train.steps": "30", "parallel.device": "cpu"}, timeout=300)
    rate = tokens_per_s(events)
    rows.append(
        Row(
            "examples/single.toml on the CPU, 30 steps",
            f"{rate:,.0f} tokens/s" if code == 0 and rate else f"failed (exit {code}): {tail}",
            code == 0 and rate is not None,
        )
    )
    from bench.gpu_titan import cpu_row

    rows.append(cpu_row())
    return rows


def guarded(label: str, check: Callable[[], list[Row]]) -> list[Row]:
    """A check's rows, or one failed row naming what it raised: one check's failure (a
    timed-out wait, say) must not cost the table the others' figures."""
    try:
        return check()
    except Exception as exc:
        return [Row(label, f"{type(exc).__name__}: {exc}", False)]


def table(rows: list[Row]) -> str:
    lines = ["| check | result |", "|---|---|"]
    lines += [f"| {r.what} | {r.result if r.ok else 'FAILED: ' + r.result} |" for r in rows]
    return "\n".join(lines)


def write(meta: dict[str, Any], rows: list[Row], results: Path) -> None:
    """The table under a heading naming the card, the day, the commit and the JSON."""
    day, sha = str(meta["date"])[:10], str(meta["commit"])[:7]
    section = f"\n## `make gpu-check` on {meta['card']} ({day}, commit {sha})\n\n"
    source = f"Raw results: `{results.relative_to(ROOT)}`.\n\n"
    DOCS.write_text(DOCS.read_text() + section + source + table(rows) + "\n")


def write_json(meta: dict[str, Any], rows: list[Row], seconds: dict[str, float]) -> Path:
    """The raw results beside the table: bench/results/gpu-check-<date>-<commit>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"gpu-check-{meta['date'][:10]}-{str(meta['commit'])[:7]}"
    path = RESULTS / f"{stem}.json"
    body = {"machine": meta, "seconds": seconds, "rows": [asdict(r) for r in rows]}
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def cuda_device() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-write", action="store_true", help="leave docs/benchmarks.md and bench/results alone"
    )
    parser.add_argument(
        "--rows",
        default=",".join(CHECKS),
        help=f"which checks to run, comma-separated from {', '.join(CHECKS)} (default: all)",
    )
    args = parser.parse_args(argv)
    picked = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(picked) - set(CHECKS))
    if unknown or not picked:
        print(
            f"error: --rows takes names from {', '.join(CHECKS)}; got {args.rows!r}.",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    name = cuda_device()
    seconds: dict[str, float] = {}
    rows: list[Row] = []
    if "cpu" in picked:
        began = time.monotonic()
        rows += guarded("cpu", cpu_rows)
        seconds["cpu"] = round(time.monotonic() - began, 1)
    if name is None:
        print(
            "no CUDA device here: skipping the GPU rows (937M tokens/s and MFU in bf16, with "
            "compile and with fp8, and torchtitan's beside it; the async checkpoint stall; two "
            "groups healing on the GPU, cold and from a warm standby; "
            "the demo on the GPU); "
            "checking the CPU-runnable parts"
        )
    else:
        print(f"CUDA device: {name}")
        from bench.gpu_titan import titan_rows

        checks: dict[str, Callable[[], list[Row]]] = {
            "speed": lambda: speed_rows(name),
            "titan": lambda: titan_rows(rows),  # bench/gpu_titan.py
            "stall": lambda: [stall_row()],
            "heal": lambda: [heal_row()],
            "standby": lambda: [standby_row()],
            "demo": lambda: [demo_row()],
        }
        for label, check in checks.items():
            if label not in picked:
                continue
            began = time.monotonic()
            done = guarded(label, check)
            seconds[label] = round(time.monotonic() - began, 1)
            print(
                table(done), f"\n({label}: {seconds[label]:.0f} s)", flush=True
            )  # a later one may hang
            rows += done
    print(table(rows))
    if name is not None and not args.no_write:
        meta = machine(name)
        results = write_json(meta, rows, seconds)
        write(meta, rows, results)
        print(f"appended to {DOCS.relative_to(ROOT)}; raw results: {results.relative_to(ROOT)}")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
