"""Replica divergence is caught and healed: the groups compare parameter digests every
``ft.digest_every`` steps, and a group whose parameters drifted is restarted and healed.

Three daemons train one job. The ranks of one group add 1e-3 to a parameter right
after step 23 commits (``PHALANX_CHAOS=optimizer@23:perturb``): nothing else would
notice, because the averaged gradients keep all groups moving alike. The comparison
at step 30 finds it; that group (a minority of one) restarts and heals from the others.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import start_daemon

pytestmark = pytest.mark.integration


def test_a_perturbed_group_is_found_within_digest_every_steps_and_healed(
    tmp_path: Path, etcd_endpoint: str
) -> None:
    job = [
        "train.steps=150",  # the others still train when the restarted group comes back
        "job.max_replicas=3",
        "job.min_replicas=2",  # the majority goes on while the minority restarts
        "ft.digest_every=10",
    ]
    daemons = [
        start_daemon(tmp_path, n, [etcd_endpoint], overrides=job) for n in ("node-a", "node-b")
    ]
    daemons.append(
        start_daemon(
            tmp_path,
            "node-c",
            [etcd_endpoint],
            overrides=job,
            env={"PHALANX_CHAOS": "optimizer@23:perturb"},
        )
    )
    try:
        for d in daemons:
            assert d.wait(240) == 0, d.proc.tail()
    finally:
        for d in daemons:
            d.stop()
    a, b, c = daemons
    found = c.events("replicas_diverged")
    assert found and found[0]["group"].startswith("minority"), found
    assert 23 < int(found[0]["step"]) <= 33  # within digest_every steps of the perturbation
    assert len(found) == 1
    failed = c.events("rank_failed")
    assert failed and "ReplicasDiverged" in failed[0]["error"], failed
    assert c.events("group_restarted") and c.events("heal_done")
    step = int(found[0]["step"])
    assert [int(e["step"]) for e in c.events("heal_done")][-1] > step  # healed after it
    for d in (a, b):  # the majority saw it, went on, and was never restarted or healed
        assert [e["group"] for e in d.events("replicas_diverged")] == ["majority"]
        assert not d.events("group_restarted")
        # (a group that joined after the others' first steps healed once, at its start)
        assert all(int(e["step"]) < step for e in d.events("heal_done"))
    assert len({d.events("train_done")[0]["params_sha256"] for d in daemons}) == 1
