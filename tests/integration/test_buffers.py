"""Buffers (BatchNorm's running statistics) are equal in every replica group: reconciled at
each commit, healed with the parameters, digested and compared.

The workload is examples/workloads/batchnorm (an MLP with two BatchNorm1d layers).
Each group trains on other items, so without reconciliation each group's running
statistics, and so its evaluation loss, would differ while its parameters agree.
Groups are rank processes launched as the daemon launches them, with a real torchft
lighthouse; a rank dies by a real SIGKILL (PHALANX_CHAOS makes it kill itself at a
chosen moment of a step).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.harness import ROOT, Event, wait_for
from tests.support.rank_groups import Group, cleanup, launch_group, start_lighthouse

pytestmark = pytest.mark.integration

JOB = ROOT / "examples" / "workloads" / "batchnorm" / "job.toml"
KILLED = -signal.SIGKILL


def _evals(group: Group) -> dict[int, float]:
    return {int(e["step"]): float(e["loss"]) for e in group.events("eval")}


def _done(group: Group) -> Event:
    return group.events("train_done")[0]


def test_buffers_stay_equal_across_groups_through_a_kill_and_a_heal(tmp_path: Path) -> None:
    """Three groups; group 2's rank SIGKILLs itself in the gradient exchange of step 12 (the
    others' step fails and their buffers go back to step 11's). min_replicas = 3 makes the
    others wait for its replacement, which heals from them. Every evaluation (every 4
    steps) gives the same loss in every group that ran it, bitwise, and the digests of
    parameters and buffers agree at the end."""
    steps = 40
    lighthouse = start_lighthouse(tmp_path, min_replicas=3)  # as the daemon starts it
    overrides = [
        f"train.steps={steps}",
        "train.eval_every=4",
        "train.log_every=1",
        "ft.quorum_timeout_s=120",  # the others wait for the replacement's start
    ]
    common = dict(num_groups=3, lighthouse=lighthouse.address, overrides=overrides)
    env = {"PHALANX_MIN_REPLICAS": "3"}
    groups = [launch_group(JOB, tmp_path, group=g, env=env, **common) for g in (0, 1)]  # type: ignore[arg-type]
    victim = launch_group(
        JOB, tmp_path, group=2, name="g2-victim",
        env={**env, "PHALANX_CHAOS": "allreduce@12"}, **common,  # type: ignore[arg-type]
    )  # fmt: skip
    with cleanup(lighthouse, *groups, victim):
        assert victim.wait(120) == [KILLED], victim.rank0.tail()
        replacement = launch_group(JOB, tmp_path, group=2, name="g2-final", env=env, **common)  # type: ignore[arg-type]
        with cleanup(replacement):
            for g in [*groups, replacement]:
                assert g.wait(180) == [0], g.rank0.tail()

    assert replacement.events("heal_done"), replacement.rank0.tail()
    everyone = [*groups, victim, replacement]
    evaluated: dict[int, dict[str, float]] = {}
    for name, g in zip(["g0", "g1", "g2-victim", "g2-final"], everyone, strict=True):
        for step, loss in _evals(g).items():
            evaluated.setdefault(step, {})[name] = loss
    assert sorted(evaluated) == list(range(4, steps + 1, 4))
    for step, losses in sorted(evaluated.items()):
        assert len(set(losses.values())) == 1, (step, losses)
    # The victim evaluated before its death, the replacement after its heal.
    assert {"g2-victim", "g2-final"} <= {n for losses in evaluated.values() for n in losses}
    # The statistics moved: evaluation losses are not all the same.
    assert len({next(iter(v.values())) for v in evaluated.values()}) > 1
    final = [_done(g) for g in [*groups, replacement]]
    assert len({d["params_sha256"] for d in final}) == 1
    assert len({d["buffers_sha256"] for d in final}) == 1
    print("eval losses per group:", {s: evaluated[s] for s in sorted(evaluated)})


def test_a_perturbed_buffer_is_found_by_the_divergence_check(tmp_path: Path) -> None:
    """Group 1's rank adds 1e-3 to a BatchNorm running mean right after step 7 commits
    (PHALANX_CHAOS=buffers@7:perturb); its parameters are untouched. The comparison at
    step 10 (ft.digest_every = 5) finds it: the writer group 0 wins the tie and goes
    on, group 1 stops with ReplicasDiverged (its daemon would restart it to heal; the
    writer, with min_replicas = 2, then waits for it and is stopped here)."""
    lighthouse = start_lighthouse(tmp_path, min_replicas=2)
    common = dict(
        num_groups=2,
        lighthouse=lighthouse.address,
        overrides=["train.steps=30", "ft.digest_every=5"],
    )
    env = {"PHALANX_MIN_REPLICAS": "2"}  # both take part from step 1
    writer = launch_group(JOB, tmp_path, group=0, env=env, **common)  # type: ignore[arg-type]
    chaos = {**env, "PHALANX_CHAOS": "buffers@7:perturb"}
    other = launch_group(JOB, tmp_path, group=1, env=chaos, **common)  # type: ignore[arg-type]
    with cleanup(lighthouse, writer, other):
        assert other.wait(120) != [0], other.rank0.tail()
        failed = other.events("rank_failed")
        assert failed and "ReplicasDiverged" in failed[0]["error"], other.rank0.tail()
        seen = other.events("replicas_diverged")
        assert [e["group"] for e in seen] == ["minority: restarting to heal"]
        assert int(seen[0]["step"]) == 10
        seen = wait_for(lambda: writer.events("replicas_diverged"), 60, "the writer's verdict")
        assert [e["group"] for e in seen] == ["majority"] and int(seen[0]["step"]) == 10
        assert writer.rank0.popen.poll() is None, writer.rank0.tail()  # it was not stopped


def test_a_resume_from_disk_continues_with_the_saved_buffers(tmp_path: Path) -> None:
    """One group saves at steps 10 and 20; another run resumes from step 10 and ends on
    the same parameters and buffers as the uninterrupted run (with the buffers at their
    initial values instead, the evaluations and digests would differ)."""
    saved = tmp_path / "saved"
    whole = launch_group(
        JOB, tmp_path, name="whole",
        overrides=["train.steps=20", f'checkpoint.dir="{saved}"', "checkpoint.interval_steps=10",
                   "checkpoint.async_save=false"],
    )  # fmt: skip
    assert whole.wait(120) == [0], whole.rank0.tail()
    step10 = next(saved.glob("*/run-*/step-10"))
    resumed = launch_group(
        JOB, tmp_path, name="resumed",
        overrides=["train.steps=20", f'checkpoint.dir="{tmp_path / "other"}"',
                   f'checkpoint.resume_from="{step10}"'],
    )  # fmt: skip
    assert resumed.wait(120) == [0], resumed.rank0.tail()
    loaded = resumed.events("checkpoint_loaded")
    assert [(e["step"], e["buffers"]) for e in loaded] == [(10, True)]
    assert _evals(resumed) == {s: v for s, v in _evals(whole).items() if s > 10}
    a, b = _done(whole), _done(resumed)
    assert (a["params_sha256"], a["buffers_sha256"]) == (b["params_sha256"], b["buffers_sha256"])
