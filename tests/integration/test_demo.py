"""`phalanx demo` (what `make demo` runs) completes and ends with its summary."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.harness import BIN, ROOT

pytestmark = pytest.mark.integration


def test_demo_injects_a_failure_heals_and_summarises(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "phalanx"), "demo", "--steps", "150", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    took = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert took < 300
    summary = out[out.index("Phalanx demo summary") :]
    assert re.search(r"steps\s+node-a 150 / node-b 150 of 150", summary)
    assert re.search(r"failures injected\s+1 \(SIGKILL of node-b's ranks", summary)
    assert re.search(r"restarts\s+[1-9]", summary)
    assert re.search(r"time to heal\s+[0-9.]+s", summary)
    assert re.search(r"final loss\s+[0-9.]+ \(corpus entropy", summary)
    digests = re.findall(r"params_sha256\s+node-[ab] ([0-9a-f]{64})", summary)
    assert len(digests) == 2 and digests[0] == digests[1]
    assert "digests match      yes" in summary and "result             OK" in summary
    # Progress was visible while it ran: a line about every 20 steps (the exact steps
    # depend on when the second node joins, so count them rather than name them).
    progress = re.findall(r"^  step +(\d+)/150  loss ", out, flags=re.MULTILINE)
    assert len(progress) >= 4 and int(progress[-1]) >= 140, progress
