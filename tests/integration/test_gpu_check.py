"""Issue 39: `make gpu-check` runs anywhere. Without CUDA (this suite's machines) it says
so in one line, skips the GPU rows, and passes its CPU-runnable checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.harness import ROOT

pytestmark = pytest.mark.integration


def test_gpu_check_on_a_cpu_says_so_and_checks_what_runs_here() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--no-write"],
        capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    out = proc.stdout
    assert out.startswith("no CUDA device here: skipping the GPU rows"), out
    assert "| parallel.fp8 on a CPU node | exit 2: error: parallel.fp8 = true needs a GPU" in out
    assert "Linear layers in float8, output layer kept |" in out
    assert "tokens/s |" in out and "FAILED" not in out
