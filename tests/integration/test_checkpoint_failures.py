"""A checkpoint volume that refuses writes or runs out of space never stops training.

The checkpoint directory is a tmpfs remounted read-only (root ignores file modes,
so a chmod would not do) under a real daemon and its ranks, once the node has claimed
its seat (before that, its health check keeps it out: test_node_health.py): every due
save fails
with a ``checkpoint_failed`` event and ``phalanx_checkpoint_failures_total`` grows
(the metric ``PhalanxCheckpointFailing`` alerts on, tested with ``promtool test
rules`` in test_observability.py) while training goes on; once the volume is
writable again the next interval saves a valid checkpoint.

A small tmpfs filled mid-run: the job trains every step and exits 0, each later
save is refused before it starts with the free and needed space in words, and a
restart loads the newest complete checkpoint. A save that runs out of space half-way
(DCP's ``CheckpointException``, a ``BaseException``) is reported the same way and its
partial files are removed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import structlog

from tests.support.checkpointers import linear_checkpointer
from tests.support.harness import Daemon, run_dir, start_daemon, wait_for
from tests.support.volumes import fill, tmpfs
from trainer.checkpoint.files import MARKER, Candidate, candidates, problem

pytestmark = pytest.mark.integration


def failures_total(d: Daemon) -> float:
    code, text = d.get("/metrics")
    assert code == 200
    found = re.findall(r"^phalanx_checkpoint_failures_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


def test_a_read_only_checkpoint_volume_fails_saves_but_not_training(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with tmpfs(ckpt) as writable:
        overrides = [
            f'checkpoint.dir="{ckpt}"',
            "checkpoint.interval_steps=5",
            "train.steps=100000",
            "health.interval_s=3600",  # checked once, writable, before the claim
            "health.min_free_gb=0.001",  # the 256 MB volume has room for a first checkpoint
        ]
        d = start_daemon(tmp_path, "ro", None, overrides=overrides)
        try:
            wait_for(lambda: d.events("slot_claimed"), 60, "the claim")
            writable(False)  # before the ranks' first save (their start takes longer)
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


def test_a_volume_filled_mid_run_fails_saves_not_training_and_a_restart_loads(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    job = [
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=20",
        "train.steps=100",
        "health.min_free_gb=0.001",  # the 8 MB volume has room for a first checkpoint
    ]
    with tmpfs(ckpt, "8m"):
        d = start_daemon(tmp_path, "full", None, overrides=job)
        try:
            saved = wait_for(lambda: d.events("checkpoint_saved"), 120, "a first checkpoint")
            filler = fill(ckpt, leave=int(saved[0]["bytes"]) // 2)
            assert d.wait(240) == 0, d.proc.tail()
        finally:
            d.stop()
        steps = sorted({int(e["step"]) for e in d.events("train_step")})
        assert steps[-1] == 100 and not d.events("group_restarted"), d.proc.tail()
        failed = d.events("checkpoint_failed")
        assert failed and all("no space left on" in e["error"] for e in failed), failed
        assert all("MB free, a checkpoint needs ~" in e["error"] for e in failed), failed
        complete = [c for c in candidates(run_dir(ckpt)) if c.marked]
        assert complete and all(c.step <= 100 for c in complete)
        # Nothing half-written is left behind: every step directory is a complete save.
        assert all(c.marked for c in candidates(run_dir(ckpt)))

        filler.unlink()  # a node claims no seat on a volume without room for the next save
        again = start_daemon(tmp_path / "again", "full", None, overrides=job)
        try:
            loaded = wait_for(lambda: again.events("checkpoint_loaded"), 120, "a resume")
        finally:
            again.stop()
        assert int(loaded[0]["step"]) == complete[0].step


def test_a_save_that_runs_out_of_space_mid_write_is_reported_and_removed(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "small"
    with tmpfs(volume, "256k"):
        saver, _ = linear_checkpointer(volume)  # 771 KB to write
        saver.needed = 1  # as if checkpoints were tiny: the room check lets the save start
        with structlog.testing.capture_logs() as events:
            saver.save(1)
            saver.close()
        failed = [e for e in events if e["event"] == "checkpoint_failed"]
        assert len(failed) == 1, events
        assert failed[0]["error"].startswith(f"no space left on {volume}"), failed
        assert not (volume / "step-1").exists()
        assert saver.last_saved is None
