"""The shipped example workloads run as shipped, in every layout they support, and agree
with a single process: the Hugging Face causal LM (examples/workloads/hf_causal_lm) and
the regression MLP that is not a language model (examples/workloads/regression)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import ROOT, Event
from tests.support.rank_groups import launch_group

pytestmark = pytest.mark.integration

WORKLOADS = ROOT / "examples" / "workloads"


def run(config: Path, tmp_path: Path, name: str, nproc: int, layout: list[str]) -> list[Event]:
    overrides = [
        "train.steps=10",
        "train.log_every=1",
        "train.log_init_digest=true",
        "train.eval_every=5",
        *layout,
    ]
    group = launch_group(config, tmp_path, nproc=nproc, overrides=overrides, name=name)
    assert group.wait(300) == [0] * nproc, group.rank0.tail()
    return group.events()


def losses(events: list[Event]) -> list[float]:
    return [float(e["loss"]) for e in events if e["event"] == "train_step"]


def evals(events: list[Event]) -> dict[int, float]:
    return {int(e["step"]): float(e["loss"]) for e in events if e["event"] == "eval"}


def init_digest(events: list[Event]) -> str:
    return str(next(e["init_sha256"] for e in events if e["event"] == "rank_started"))


def assert_agree(got: list[Event], want: list[Event]) -> None:
    """Same initial parameters; the first 10 losses and the evaluations at steps 5 and 10
    within 1e-4 relative (fp32)."""
    assert init_digest(got) == init_digest(want)
    assert evals(got).keys() == evals(want).keys() == {5, 10}
    for step, value in evals(want).items():
        assert abs(evals(got)[step] - value) <= 1e-4 * abs(value), ("eval", step)
    a, b = losses(got), losses(want)
    assert len(a) == len(b) == 10
    for step, (x, y) in enumerate(zip(a, b, strict=True), start=1):
        assert abs(x - y) <= 1e-4 * abs(y), f"step {step}: {x} vs single-process {y}"


def test_the_hugging_face_model_agrees_across_single_fsdp_pipeline_and_context_parallel(
    tmp_path: Path,
) -> None:
    job = WORKLOADS / "hf_causal_lm" / "job.toml"
    alone = run(job, tmp_path, "single", 1, [])
    assert next(e for e in alone if e["event"] == "rank_started")["workload"] == "hf_workload:spec"
    assert_agree(run(job, tmp_path, "fsdp", 2, ["parallel.dp_shard=2"]), alone)
    pipeline = ["parallel.pp=2", "parallel.pp_microbatches=2"]
    assert_agree(run(job, tmp_path, "pp", 2, pipeline), alone)
    # Context parallel (tests/integration/test_context_parallel.py has the built-in
    # model's): each rank rotates its own positions (the `positions` buffer); with FSDP
    # over dp_shard x cp and activation checkpointing recomputing the gathered attention.
    cp = run(job, tmp_path, "cp", 2, ["parallel.cp=2"])
    assert next(e for e in cp if e["event"] == "rank_started")["layout"]["cp"] == 2
    assert_agree(cp, alone)
    both = ["parallel.cp=2", "parallel.dp_shard=2", "parallel.activation_checkpointing=full"]
    assert_agree(run(job, tmp_path, "cp-fsdp", 4, both), alone)


def test_a_model_that_is_not_a_language_model_trains_in_every_layout(tmp_path: Path) -> None:
    job = WORKLOADS / "regression" / "job.toml"
    alone = run(job, tmp_path, "single", 1, [])
    assert_agree(run(job, tmp_path, "tp", 2, ["parallel.tp=2"]), alone)
    assert_agree(run(job, tmp_path, "fsdp", 2, ["parallel.dp_shard=2"]), alone)
    assert_agree(
        run(job, tmp_path, "pp", 2, ["parallel.pp=2", "parallel.pp_microbatches=2"]), alone
    )
