"""Context parallel (parallel.cp) on CPU: each cp rank holds a load-balanced slice of every
sequence and attends across the others through the all-gather-K/V attention. The
built-in Llama gives a single process's losses and evaluations within 1e-4 with cp = 2
and cp = 2 x dp_shard = 2 (the Hugging Face example's are checked beside its other
layouts, in test_workload_examples.py), and two `phalanx run` groups of cp = 2 heal a
killed rank and end with equal digests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.harness import (
    BIN,
    HOLD_PACE_S,
    ROOT,
    Event,
    free_port,
    hurry,
    start_daemon,
    wait_for,
)
from tests.support.rank_groups import launch_group

pytestmark = pytest.mark.integration

SINGLE = ROOT / "examples" / "single.toml"
COMMON = ["train.steps=10", "train.log_init_digest=true", "train.eval_every=5"]


def run(config: Path, tmp_path: Path, name: str, nproc: int, layout: list[str]) -> list[Event]:
    group = launch_group(config, tmp_path, nproc=nproc, overrides=[*COMMON, *layout], name=name)
    assert group.wait(300) == [0] * nproc, group.rank0.tail()
    return group.events()


def started(events: list[Event]) -> Event:
    return next(e for e in events if e["event"] == "rank_started")


def assert_agree(got: list[Event], want: list[Event], cp: int) -> None:
    """The layout really was cp ranks; same initial parameters; the 10 losses and the
    evaluations at steps 5 and 10 within 1e-4 relative."""
    assert started(got)["layout"]["cp"] == cp
    assert started(got)["init_sha256"] == started(want)["init_sha256"]
    pairs = [
        (f"{e['event']} {e['step']}", float(e["loss"]), float(w["loss"]))
        for e, w in zip(
            [e for e in got if e["event"] in ("train_step", "eval")],
            [e for e in want if e["event"] in ("train_step", "eval")],
            strict=True,
        )
    ]
    assert len(pairs) == 12
    for what, a, b in pairs:
        assert abs(a - b) <= 1e-4 * abs(b), f"{what}: {a} with cp vs {b} in one process"


def test_cp_and_cp_with_fsdp_match_a_single_process(tmp_path: Path) -> None:
    """The built-in Llama (the Hugging Face example's are in test_workload_examples.py)."""
    alone = run(SINGLE, tmp_path, "single", 1, [])
    assert_agree(run(SINGLE, tmp_path, "cp2", 2, ["parallel.cp=2"]), alone, 2)
    # FSDP shards over dp_shard x cp; activation checkpointing recomputes the attention
    # across the cp ranks in backward.
    both = ["parallel.cp=2", "parallel.dp_shard=2", "parallel.activation_checkpointing=full"]
    assert_agree(run(SINGLE, tmp_path, "cp2dp2", 4, both), alone, 2)


def test_torch_context_parallel_shards_as_the_all_gather_path_and_restores() -> None:
    """torch's context_parallel (cp_attention = "torch", the CUDA default) cannot attend on a
    CPU, but its sharding runs: each rank gets the same positions of the inputs, targets
    and per-position buffers as the all-gather path (chunks r and 2cp-1-r), and every
    buffer and SDPA itself are put back after the micro-batch."""
    argv = [
        str(BIN / "torchrun"), "--nproc-per-node=2", f"--master-port={free_port()}",
        str(Path(__file__).with_name("cp_shard_rank.py")),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = {r["rank"]: r for r in map(json.loads, proc.stdout.splitlines()) if "rank" in r}
    positions = {0: [0, 1, 2, 3, 12, 13, 14, 15], 1: [4, 5, 6, 7, 8, 9, 10, 11]}
    for rank, got in ranks.items():
        mine = positions[rank]
        assert (
            got["all_gather"]
            == got["torch"]
            == {
                "inputs": [mine, [16 + p for p in mine]],
                "targets": [[100 + p for p in mine], [116 + p for p in mine]],
                "table": [10.0 * p for p in mine],
                "sdpa_replaced": True,
            }
        )
        for path in ("all_gather", "torch"):
            assert got[f"{path} after"] == {
                "table": [10.0 * p for p in range(32)],
                "batch": [list(range(16)), list(range(16, 32))],
                "sdpa_restored": True,
            }
    assert sorted(ranks) == [0, 1]


def test_cp_groups_heal_a_killed_rank_under_phalanx_run(tmp_path: Path, etcd_endpoint: str) -> None:
    job = ["node.nproc=2", "parallel.cp=2", "train.steps=60"]  # under 40 spent at HOLD_PACE_S
    a = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=job, pace_s=HOLD_PACE_S)
    b = start_daemon(tmp_path, "node-b", [etcd_endpoint], overrides=job, pace_s=HOLD_PACE_S)
    try:
        wait_for(lambda: a.step() > 10 and b.step() > 10, 120, "both groups to train")
        assert started(a.events())["layout"]["cp"] == 2
        os.kill(b.rank_pids()[1], signal.SIGKILL)
        restarted = wait_for(lambda: b.events("group_restarted"), 60, "node-b's group to restart")
        wait_for(
            lambda: [e for e in b.events("heal_done") if e["time"] > restarted[0]["time"]],
            90,
            "node-b to heal from node-a",
        )
        hurry(a, b)
        assert a.wait(180) == 0, a.proc.tail()
        assert b.wait(60) == 0, b.proc.tail()
    finally:
        a.stop()
        b.stop()
    assert not a.events("group_restarted")
    done = [d.events("train_done")[0]["params_sha256"] for d in (a, b)]
    assert done[0] == done[1], "the groups ended with different parameters"
