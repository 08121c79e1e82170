"""DCP checkpoints with real processes: corruption, resharding, no full pickle, and a
cold restart after every rank of every group died while an async save was in flight."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import (
    BIN,
    ROOT,
    Event,
    alive,
    event_time,
    free_port,
    run_dir,
    start,
    start_daemon,
    wait_for,
)
from tests.support.pair_runs import kill_pair_after_checkpoint, run_pair_again
from tests.support.rank_groups import launch_group
from trainer.checkpoint.files import MARKER, Candidate, problem

pytestmark = pytest.mark.integration

SINGLE = ROOT / "examples" / "single.toml"


def losses(events: list[Event]) -> dict[int, float]:
    """Loss by committed step (a step in which the group healed reports none)."""
    return {
        int(e["step"]): float(e["loss"])
        for e in events
        if e["event"] == "train_step" and e["loss"] is not None
    }


def run_single(tmp_path: Path, name: str, overrides: list[str]) -> list[Event]:
    group = launch_group(SINGLE, tmp_path, overrides=overrides, name=name)
    assert group.wait(180) == [0], group.rank0.tail()
    return group.events()


def run_torchrun(tmp_path: Path, name: str, nproc: int, overrides: list[str]) -> list[Event]:
    argv = [str(BIN / "torchrun"), f"--nproc-per-node={nproc}", f"--master-port={free_port()}"]
    argv += ["-m", "trainer", "--config", str(SINGLE)]
    for o in overrides:
        argv += ["--set", o]
    proc = start(argv, tmp_path, name, {"OMP_NUM_THREADS": "1"})
    assert proc.wait(300) == 0, proc.tail()
    return proc.events()


def test_corrupt_newest_checkpoint_is_skipped_and_the_previous_used(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    common = ["train.steps=40", f'checkpoint.dir="{ckpt}"', "checkpoint.interval_steps=10"]
    # Synchronous saves in the run that writes them: an async save still running when the
    # next falls due skips it (a loaded machine once skipped step 20's).
    first = run_single(tmp_path, "first", [*common, "train.steps=30", "checkpoint.async=false"])
    assert {e["step"] for e in first if e["event"] == "checkpoint_saved"} == {10, 20, 30}
    shard = run_dir(ckpt) / "step-30" / "__0_0.distcp"
    with shard.open("r+b") as f:  # truncate a shard file
        f.truncate(shard.stat().st_size // 2)
    second = run_single(tmp_path, "second", common)
    invalid = [e for e in second if e["event"] == "checkpoint_invalid"]
    assert invalid and invalid[0]["path"].endswith("step-30") and "bytes" in invalid[0]["reason"]
    loaded = [e for e in second if e["event"] == "checkpoint_loaded"]
    assert [e["step"] for e in loaded] == [20]
    # Training continued from step 20 exactly as the first run did.
    assert losses(second)[21] == losses(first)[21]


def test_a_flipped_byte_is_caught_by_its_checksum_and_never_counted_by_retention(
    tmp_path: Path,
) -> None:
    """One byte of the newest checkpoint's shard changes, its size does not: the next run
    skips it (checksum), resumes from the one before, and with keep = 1 keeps the valid
    checkpoint it writes, reporting the corrupt newer one rather than counting it."""
    ckpt = tmp_path / "ckpt"
    first = run_single(
        tmp_path,
        "first",
        # Synchronous: an async save still running when the next falls due skips it.
        ["train.steps=30", f'checkpoint.dir="{ckpt}"', "checkpoint.interval_steps=10",
         "checkpoint.async=false"],
    )  # fmt: skip
    assert {e["step"] for e in first if e["event"] == "checkpoint_saved"} == {10, 20, 30}
    run = run_dir(ckpt)
    shard = run / "step-30" / "__0_0.distcp"
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)[0]
        f.seek(size // 2)
        f.write(bytes([byte ^ 0x01]))
    assert shard.stat().st_size == size
    overrides = ["checkpoint.interval_steps=5", "checkpoint.keep=1", "train.steps=25"]
    second = run_single(tmp_path, "second", [f'checkpoint.dir="{ckpt}"', *overrides])
    invalid = [e for e in second if e["event"] == "checkpoint_invalid"]
    assert invalid[0]["path"].endswith("step-30") and "sha256" in invalid[0]["reason"], invalid
    assert [e["step"] for e in second if e["event"] == "checkpoint_loaded"] == [20]
    assert losses(second)[21] == losses(first)[21]
    # Retention kept the valid step 25 it wrote (keep = 1) and left the corrupt step 30,
    # reported, not counted.
    assert sorted(p.name for p in run.iterdir()) == ["step-25", "step-30"]
    left = [e for e in invalid if e.get("deleted") is False]
    assert [e["path"] for e in left] == [str(run / "step-30")], invalid
    model_hash = json.loads((run / "step-25" / MARKER).read_text())["model_hash"]
    assert problem(Candidate(25, run / "step-25"), model_hash) is None


def test_checkpoint_reshards_across_layouts(tmp_path: Path) -> None:
    """Saved by dp_shard=2 x tp=2; loaded by a single rank, by dp_shard=4 (FSDP alone,
    four shards of each parameter) and by dp_shard=2 x cp=2 (FSDP sharded four ways over
    dp_shard x cp, each rank attending over a slice of every sequence)."""
    ckpt = tmp_path / "ckpt"
    common = ["train.steps=20", f'checkpoint.dir="{ckpt}"', "checkpoint.interval_steps=10"]
    saved = run_torchrun(tmp_path, "fsdp_tp", 4, [*common, "parallel.dp_shard=2", "parallel.tp=2"])
    marker = json.loads((run_dir(ckpt) / "step-10" / "COMPLETE.json").read_text())
    assert marker["layout"] == {"pp": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    before = losses(saved)
    for name, nproc, layout in [
        ("single", 1, []),
        ("fsdp4", 4, ["parallel.dp_shard=4"]),
        ("fsdp2-cp2", 4, ["parallel.dp_shard=2", "parallel.cp=2"]),
    ]:
        for leftover in run_dir(ckpt).glob("step-2*"):  # make step 10 the newest again
            subprocess.run(["rm", "-rf", str(leftover)], check=True)
        events = run_torchrun(tmp_path, name, nproc, [*common, *layout])
        loaded = {e["rank"]: e["step"] for e in events if e["event"] == "checkpoint_loaded"}
        assert loaded == dict.fromkeys(range(nproc), 10), loaded  # every rank, once
        after = losses(events)
        assert min(after) == 11
        for step in range(11, 21):
            assert after[step] == pytest.approx(before[step], rel=1e-4), (name, step)


def test_no_full_pickle_is_ever_loaded(tmp_path: Path) -> None:
    """Every torch.load reached while saving, resuming and reading metadata uses weights_only=True."""
    script = tmp_path / "probe.py"
    script.write_text(
        """
