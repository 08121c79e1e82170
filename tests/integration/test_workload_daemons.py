"""A user's workload from outside the repository's packages, under two `phalanx run` daemons.

The regression MLP of examples/workloads/regression (not a language model) is reached
through workload.python_path. Real etcd, lighthouse, ranks and SIGKILLs: one group is
killed and heals from the other; then both are killed and a cold restart resumes from
a checkpoint. Throughout, the evaluation loss is the same in both groups at each
evaluation step and is exported as phalanx_eval_loss.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from tests.support.harness import (
    ROOT,
    Daemon,
    Event,
    hurry,
    read_events,
    run_dir,
    start_daemon,
    wait_for,
)
from tests.support.pair_runs import kill_pair_after_checkpoint, run_pair_again, run_to_end

pytestmark = pytest.mark.integration

REGRESSION = ROOT / "examples" / "workloads" / "regression"


def workload_job(ckpt: Path, *extra: str) -> list[str]:
    return [
        'workload.spec="regression_workload:spec"',
        f'workload.python_path=["{REGRESSION}"]',
        "workload.options.depth=2",
        "workload.options.width=32",
        "train.batch_size=16",
        "train.eval_every=10",
        "train.eval_batches=2",
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=20",
        *extra,
    ]


def evals(events: list[Event]) -> dict[int, float]:
    return {int(e["step"]): float(e["loss"]) for e in events if e["event"] == "eval"}


def losses(events: list[Event]) -> dict[int, float]:
    return {
        int(e["step"]): float(e["loss"])
        for e in events
        if e["event"] == "train_step" and e["loss"] is not None
    }


def exported_eval_loss(d: Daemon) -> float | None:
    code, text = d.get("/metrics")
    found = re.search(r"^phalanx_eval_loss\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if code == 200 and found else None


def test_an_out_of_tree_workload_heals_from_its_peer_and_both_evaluate_alike(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    # A step a second until hurried: a CI run killed node-b's rank while its standby still
    # warmed at idle priority, and node-a finished the job alone in the 11 s the standby
    # then took to start; a standby may take 37 s to warm there.
    job = workload_job(tmp_path / "ckpt", "train.steps=160")
    a = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=job, pace_s=1.0)
    b = start_daemon(tmp_path, "node-b", [etcd_endpoint], overrides=job, pace_s=1.0)
    try:
        wait_for(lambda: a.step() > 10 and b.step() > 10, 120, "both groups to train")
        assert a.events("rank_started")[0]["workload"] == "regression_workload:spec"
        os.kill(b.rank_pids()[0], signal.SIGKILL)
        restarted = wait_for(lambda: b.events("group_restarted"), 60, "node-b's group to restart")
        healed = wait_for(
            lambda: [e for e in b.events("heal_done") if e["time"] > restarted[0]["time"]],
            90,
            "node-b to heal from node-a",
        )
        # The metric carries the evaluation loss of the last evaluation.
        exported = wait_for(lambda: exported_eval_loss(a), 60, "phalanx_eval_loss on node-a")
        assert exported in evals(a.events()).values()
        hurry(a, b)
        run_to_end([a, b])
    finally:
        a.stop()
        b.stop()
    done = [d.events("train_done")[0]["params_sha256"] for d in (a, b)]
    assert done[0] == done[1], "the groups ended with different parameters"
    ea, eb = evals(a.events()), evals(b.events())
    common = sorted(ea.keys() & eb.keys())
    assert all(ea[s] == eb[s] for s in common), {s: (ea[s], eb[s]) for s in common}
    healed_step = int(healed[0]["step"])
    assert [s for s in common if s > healed_step], "no evaluation after the heal to compare"
    # node-a's first evaluation: a group that joined after its peer's step 10 healed past it.
    assert common[-1] == 160 and ea[160] < ea[min(ea)], ea


def test_an_out_of_tree_workload_resumes_cold_with_the_same_losses_and_evaluation(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    ckpt = tmp_path / "ckpt"
    # Both groups start and resume together (neither trains alone), so each logged loss
    # and evaluation comes from parameters that every run reaches identically.
    job = workload_job(ckpt, "train.steps=60", "job.min_replicas=2")
    kill_pair_after_checkpoint(tmp_path, etcd_endpoint, job, ckpt, step=40)
    first = {n: read_events(tmp_path / f"{n}.err") for n in ("node-a", "node-b")}
    run = run_dir(ckpt)
    for later in run.glob("step-*"):  # resume from step 20: steps 21-40 are trained again
        if int(later.name.removeprefix("step-")) > 20:
            shutil.rmtree(later)
    second, _ = run_pair_again(tmp_path, etcd_endpoint, job)
    for d in second:
        before, again = first[d.node_id], d.events()
        assert [e["step"] for e in d.events("checkpoint_loaded")] == [20]
        assert min(losses(again)) == 21
        assert losses(again)[21] == losses(before)[21], "the resumed step's loss differs"
        assert evals(again)[30] == evals(before)[30] and evals(again)[40] == evals(before)[40]
    assert len({d.events("train_done")[0]["params_sha256"] for d in second}) == 1
