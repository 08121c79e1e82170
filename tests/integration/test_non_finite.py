"""A non-finite step is never committed, on any group; too many in a row stop the job.

Two daemons train one job. One group's gradients are poisoned with NaN once
(``PHALANX_CHAOS=gradients@+N:nan``). The cross-group average carries the NaN to
every group, so every group votes the step down in ``should_commit``; the step is
retried with the same data and training ends with equal parameters everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import start_daemon

pytestmark = pytest.mark.integration


def test_a_nan_in_one_groups_gradients_is_skipped_on_every_group(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    # min_replicas 2: both groups take part in every step, the poisoned one included.
    job = ["train.steps=60", "job.min_replicas=2"]
    a = start_daemon(tmp_path, "node-a", [etcd_endpoint], overrides=job)
    b = start_daemon(
        tmp_path,
        "node-b",
        [etcd_endpoint],
        overrides=job,
        env={"PHALANX_CHAOS": "gradients@+30:nan"},
    )
    try:
        for d in (a, b):
            assert d.wait(240) == 0, d.proc.tail()
    finally:
        for d in (a, b):
            d.stop()
    voted_down = {d.node_id: [int(e["step"]) for e in d.events("step_not_finite")] for d in (a, b)}
    assert len(voted_down["node-b"]) == 1 and voted_down["node-a"] == voted_down["node-b"], (
        voted_down
    )
    (step,) = voted_down["node-a"]
    assert b.events("step_not_finite")[0]["grad_norm"] == "nan"
    for d in (a, b):
        committed = [int(e["step"]) for e in d.events("train_step")]
        assert committed == list(range(1, 61)), committed  # each step once, none lost
        assert not d.events("group_restarted") and not d.events("heal_done")
        assert step in committed  # the step was retried and committed
    assert a.events("train_done")[0]["params_sha256"] == b.events("train_done")[0]["params_sha256"]


def test_a_run_that_stays_non_finite_stops_with_a_clear_error(tmp_path: Path) -> None:
    """Every attempt from the 5th on is poisoned: after train.max_skipped_steps in a row the
    ranks stop, naming the setting, and the daemon gives up rather than commit NaNs."""
    chaos = ",".join(f"gradients@+{n}:nan" for n in range(5, 40))
    overrides = [
        "train.steps=100",
        "train.max_skipped_steps=3",
        "node.max_restarts=1",
    ]
    d = start_daemon(tmp_path, "nan", None, overrides=overrides, env={"PHALANX_CHAOS": chaos})
    try:
        assert d.wait(120) == 1, d.proc.tail()
    finally:
        d.stop()
    failed = d.events("rank_failed")
    assert failed and "train.max_skipped_steps = 3" in failed[0]["error"], failed
    assert [e["in_a_row"] for e in d.events("step_not_finite")][:3] == [1, 2, 3]
    assert max(int(e["step"]) for e in d.events("train_step")) == 5