import sys, torch, torch.serialization
calls = []
original = torch.serialization.load
def guarded(*args, **kwargs):
    calls.append(kwargs.get("weights_only"))
    if kwargs.get("weights_only") is not True:
        raise AssertionError(f"torch.load reached with weights_only={kwargs.get('weights_only')!r}")
    return original(*args, **kwargs)
torch.load = torch.serialization.load = guarded
from trainer.__main__ import main
for steps in (10, 20):
    code = main(["--config", sys.argv[1], "--set", f"train.steps={steps}", "--set", f'checkpoint.dir="{sys.argv[2]}"',
                 "--set", "checkpoint.interval_steps=5"])
    assert code == 0, code
print("torch.load calls:", len(calls), file=sys.stderr)
assert calls, "the resume never reached torch.load: the probe proves nothing"
"""
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(SINGLE), str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"checkpoint_loaded"' in proc.stderr
    # And no code path in the project asks for full pickle.
    offenders = [
        f"{path}:{n}"
        for path in [*ROOT.glob("trainer/*.py"), *ROOT.glob("daemon/*.py")]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"weights_only\s*=\s*False|pickle\.loads?\(", line)
    ]
    assert offenders == []


def test_cold_restart_after_every_group_died_mid_save(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    """SIGKILL every rank and daemon while the step-20 async save is in flight; new daemons
    resume from step 10 (the partial step 20 is reported and skipped) and finish."""
    ckpt = tmp_path / "ckpt"
    job = [
        "train.steps=40",
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=10",
        "checkpoint.keep=3",
        # Both groups start together and resume together (neither trains alone): no
        # group heals, so every logged loss comes from the committed parameters.
        "job.min_replicas=2",
    ]
    # The writer group's ranks SIGKILL themselves right after launching the step-20 save.
    chaos = {"PHALANX_CHAOS": "checkpoint@20:kill"}
    first = [
        start_daemon(tmp_path, n, [etcd_endpoint], overrides=job, env=chaos)
        for n in ("node-a", "node-b")
    ]
    try:
        wait_for(
            lambda: any(d.events("group_failed") for d in first), 120, "the writer to die mid-save"
        )
        ranks = [
            pid
            for d in first
            for e in d.events()
            if e["event"] in ("group_started", "group_restarted")
            for pid in e["pids"]
        ]
        for d in first:  # every daemon, and with it every rank it runs
            os.kill(d.pid, signal.SIGKILL)
        wait_for(lambda: not any(alive(p) for p in ranks), 10, "every rank to be gone")
    finally:
        for d in first:
            d.stop()
    run = run_dir(ckpt)
    assert (run / "step-10" / "COMPLETE.json").is_file()
    assert (run / "step-20").is_dir() and not (run / "step-20" / "COMPLETE.json").exists()
    before = {d.node_id: losses(d.events()) for d in first}

    # Wait for the dead daemons' leases to expire, so each node gets its old slot back.
    second, restarted_at = run_pair_again(tmp_path, etcd_endpoint, job)
    # Neither group has a live peer to heal from (min_replicas 2: they start together),
    # so both read the disk, skip the partial step 20 and resume from step 10.
    for d in second:
        invalid = d.events("checkpoint_invalid")
        assert any(
            e["path"].endswith("step-20") and "no completion marker" in e["reason"] for e in invalid
        )
        assert [e["step"] for e in d.events("checkpoint_loaded")] == [10]
        assert not d.events("heal_done")
        after = losses(d.events())
        assert min(after) == 11
        assert after[11] == before[d.node_id][11], (
            "the resumed step's loss differs from before the kill"
        )
    assert len({d.events("train_done")[0]["params_sha256"] for d in second}) == 1
    resumed = min(event_time(d.events("checkpoint_loaded")[0]) for d in second)
    recovery("every group gone: daemons started -> resumed from checkpoint", resumed - restarted_at)
    # Retention: exactly `keep` complete checkpoints, no leftover partial one.
    steps = {p.name: (p / "COMPLETE.json").exists() for p in run.iterdir()}
    assert steps == {"step-20": True, "step-30": True, "step-40": True}


def test_draining_every_node_saves_the_last_step_and_a_restart_resumes_there(
    tmp_path: Path, etcd_endpoint: str, recovery: Callable[[str, float], None]
) -> None:
    """SIGTERM every daemon at step 37 with interval_steps = 50: on its way out the writer
    group saves the last committed step, and the restarted job resumes there, not at 0.

    The signals go out in the order that is hardest for a drain: the other group first,
    the writer group once the other has left. The writer is then already waiting for its
    next step's quorum, which can never form (min_replicas 2); it leaves that step
    instead of waiting out the quorum timeout and being killed at drain_grace_s."""
    ckpt = tmp_path / "ckpt"
    # One job file for both runs (a changed one is refused while etcd remembers the job).
    job = [
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=50",
        "job.min_replicas=2",  # neither group commits alone: both stop at one step
        "train.steps=60",
    ]
    first = [
        start_daemon(tmp_path, n, [etcd_endpoint], overrides=job) for n in ("node-a", "node-b")
    ]
    try:
        wait_for(lambda: all(d.step() >= 37 for d in first), 120, "step 37")
        writer, other = sorted(first, key=lambda d: int(d.require_status()["replica_group"]))
        sent = time.monotonic()
        for d in (other, writer):
            d.proc.popen.send_signal(signal.SIGTERM)
            assert d.wait(30) == 0, d.proc.tail()
        drained_in = time.monotonic() - sent
    finally:
        for d in first:
            d.stop()
    assert drained_in < 15  # node.drain_grace_s of the test job
    recovery("SIGTERM every node: drained, last step saved", drained_in)
    last = max(int(e["step"]) for d in first for e in d.events("train_stopped"))
    assert 37 <= last < 50
    saved = [int(e["step"]) for d in first for e in d.events("checkpoint_saved")]
    assert saved == [last], saved
    assert [int(e["step"]) for e in writer.events("checkpoint_saved")] == [last]
    assert (run_dir(ckpt) / f"step-{last}" / MARKER).is_file()

    second, _ = run_pair_again(tmp_path, etcd_endpoint, job)
    for d in second:
        assert [e["step"] for e in d.events("checkpoint_loaded")] == [last]
        assert min(losses(d.events())) == last + 1
    assert len({d.events("train_done")[0]["params_sha256"] for d in second}) == 1


def test_groups_resuming_from_disk_load_one_checkpoint_though_their_views_differ(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    """Every group dies with checkpoints of steps 10 and 20 on disk. On the cold start the
    newest marker is hidden from rank 1 of the writer group and from rank 0 of the other
    (PHALANX_CHAOS resume@0:hide, as a stale view of a shared volume would): every rank of
    both groups still loads one checkpoint, the newest that both groups see (10), the
    groups find equal digests before their first commit, and they end equal."""
    ckpt = tmp_path / "ckpt"
    job = [
        "train.steps=30",
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=10",
        "job.min_replicas=2",  # both groups start together and both read the disk
        "node.nproc=2",
        "parallel.dp_shard=2",  # each rank loads its own shard: a split choice would mix steps
    ]
    writer, other = kill_pair_after_checkpoint(tmp_path, etcd_endpoint, job, ckpt, 20)
    hide = {"PHALANX_CHAOS": "resume@0:hide"}
    envs = {
        writer: {**hide, "PHALANX_CHAOS_RANKS": "1"},
        other: {**hide, "PHALANX_CHAOS_RANKS": "0"},
    }
    second, _ = run_pair_again(tmp_path, etcd_endpoint, job, envs)
    for d in second:
        loaded = {e["rank"]: e["step"] for e in d.events("checkpoint_loaded")}
        assert loaded == {0: 10, 1: 10}, (d.node_id, loaded)
        assert [e["step"] for e in d.events("checkpoint_digests_agree")] == [10]
        assert not d.events("heal_done")
        assert min(losses(d.events())) == 11
    assert len({d.events("train_done")[0]["params_sha256"] for d in second}) == 1
