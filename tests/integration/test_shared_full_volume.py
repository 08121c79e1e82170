"""A full shared checkpoint volume never idles the job (issue 51).

Two nodes on one etcd share a small tmpfs as ``checkpoint.dir``. Once the job has saved a
checkpoint the volume is filled, and both nodes are restarted as a reboot would (SIGKILL:
the kernel takes their ranks and standbys with them). Each restarted node's health check
then fails ``checkpoint_dir`` (less room than the next save needs), and so does the
other's: a fault they share, so no healthy node could take either seat. Both claim
anyway (``shared_fault_claim``), load the newest checkpoint, train to the end with every
save refused (``checkpoint_failed``) and exit 0; while they train, each exports what
``PhalanxTrainingOnSharedFault`` alerts on (``phalanx_node_healthy{check=
"checkpoint_dir"}`` 0 with a seat held; the rule's own test is in
ops/prometheus/alerts_test.yml). Before, both waited for ever.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from tests.support.harness import Daemon, run_dir, start_daemon, wait_for
from tests.support.volumes import fill, tmpfs
from trainer.checkpoint.files import candidates

pytestmark = pytest.mark.integration

STEPS = 90


def alert_inputs(d: Daemon) -> tuple[float, float] | None:
    """(phalanx_node_healthy{check="checkpoint_dir"}, phalanx_replica_group) from /metrics."""
    try:
        code, text = d.get("/metrics")
    except OSError:
        return None
    healthy = re.search(
        r'^phalanx_node_healthy\{[^}]*check="checkpoint_dir"[^}]*\} (\S+)$', text, re.M
    )
    group = re.search(r"^phalanx_replica_group\{[^}]*\} (\S+)$", text, re.M)
    if code != 200 or healthy is None or group is None:
        return None
    return float(healthy.group(1)), float(group.group(1))


def seated_failing(d: Daemon) -> bool:
    """What the alert's rule reads (the check failing while the node holds a seat), and
    /status saying the fault is shared."""
    inputs = alert_inputs(d)
    seated = inputs is not None and inputs[0] == 0.0 and inputs[1] >= 0
    return seated and bool((d.status() or {}).get("shared_fault"))


def test_two_nodes_restarted_on_one_full_shared_volume_both_train_to_the_end(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    ckpt = tmp_path / "ckpt"
    job = [
        f'checkpoint.dir="{ckpt}"',
        "checkpoint.interval_steps=20",
        f"train.steps={STEPS}",
        "health.min_free_gb=0.001",  # the 8 MB volume has room for a first checkpoint
        "health.interval_s=0.5",
    ]
    with tmpfs(ckpt, "8m"):
        first = [
            start_daemon(tmp_path / "boot1", n, [etcd_endpoint], overrides=job)
            for n in ("node-a", "node-b")
        ]
        try:
            saved = wait_for(
                lambda: [e for d in first for e in d.events("checkpoint_saved")],
                180,
                "a first checkpoint",
            )
            fill(ckpt, leave=int(saved[0]["bytes"]) // 2)
        finally:
            for d in first:  # a reboot: the kernel takes the ranks and standbys too
                d.proc.popen.kill()
                d.proc.popen.wait(30)
        newest = max(c.step for c in candidates(run_dir(ckpt)) if c.marked)

        again = [
            start_daemon(tmp_path / "boot2", n, [etcd_endpoint], overrides=job)
            for n in ("node-a", "node-b")
        ]
        try:
            for d in again:
                wait_for(
                    functools.partial(seated_failing, d),
                    180,
                    f"{d.node_id} to hold a seat while its checkpoint_dir check fails",
                )
            codes = [d.wait(300) for d in again]
        finally:
            for d in again:
                d.stop()
        after = max(c.step for c in candidates(run_dir(ckpt)) if c.marked)

    assert codes == [0, 0], [d.proc.tail() for d in again]
    for d in again:
        claims = d.events("shared_fault_claim")
        assert claims and "checkpoint_dir" in claims[0]["failing"], d.proc.tail()
        steps = [int(e["step"]) for e in d.events("train_step")]
        assert steps and max(steps) == STEPS, d.proc.tail()
        assert not d.events("group_restarted"), d.proc.tail()
    loaded = [int(e["step"]) for d in again for e in d.events("checkpoint_loaded")]
    assert loaded and set(loaded) == {newest}, loaded  # resumed, did not start over
    failed = [e for d in again for e in d.events("checkpoint_failed")]
    assert failed and all("no space left on" in e["error"] for e in failed), failed
    assert after == newest  # nothing saved since
