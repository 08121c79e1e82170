"""Issue 39: `make gpu-check` runs anywhere. Its CPU rows (`--rows cpu`) pass on any
machine; without CUDA (this suite's machines) it says so in one line and skips the GPU
rows, and on a machine with a GPU it names the card (issue 53: the suite must not assume
there is none). Its CPU rows include torchtitan's own trainer at a tiny shape (issue 53:
the path the GPU's torchtitan row takes, checked before a card's minutes go to it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.support.harness import ROOT

pytestmark = pytest.mark.integration


def test_gpu_check_on_a_cpu_says_so_and_checks_what_runs_here() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--no-write", "--rows", "cpu"],
        capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    out = proc.stdout
    if torch.cuda.is_available():
        assert out.startswith(f"CUDA device: {torch.cuda.get_device_name(0)}"), out
    else:
        assert out.startswith("no CUDA device here: skipping the GPU rows"), out
    assert "| parallel.fp8 on a CPU node | exit 2: error: parallel.fp8 = true needs a GPU" in out
    assert "Linear layers in float8, output layer kept |" in out
    assert "tokens/s |" in out and "FAILED" not in out
    assert "| torchtitan 0.3.0's trainer on the CPU (tiny shape, SDPA, 4 steps) | " in out
