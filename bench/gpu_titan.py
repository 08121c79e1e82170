"""`make gpu-check`'s ``titan`` row: torchtitan's own trainer beside Phalanx's (issue 53).

Both train the 937M shape (bench/gpu_check.py's BIG) on one rank, bf16, compiled:
Phalanx's built-in Llama through ``python -m trainer``, torchtitan's Llama 3 through its
``Trainer`` (bench/titan_side.py, its default FlexAttention, synthetic tokens). The row
gives each one's tokens/s (the median step after the first 10) and peak GPU memory, and
Phalanx over torchtitan for both. Phalanx's figures come from the ``speed`` row of the
same invocation when it ran, so the card spends its minutes once.

On a CPU, :func:`cpu_row` runs torchtitan's path at a tiny shape (SDPA attention:
FlexAttention has no backward there), so a missing package or a changed torchtitan API
shows up before a GPU's minutes are spent on it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.titan_side import TITAN_VERSION

ROOT = Path(__file__).resolve().parent.parent
OURS = "937M bf16 + compile: tokens/s"  # bench/gpu_check.py's speed row it reuses
INSTALL = (
    f"pip install --no-deps -r bench/titan-requirements.txt (torchtitan {TITAN_VERSION} "
    "and what its trainer imports)"
)

# (what, result, ok, data): the fields of bench/gpu_check.py's Row.
Figures = tuple[str, str, bool, dict[str, Any]]
TrainerRun = Callable[[], tuple[float | None, int | None, str]]


def run_titan(shape: str, steps: int, compile: bool, timeout: float) -> tuple[dict[str, Any], str]:
    """bench/titan_side.py in a process of its own: its result ({} when it failed) and
    the tail of its output."""
    with tempfile.TemporaryDirectory(prefix="phalanx-titan-") as tmp:
        out = Path(tmp) / "titan.json"
        argv = [sys.executable, "-m", "bench.titan_side", "--shape", shape]
        argv += ["--steps", str(steps), "--json", str(out), "--dump", tmp]
        argv += ["--compile"] if compile else []
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return {}, f"timed out after {timeout:.0f}s"
        tail = (proc.stdout + proc.stderr)[-600:]
        if proc.returncode != 0 or not out.is_file():
            if "No module named 'torchtitan" in proc.stderr:
                tail = f"torchtitan is not installed here: {INSTALL}"
            return {}, f"exit {proc.returncode}: {tail}"
        return dict(json.loads(out.read_text())), tail


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f} GiB"


def titan_figures(
    ours: tuple[float | None, int | None, str], titan: dict[str, Any], why: str
) -> list[Figures]:
    """The rows from both runs: ours is (tokens/s, peak bytes, why it failed)."""
    rate, peak, failed = ours
    rows: list[Figures] = []
    if not titan:
        rows.append((f"torchtitan {TITAN_VERSION} 937M bf16 + compile", why, False, {}))
    else:
        said = f"{titan['tokens_per_s']:,.0f} tokens/s, peak {_gib(titan.get('peak_bytes'))}"
        rows.append(
            (f"torchtitan {titan['torchtitan']} 937M bf16 + compile", said, True, {"run": titan})
        )
    if rate is None:
        rows.append(("Phalanx 937M bf16 + compile (for torchtitan's ratio)", failed, False, {}))
    if titan and rate is not None:
        speed = rate / float(titan["tokens_per_s"])
        memory = peak / int(titan["peak_bytes"]) if peak and titan.get("peak_bytes") else None
        said = f"tokens/s {speed:.3f}, peak memory " + (
            "n/a" if memory is None else f"{memory:.3f}"
        )
        data = {"tokens_per_s": speed, "peak_memory": memory, "phalanx_peak_bytes": peak}
        rows.append(("Phalanx / torchtitan, 937M bf16 + compile", said, True, data))
    return rows


def gpu_figures(speed_done: dict[str, Any] | None, run_ours: TrainerRun) -> list[Figures]:
    """The titan row on CUDA. `speed_done`: the data of gpu_check's speed row for
    bf16 + compile, when it ran in this invocation; else `run_ours` runs Phalanx."""
    ours: tuple[float | None, int | None, str]
    if speed_done is not None and speed_done.get("tokens_per_s"):
        ours = (float(speed_done["tokens_per_s"]), speed_done.get("peak_bytes"), "")
    else:
        ours = run_ours()
    titan, why = run_titan("937m", steps=40, compile=True, timeout=600)
    return titan_figures(ours, titan, why)


def titan_rows(done: list[Any]) -> list[Any]:
    """gpu_check's rows: torchtitan beside its speed row's bf16 + compile among `done`
    (the rows so far), which runs here when that row did not run or failed."""
    from bench.gpu_check import BIG, COMPILED, Row, peak_bytes, tokens_per_s, trainer

    speed = next((r.data for r in done if r.what == OURS and r.ok), None)

    def ours() -> tuple[float | None, int | None, str]:
        code, events, tail = trainer({**BIG, **COMPILED}, timeout=600)
        return tokens_per_s(events), peak_bytes(events), f"failed (exit {code}): {tail[-300:]}"

    return [Row(*figures) for figures in gpu_figures(speed, ours)]


def cpu_row() -> Any:
    """gpu_check's row for a CPU: torchtitan's trainer, 4 steps of the tiny shape."""
    titan, why = run_titan("tiny", steps=4, compile=False, timeout=300)
    from bench.gpu_check import Row

    what = f"torchtitan {TITAN_VERSION}'s trainer on the CPU (tiny shape, SDPA, 4 steps)"
    if not titan:
        return Row(what, why, False)
    stood_in = ", ".join(titan["stood_in"]) or "none"
    said = f"{titan['tokens_per_s']:,.0f} tokens/s; modules stood in for: {stood_in}"
    return Row(what, said, True, {"run": titan})
