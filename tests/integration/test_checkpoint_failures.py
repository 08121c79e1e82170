"""A checkpoint volume that refuses writes never stops training.

The checkpoint directory is a tmpfs remounted read-only (root ignores file modes,
so a chmod would not do) under a real daemon and its ranks: every due save fails
with a ``checkpoint_failed`` event and ``phalanx_checkpoint_failures_total`` grows
(the metric ``PhalanxCheckpointFailing`` alerts on, tested with ``promtool test
rules`` in test_observability.py) while training goes on; once the volume is
writable again the next interval saves a valid checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.harness import Daemon, start_daemon, wait_for
from trainer.checkpoint.files import MARKER, Candidate, problem

pytestmark = pytest.mark.integration


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@contextmanager
def tmpfs(path: Path) -> Iterator[Callable[[bool], None]]:
    """A tmpfs at `path`; the yielded function makes it writable (True) or read-only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    path.mkdir()
    made = _mount("-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path))
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")

    def writable(yes: bool) -> None:
        done = _mount("-o", f"remount,{'rw' if yes else 'ro'}", str(path))
        assert done.returncode == 0, done.stderr

    try:
        yield writable
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def failures_total(d: Daemon) -> float:
    code, text = d.get("/metrics")
    assert code == 200
    found = re.findall(r"^phalanx_checkpoint_failures_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def test_a_read_only_checkpoint_volume_fails_saves_but_not_training(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with tmpfs(ckpt) as writable:
        writable(False)
        overrides = [
            f'checkpoint.dir="{ckpt}"',
            "checkpoint.interval_steps=5",
            "train.steps=100000",
        ]
        d = start_daemon(tmp_path, "ro", None, overrides=overrides)
        try:
            failed = wait_for(
                lambda: len(d.events("checkpoint_failed")) >= 2 and d.events("checkpoint_failed"),
                120,
                "two failed saves",
            )
            assert all("Read-only file system" in e["error"] for e in failed), failed
            last_failure = max(int(e["step"]) for e in failed)
            wait_for(lambda: d.step() > last_failure + 5, 60, "training to go on")
            assert not d.events("checkpoint_saved") and not d.events("group_restarted")
            assert failures_total(d) >= 2
            writable(True)
            saved = wait_for(lambda: d.events("checkpoint_saved"), 60, "a save once writable")
        finally:
            d.stop()
        step = int(saved[0]["step"])
        assert step % 5 == 0 and step > last_failure
        path = Path(saved[0]["path"])
        assert path.parent.parent.parent == ckpt and path.name == f"step-{step}"
        model_hash = json.loads((path / MARKER).read_text())["model_hash"]
        assert problem(Candidate(step, path), model_hash) is None
