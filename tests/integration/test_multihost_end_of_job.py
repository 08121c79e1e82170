"""The partition rule at the end of a job: a fenced host back after the others finished.

Three hosts (network namespaces) and etcd on a fourth. A few dozen steps before the
end, the leader's host is cut from etcd: it fences (its lighthouse stopped, its ranks
paused), the other two elect a leader, train to the end, save the final checkpoint,
mark the job completed and leave. Only then does etcd come back to the old leader:
nobody is registered any more, so the records of who is left say nothing, but the
job's recorded state does. The returning host must not train or save (once its
minority trained the last steps alone and its checkpoint replaced the majority's);
the job's final checkpoint is the majority's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import Daemon, event_time, hurry, run_dir, start_daemon, wait_for
from tests.support.job_queries import digest
from tests.support.multihost import NEEDS_NAMESPACES, etcd_on, wait_all_commit_together
from tests.support.netns import Host, Network
from trainer.checkpoint.files import MARKER

pytestmark = [pytest.mark.integration, NEEDS_NAMESPACES]

# The first 110 steps only bring the job to its steady pace before the cut. The cut
# must not come before the save of step 100 (interval 100) has landed: the test asserts
# that the cut-off host saves nothing after the cut.
STEPS = 360
# Steps left at the cut (about 0.075 s each here): the leader fences about 3 s after it,
# the other two give up on its paused ranks after ft.timeout_s (8 s) and go on with a
# new leader and writer; they must still have steps to train then.
CUT_BEFORE_END = 250


def test_a_host_fenced_near_the_end_neither_trains_nor_saves_after_the_job_completed(
    tmp_path: Path, network: Network, recovery: Callable[[str, float], None]
) -> None:
    ckpt = tmp_path / "ckpt"
    job = [
        "job.max_replicas=3",
        "ft.timeout_s=8",
        "ft.quorum_timeout_s=30",
        f"train.steps={STEPS}",
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=100",
    ]
    etcd_host = network.add_host("etcd")
    etcd = etcd_on(etcd_host, tmp_path)
    endpoint = f"{etcd_host.address}:2379"
    daemons: list[tuple[Host, Daemon]] = []
    try:
        for name in ("a", "b", "c"):
            h = network.add_host(name)
            daemons.append(
                (h, start_daemon(tmp_path, f"node-{name}", [endpoint], overrides=job, host=h))
            )
        wait_all_commit_together([d for _, d in daemons])
        host, leader = next((h, d) for h, d in daemons if d.require_status()["leader"])
        rest = [d for _, d in daemons if d is not leader]
        wait_for(lambda: leader.step() >= STEPS - CUT_BEFORE_END, 120, "the last steps")
        # And the save of step 100 landed: ten steps (0.75 s) were once too few for it.
        wait_for(
            lambda: any(e["step"] == 100 for _, d in daemons for e in d.events("checkpoint_saved")),
            60,
            "the checkpoint of step 100 before the cut",
        )
        cut_at = time.time()
        network.cut(host, etcd_host)
        try:
            fenced = wait_for(lambda: leader.events("fenced"), 30, "the leader's host to fence")
            paused_at = event_time(fenced[0])
            # Once the other two commit together without it, the rest of their steps run
            # at full speed.
            wait_for(
                lambda: all(
                    any(
                        e.get("participants") == 2 and event_time(e) > paused_at
                        for e in d.events("train_step")
                    )
                    for d in rest
                ),
                120,
                "the other two to go on without the fenced host",
            )
            hurry(*rest)
            for d in rest:
                assert d.wait(240) == 0, d.proc.tail()
            assert not leader.events("train_done"), "the job ended before the fence: cut earlier"
        finally:
            network.heal(host, etcd_host)
        back_at = time.time()
        assert leader.wait(120) == 0, leader.proc.tail()
        recovery("end of job: the fenced host exited after etcd was back", time.time() - back_at)
    finally:
        for _, d in daemons:
            d.stop()
        etcd.stop()

    discarded = leader.events("fence_discarding")
    assert discarded and "completed" in str(discarded[0]["reason"]), leader.proc.tail()
    # Nothing committed or saved by the returning host after its pause (a step whose vote
    # was done when SIGSTOP came may still land within a second of it).
    late = [e["step"] for e in leader.events("train_step") if event_time(e) > paused_at + 1.0]
    assert not late, late
    assert not [e for e in leader.events("checkpoint_saved") if event_time(e) > cut_at]
    # The final checkpoint is the majority's: saved by one of them, never rewritten since.
    final = run_dir(ckpt) / f"step-{STEPS}"
    saves = [e for d in rest for e in d.events("checkpoint_saved") if e["step"] == STEPS]
    assert len(saves) == 1 and Path(str(saves[0]["path"])) == final, saves
    assert json.loads((final / MARKER).read_text())["time"] < back_at
    digests = {digest(d) for d in rest}
    assert len(digests) == 1, digests
